"""The CPU cores this process may run on: its affinity mask where the OS has one (Linux: ``taskset``, a
container's cpuset, a batch scheduler's binding), else every core ``os.cpu_count()`` sees (macOS, Windows).

``os.cpu_count()`` alone counts the machine's cores, so a run pinned to 2 of 16 would plan for 16. No torch
import, so the study launchers can use it too.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The number of cores this process may run on (>= 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)
