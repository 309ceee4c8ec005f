"""One command uses the machine's cores: ``python -m geodml`` outside torchrun starts its own processes.

A process trains its hosted partitions one at a time on one thread (geodml.engine.hub), so a run in
one process uses one core. When ``python -m geodml`` is not launched by torchrun and the run has more
than one partition, it starts R = ``--processes`` copies of itself (default: one per usable core,
at most one per partition: geodml.cores.usable_cores, which honours ``taskset`` and cgroups) with
the environment torchrun would give them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR=127.0.0.1, a free MASTER_PORT; no agent, so rank 0 hosts the store), each hosting a
contiguous block of the partitions. A run's results do not depend on R (tests/test_golden.py), so
this changes only how fast it runs. Why processes and not threads: torch's kernels release the GIL
but the training loop's Python does not, and a process each keeps the engine single-threaded (one
worker model, no locks on its scratch).

The launcher waits for its children and returns rank 0's exit code (the one that printed the run's
messages), or the first other non-zero one. A signal it receives (SIGINT, SIGTERM) is passed on to
the children once, which end their run at an agreed step (geodml.interrupt); a second one, or their
not having ended ``STOP_GRACE_S`` after the first, kills them. The children run in a session of their
own, so a Ctrl-C at the terminal reaches them only through the launcher. ``GEODML_PROCESSES`` in the
environment sets the default of ``--processes`` (the test suite
sets 1).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

PROCESSES_ENV = "GEODML_PROCESSES"
"""The environment variable that sets ``--processes``'s default (an integer >= 1)."""
STOP_GRACE_S = 30.0
"""Seconds the children get to end after a signal before they are killed."""


def default_processes(partitions: int) -> int:
    """``--processes`` when not given: ``GEODML_PROCESSES``, else one per usable core; at most one per partition."""
    from geodml.cores import usable_cores
    text = os.environ.get(PROCESSES_ENV)
    if text:
        try:
            wanted = int(text)
        except ValueError:
            raise ValueError(f"{PROCESSES_ENV}={text!r}: expected a whole number of processes >= 1") from None
        if wanted < 1:
            raise ValueError(f"{PROCESSES_ENV}={text!r}: expected a whole number of processes >= 1")
    else:
        wanted = usable_cores()
    return max(1, min(wanted, partitions))


def _free_port() -> int:
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(argv: Sequence[str], processes: int) -> int:
    """Run ``python -m geodml argv`` as ``processes`` local ranks (module docstring); their exit code."""
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if k not in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
                                                              "TORCHELASTIC_RESTART_COUNT")}
    children: list[subprocess.Popen] = []
    stopping: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if stopping:  # a second signal: stop at once
            for c in children:
                if c.poll() is None:
                    c.kill()
            return
        stopping.append(signum)
        for c in children:
            if c.poll() is None:
                c.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for rank in range(processes):
            env = {**base, "RANK": str(rank), "WORLD_SIZE": str(processes), "LOCAL_RANK": str(rank),
                   "LOCAL_WORLD_SIZE": str(processes), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   PROCESSES_ENV: str(processes)}
            # In a session of their own: a Ctrl-C at the terminal reaches this process only, which passes it on
            # once (the ranks then stop at an agreed step, geodml.interrupt; two would be the "stop at once"
            # signal); they get SIGTERM if this process dies without passing anything on.
            children.append(subprocess.Popen([sys.executable, "-m", "geodml", *argv], env=env, start_new_session=True,
                                             preexec_fn=_terminate_with_parent))
        codes = [c if c >= 0 else 128 - c for c in _wait(children, stopping)]  # -N: killed by signal N
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()
    if codes[0] != 0:
        return codes[0]
    return next((c for c in codes if c != 0), 0)


def _terminate_with_parent() -> None:
    """In the child before exec: SIGTERM when the launcher dies (Linux prctl PR_SET_PDEATHSIG; elsewhere nothing)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _wait(children: list[subprocess.Popen], stopping: list[int]) -> list[int]:
    """Every child's exit code; after a signal, the children that outlive the grace are killed."""
    deadline: float | None = None
    while True:
        codes = [c.poll() for c in children]
        if all(code is not None for code in codes):
            return [int(code) for code in codes if code is not None]
        if stopping and deadline is None:
            deadline = time.monotonic() + STOP_GRACE_S
        if deadline is not None and time.monotonic() > deadline:
            for c in children:
                if c.poll() is None:
                    c.kill()
        time.sleep(0.05)
