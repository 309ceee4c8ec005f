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


def session_nice() -> int | None:
    """The scheduler priority a new session started from here should keep (Linux with autogroups), or None.

    With autogroups on (``/proc/sys/kernel/sched_autogroup_enabled``, the default of most distributions) the
    kernel shares the CPU fairly between sessions first and applies nice values only inside a session, and a
    new session (``setsid``, which geodml's launcher and the study runner use so that a terminal's Ctrl-C
    reaches the ranks once) starts at autogroup nice 0. So ``nice -n 19 python -m geodml.study ...`` would
    not run in the background: its runs' sessions would compete with the foreground at full weight
    (measured here: a foreground run 2x slower beside a "nice 19" study). The new session gets the larger of
    this process's nice value and its session's autogroup nice."""
    try:
        with open("/proc/self/autogroup") as f:
            text = f.read()
    except OSError:
        return None
    try:
        group = int(text.rsplit("nice", 1)[1])
    except (IndexError, ValueError):
        return None
    return max(os.nice(0), group)


def apply_session_nice(nice: int | None) -> None:
    """In a new session's first process: set its autogroup's nice (``session_nice``); nothing where the OS has
    no autogroups or refuses (raising priority needs CAP_SYS_NICE)."""
    if nice is None:
        return
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        pass
