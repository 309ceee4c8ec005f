"""Programs the integration tests take from Debian packages (prometheus, chromium-headless-shell).

launch/test.sh installs them before the suite when it runs as root with apt-get; a test run some
other way (plain pytest) gets the same: :func:`debian_binary` finds the program, or installs the
first package that provides it, or says why it cannot (the test then skips with that reason).
"""

from __future__ import annotations

import os
import shutil
import subprocess


def _which(binaries: tuple[str, ...]) -> str | None:
    for name in binaries:
        found = shutil.which(name) or (os.path.exists(f"/usr/bin/{name}") and f"/usr/bin/{name}") or None
        if found:
            return found
    return None


def debian_binary(binaries: tuple[str, ...], packages: tuple[str, ...]) -> tuple[str | None, str]:
    """(path, "") of the first of ``binaries`` found, installing ``packages`` in order until one
    provides it (root + apt-get, quietly, ``apt-get update`` once if the first try fails); else
    (None, why not)."""
    found = _which(binaries)
    if found:
        return found, ""
    wanted = " or ".join(packages)
    if not shutil.which("apt-get"):
        return None, f"the Debian package {wanted} is not installed and apt-get is not available"
    if os.geteuid() != 0:
        return None, f"the Debian package {wanted} is not installed and installing it needs root (apt-get install {packages[0]})"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    why, updated = "", False
    for pkg in packages:
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", pkg]
        try:
            r = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
            if r.returncode != 0 and not updated:
                updated = True
                subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=300)
                r = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            why = f"apt-get install {pkg} timed out"
            continue
        found = _which(binaries)
        if found:
            return found, ""
        why = f"apt-get install {pkg} failed: {r.stderr.strip()[-300:]}"
    return None, why
