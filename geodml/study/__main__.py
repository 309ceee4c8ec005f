"""``python -m geodml.study NAME [options] [-- geodml flags]``: run one study (see geodml.study)."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from geodml.study import STUDIES


def _terminate(signum, frame):
    """SIGTERM (a CI timeout, kill) unwinds like Ctrl-C, so the runner stops every running run."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m geodml.study", description="Run a geodml study (many runs, compared).")
    p.add_argument("name", choices=sorted(STUDIES), help="study to run; NAME --help shows its options")
    a = p.parse_args(argv[:1])
    module, func = STUDIES[a.name].split(":")
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)
    except KeyboardInterrupt:
        print("interrupted: every running run was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
