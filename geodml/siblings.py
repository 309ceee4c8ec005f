"""The other workers of this process's torchrun agent, and which of them have ended (Linux ``/proc``).

A torchrun agent starts its node's workers as its own children and, with ``--max-restarts 0``, stops
the rest with SIGTERM as soon as one of them ends with an error. A worker stopped that way can tell
which of its siblings ended first: that one's process is gone (or a zombie) while the others still
run (geodml.peerwatch.AgentStop, docs/reliability.md "Two nodes"). :func:`local_siblings` takes the
snapshot early, when every sibling exists; :func:`ended` checks it again. A pid is matched with its
start time, so a pid reused by an unrelated process is not mistaken for the sibling.

Global ranks: torchrun gives an agent's workers the contiguous ranks ``RANK - LOCAL_RANK + L`` (torch's
``SimpleElasticAgent._assign_worker_ranks``); each sibling's own ``RANK`` is read from its environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Sibling:
    """One other worker of this process's torchrun agent."""

    rank: int
    local_rank: int
    pid: int
    started_ticks: int
    """Field 22 of /proc/PID/stat: the start time, in clock ticks since boot."""


def _stat(pid: int, proc: Path = PROC) -> tuple[str, int] | None:
    """(state letter, start time in ticks) of a process, None when it does not exist."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[19])


def _environ(pid: int, proc: Path = PROC) -> dict[str, str]:
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _children(ppid: int, proc: Path = PROC) -> list[int]:
    """Pids whose parent is ``ppid`` (a scan of /proc: the ``children`` file needs CONFIG_PROC_CHILDREN)."""
    kids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[1]) == ppid:
            kids.append(int(entry.name))
    return kids


def local_siblings(proc: Path = PROC) -> list[Sibling]:
    """The other workers of this process's torchrun agent (same parent, same ``TORCHELASTIC_RUN_ID`` and
    restart count), by local rank; empty outside torchrun's agent or where /proc cannot be read."""
    me, env = os.getpid(), os.environ
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id is None or not proc.is_dir():
        return []
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    found = []
    try:
        kids = _children(os.getppid(), proc)
    except OSError:
        return []
    for pid in kids:
        if pid == me:
            continue
        theirs = _environ(pid, proc)
        stat = _stat(pid, proc)
        if stat is None or theirs.get("TORCHELASTIC_RUN_ID") != run_id or \
                theirs.get("TORCHELASTIC_RESTART_COUNT", "0") != restart:
            continue
        try:
            found.append(Sibling(int(theirs["RANK"]), int(theirs["LOCAL_RANK"]), pid, stat[1]))
        except (KeyError, ValueError):
            continue
    return sorted(found, key=lambda s: s.local_rank)


def ended(siblings: list[Sibling], proc: Path = PROC) -> list[Sibling]:
    """The siblings whose process has ended: gone, a zombie, or its pid now another process's."""
    out = []
    for s in siblings:
        stat = _stat(s.pid, proc)
        if stat is None or stat[0] in ("Z", "X") or stat[1] != s.started_ticks:
            out.append(s)
    return out
