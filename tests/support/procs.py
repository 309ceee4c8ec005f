"""Multi-process test harness: real OS processes, gloo on CPU, hard timeouts, no orphans.

``run_workers("tests.test_x:fn", world_size, **kwargs)`` starts ``world_size`` Python
processes (each in its own session, so the whole group can be killed), initialises a gloo
process group in each, calls ``fn(rank, world_size, **kwargs)`` and returns the list of
their return values (pickled through files). Any worker failure or a run past ``timeout_s``
kills every worker and raises ``WorkerError`` with the failing ranks' stderr.

``run_torchrun(nproc, argv, timeout_s)`` runs ``torchrun -m geodml ...`` the same way.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from geodml.bench.ports import free_base, free_port  # noqa: F401 (re-exported: the tests' port picker)

REPO = Path(__file__).resolve().parents[2]


class WorkerError(AssertionError):
    pass


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def stop_gracefully(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGTERM every still-running process group, wait up to ``grace_s`` for them to exit (servers
    flush, runs finish their teardown), then SIGKILL what is left."""
    _signal_groups(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    _kill(procs)


def _signal_groups(procs: list[subprocess.Popen], sig: signal.Signals) -> None:
    """``sig`` to the process group of every process still running."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass


def _kill(procs: list[subprocess.Popen]) -> None:
    _signal_groups(procs, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _wait_all(procs: list[subprocess.Popen], timeout_s: float, *, fail_fast: bool = True) -> bool:
    """Wait for all; True if all finished in time. Stops early when one fails (fail_fast)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return True
        if fail_fast and any(c not in (None, 0) for c in codes):
            time.sleep(0.5)  # let peers report their own errors
            return False
        time.sleep(0.02)
    return False


def run_workers(target: str, world_size: int, *, timeout_s: float = 60.0, env: dict[str, str] | None = None,
                expect_fail: bool = False, **kwargs) -> list:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="geodml-mp-") as tmp:
        tmpd = Path(tmp)
        (tmpd / "kwargs.pkl").write_bytes(pickle.dumps(kwargs))
        procs = []
        for rank in range(world_size):
            e = _env(env)
            e.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tests.support.worker", target, str(tmpd)], cwd=REPO, env=e,
                stdout=open(tmpd / f"out{rank}.txt", "w"), stderr=subprocess.STDOUT, start_new_session=True))
        try:
            finished = _wait_all(procs, timeout_s, fail_fast=not expect_fail)
        finally:
            _kill(procs)
        outs = [(tmpd / f"out{r}.txt").read_text(errors="replace") for r in range(world_size)]
        codes = [p.returncode for p in procs]
        if expect_fail:
            return [(c, o) for c, o in zip(codes, outs)]
        if not finished or any(c != 0 for c in codes):
            why = "timed out" if not finished else f"exit codes {codes}"
            detail = "\n".join(f"--- rank {r} (exit {c}) ---\n{o[-3000:]}" for r, (c, o) in enumerate(zip(codes, outs)))
            raise WorkerError(f"workers for {target} {why} after {timeout_s}s\n{detail}")
        return [pickle.loads((tmpd / f"result{r}.pkl").read_bytes()) for r in range(world_size)]


def run_torchrun(nproc: int, argv: list[str], *, timeout_s: float = 240.0, env: dict[str, str] | None = None,
                 extra_torchrun: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run ``torchrun --nproc_per_node=nproc -m geodml argv``; kill the whole group on timeout."""
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
           f"--master_port={port}", *(extra_torchrun or []), "-m", "geodml", *argv]
    return run_command(cmd, timeout_s=timeout_s, env=env)


def run_command(cmd: list[str], *, timeout_s: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    p = subprocess.Popen(cmd, cwd=REPO, env=_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill([p])
        out, err = p.communicate()
        raise WorkerError(f"{' '.join(cmd)} timed out after {timeout_s}s\nSTDOUT:\n{out[-4000:]}\nSTDERR:\n{err[-4000:]}")
    finally:
        _kill([p])
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


class DoneProc:
    """A launched child that has already exited 0, for a study runner's fake launcher: the runner polls it; no OS
    process."""

    pid = 0
    returncode = 0

    def poll(self):
        return 0

    def wait(self, timeout=None):
        return 0
