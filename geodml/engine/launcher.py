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

**Fork after the imports.** Where no thread has started in the launcher since it imported torch
(no Python thread, and no native pool such as torch's OpenMP one: ``can_fork``), it imports torch and the run's modules
once and starts the ranks with ``os.fork``: each child is a copy with the imports done (about 2
CPU-s and 1.5-2 s of wall time a rank on this machine; the pages are shared until written). The
child then does what ``python -m geodml`` would: a session of its own, SIGTERM when the launcher
dies, the default signal handlers, the rank's environment, ``geodml.cli.main`` on the same
arguments, the exit handlers, ``os._exit``. Elsewhere (another OS, threads running, or
``GEODML_LAUNCH=exec``) it starts fresh interpreters as before; the results are the same bits
either way (tests/test_engine.py).

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
from collections.abc import Callable, Sequence

from geodml.cores import apply_session_nice, session_nice
from geodml.runtime import exit_now

PROCESSES_ENV = "GEODML_PROCESSES"
"""The environment variable that sets ``--processes``'s default (an integer >= 1)."""
STOP_GRACE_S = 30.0
"""Seconds the children get to end after a signal before they are killed."""
LAUNCH_ENV = "GEODML_LAUNCH"
"""``exec`` makes the launcher start fresh interpreters instead of forking (``fork``, the default where it can)."""


def _os_threads() -> int:
    """This process's OS threads (1 where /proc is missing: the caller then also checks ``os.fork`` exists)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


THREADS_AT_IMPORT = _os_threads()
"""OS threads when this module was imported: the main one, plus the pool numpy's OpenBLAS starts when it is
loaded (cores - 1 threads; OpenBLAS shuts it down at fork and restarts it in the child: fork-safe). This module
imports torch (through geodml.engine) and so numpy; the launcher forks only if no thread started after that (torch's
OpenMP pool, which a fork would copy without its threads, starts at the first parallel operation)."""


def launch_mode() -> str:
    """``GEODML_LAUNCH``: ``fork`` (the default) or ``exec``; anything else is a ValueError (bad input)."""
    mode = os.environ.get(LAUNCH_ENV, "fork")
    if mode not in ("fork", "exec"):
        raise ValueError(f"{LAUNCH_ENV}={mode!r}: expected fork (the default) or exec")
    return mode


def can_fork() -> bool:
    """Fork the ranks: Linux, not refused by GEODML_LAUNCH=exec, no Python thread but this one, and no OS thread
    started since this module was imported (THREADS_AT_IMPORT)."""
    import threading
    return (launch_mode() == "fork" and sys.platform.startswith("linux") and threading.active_count() == 1
            and _os_threads() <= THREADS_AT_IMPORT)


class Forked:
    """A forked rank, with the part of subprocess.Popen's interface the launcher uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _fork_rank(argv: Sequence[str], env: dict[str, str], nice: int | None, entry: Callable[[list[str]], int]) -> Forked:
    """Start one rank as a fork of this process (module docstring); the parent gets its handle."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return Forked(pid)
    code = 1
    try:  # the child: never returns into the launcher's frames
        os.setsid()
        apply_session_nice(nice)
        _terminate_with_parent()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        code = entry(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 -- a fresh interpreter would print it and exit 1
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        exit_now(code)
    raise AssertionError("unreachable")  # pragma: no cover


def preload() -> None:
    """Import what every rank imports (torch, the engine, models, data), so forked ranks start with it done."""
    import geodml.compose  # noqa: F401 -- imports geodml.engine and with it torch
    import geodml.interrupt  # noqa: F401


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


def spawn(argv: Sequence[str], processes: int, entry: Callable[[list[str]], int]) -> int:
    """Run ``python -m geodml argv`` as ``processes`` local ranks (module docstring); their exit code. ``entry``
    is what a forked rank calls with ``argv`` (geodml.cli.main, which a fresh interpreter runs)."""
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if k not in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
                                                              "TORCHELASTIC_RESTART_COUNT")}
    children: list[subprocess.Popen | Forked] = []
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

    nice = session_nice()  # the ranks' sessions keep this one's priority (geodml.cores.session_nice)
    fork = can_fork()
    if fork:
        preload()
        fork = can_fork()  # an import that started a thread: fall back to fresh interpreters
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for rank in range(processes):
            env = {**base, "RANK": str(rank), "WORLD_SIZE": str(processes), "LOCAL_RANK": str(rank),
                   "LOCAL_WORLD_SIZE": str(processes), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   PROCESSES_ENV: str(processes)}
            # In a session of their own: a Ctrl-C at the terminal reaches this process only, which passes it on
            # once (the ranks then stop at an agreed step, geodml.interrupt; two would be the "stop at once"
            # signal); they get SIGTERM if this process dies without passing anything on.
            if fork:
                children.append(_fork_rank(argv, env, nice, entry))
            else:
                children.append(subprocess.Popen([sys.executable, "-m", "geodml", *argv], env=env,
                                                 start_new_session=True, preexec_fn=lambda: _new_session(nice)))
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


def _new_session(nice: int | None) -> None:
    """In a fresh rank before exec: this session's priority, and SIGTERM when the launcher dies."""
    apply_session_nice(nice)
    _terminate_with_parent()


def _terminate_with_parent() -> None:
    """In the child before exec: SIGTERM when the launcher dies (Linux prctl PR_SET_PDEATHSIG; elsewhere nothing)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _wait(children: list[subprocess.Popen | Forked], stopping: list[int]) -> list[int]:
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
