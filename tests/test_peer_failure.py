"""Peer failure (issue 10 item 2): a rank that dies without restarts makes every other rank exit
non-zero within ``--peer-timeout-s`` (plus one heartbeat interval and slack), with an error that
names the lost rank -- whether the survivors were blocked in a ZeroMQ receive (Gaia) or in a
gloo collective (BSP). The ranks are started as plain processes (RANK/WORLD_SIZE/MASTER_* in the
environment, no torchrun agent that would stop them for us)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from geodml.peerwatch import FAULT_EXIT, PEER_LOST_EXIT, PeerWatch, looks_like_peer_loss
from tests.support.procs import REPO, _env, _kill, free_port

PEER_TIMEOUT_S = 3.0
SLACK_S = 8.0  # process scheduling on 2 busy cores, store round trips


def _launch(k: int, argv: list[str], tmp, fault: str) -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for r in range(k):
        env = _env({"RANK": str(r), "WORLD_SIZE": str(k), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(k),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GEODML_FAULT": fault})
        procs.append(subprocess.Popen([sys.executable, "-m", "geodml", *argv], cwd=REPO, env=env,
                                      stdout=open(tmp / f"out{r}.txt", "w"), stderr=open(tmp / f"err{r}.txt", "w"),
                                      start_new_session=True))
    return procs


@pytest.mark.integration
@pytest.mark.parametrize("algo", ["gaia", "bsp"])
def test_dead_rank_stops_every_other_rank_naming_it(tmp_path, algo):
    k, victim = 3, 1
    argv = ["--dataset", "digits", "--model", "logreg", "--no-progress", "--wan", "off", "--algo", algo,
            "--steps", "100000", "--eval-every", "100000", "--log-every", "1000", "--out", str(tmp_path / "run"),
            "--peer-timeout-s", str(PEER_TIMEOUT_S), "--comm-timeout", "120"]
    procs = _launch(k, argv, tmp_path, fault=f"rank={victim},step=30,how=exit")
    try:
        deadline = time.monotonic() + 180
        while procs[victim].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        died_at = time.monotonic()
        assert procs[victim].returncode == FAULT_EXIT, (tmp_path / f"err{victim}.txt").read_text()[-2000:]
        bound = PEER_TIMEOUT_S + 1.0 + SLACK_S
        while time.monotonic() - died_at < bound and any(p.poll() is None for p in procs):
            time.sleep(0.05)
        took = time.monotonic() - died_at
        alive = [r for r, p in enumerate(procs) if p.poll() is None]
        assert not alive, f"ranks {alive} still running {took:.1f} s after rank {victim} died"
        print(f"{algo}: every other rank gone {took:.2f} s after rank {victim} died (--peer-timeout-s {PEER_TIMEOUT_S:g})")
    finally:
        _kill(procs)
    for r in range(k):
        if r == victim:
            continue
        err = (tmp_path / f"err{r}.txt").read_text()
        assert procs[r].returncode == PEER_LOST_EXIT, f"rank {r} exit {procs[r].returncode}: {err[-2000:]}"
        assert f"geodml: error: rank {victim} lost" in err, err[-2000:]
        assert err.count("geodml: error:") == 1
    # no orphans: nothing started by the ranks outlives them
    leftovers = [c for c in psutil.Process().children(recursive=True) if c.is_running()]
    assert not [c for c in leftovers if c.status() != psutil.STATUS_ZOMBIE]


class _FakeStore:
    def __init__(self):
        self.kv = {}

    def add(self, key, n):
        self.kv[key] = self.kv.get(key, 0) + n
        return self.kv[key]

    def set(self, key, value):
        self.kv[key] = value

    def get(self, key):
        return self.kv[key]


def test_watch_names_a_silent_peer_and_ignores_finished_ones():
    """In-process: rank 0 watches ranks 1 (finished: marks done) and 2 (silent) through one store."""
    store = _FakeStore()
    lost = []
    w = PeerWatch(rank=0, world_size=3, timeout_s=0.4, store=store, on_lost=lost.append)
    store.add(f"{w.ns}/done/1", 1)
    t0 = time.monotonic()
    w.start()
    assert w.await_verdict(5.0) is not None
    took = time.monotonic() - t0
    w.stop(done=True)
    assert len(lost) == 1 and lost[0].startswith("geodml: error: rank 2 lost: no heartbeat for")
    assert 0.4 <= took < 0.4 + 2 * w.interval_s + 1.0
    assert store.kv[f"{w.ns}/done/0"] == 1


def test_failed_peer_is_named_at_once_and_comm_errors_are_recognized():
    store = _FakeStore()
    lost = []
    w = PeerWatch(rank=2, world_size=3, timeout_s=30.0, store=store, on_lost=lost.append)
    store.add(f"{w.ns}/failed/0", 1)
    w.start()
    assert w.await_verdict(5.0) == "rank 0 lost: it failed and stopped"
    w.stop(done=False)
    assert looks_like_peer_loss(RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
    assert looks_like_peer_loss(ConnectionResetError())
    assert not looks_like_peer_loss(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not looks_like_peer_loss(ValueError("bad"))


def test_a_peers_bad_input_makes_every_rank_exit_2_and_only_rank_0_speak():
    """A bad input found after the process group exists (issue 20, class 1): the rank that found it
    marks it in the store; a watching peer hands the message to ``on_input_error`` at its next check
    (by default: rank 0 prints it, every rank exits 2) instead of naming a lost rank."""
    store = _FakeStore()
    failing = PeerWatch(rank=1, world_size=2, timeout_s=30.0, store=store, on_lost=lambda m: None)
    failing.mark_failed(input_error="--metrics-port 9000: port 9001 is not free")
    seen, lost = [], []
    w = PeerWatch(rank=0, world_size=2, timeout_s=30.0, store=store, on_lost=lost.append, on_input_error=seen.append)
    w.start()
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.02)
    w.stop(done=False)
    assert seen == ["--metrics-port 9000: port 9001 is not free"] and lost == []


STARTUP_ARGV = ["--dataset", "digits", "--model", "logreg", "--no-progress", "--wan", "off", "--algo", "bsp",
                "--steps", "5", "--comm-timeout", "6"]


def _wait_all(procs, bound_s):
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    return [r for r, p in enumerate(procs) if p.poll() is None]


@pytest.mark.integration
def test_rank_lost_during_startup_is_named_within_the_bound(tmp_path):
    """Issue 20, class 6: rank 2 dies before it joins (before any process group). The others wait at
    most --comm-timeout (6 s) in the join, not torch's rendezvous, and exit 3; each of them says, in
    one line of its own, how many joined and which rank is missing (issue 71 item 5: every surviving
    rank names the lost one); no traceback."""
    k = 3
    procs = _launch(k, [*STARTUP_ARGV, "--out", str(tmp_path / "run")], tmp_path, fault="rank=2,at=startup")
    try:
        t0 = time.monotonic()
        alive = _wait_all(procs, 60)
        took = time.monotonic() - t0
    finally:
        _kill(procs)
    assert not alive, f"ranks {alive} still running after 60 s"
    errs = [(tmp_path / f"err{r}.txt").read_text() for r in range(k)]
    assert procs[2].returncode != 0 and "GEODML_FAULT: rank 2 dies at startup" in errs[2]
    assert [procs[r].returncode for r in (0, 1)] == [PEER_LOST_EXIT] * 2, errs
    for r in (0, 1):
        assert errs[r].count("geodml: error:") == 1, errs[r]
        assert ("start-up: 2 of 3 ranks joined within 6 s (--comm-timeout); missing: rank 2 (died or never started; "
                f"see that rank's output); stopping rank {r}") in errs[r], errs[r]
        assert "Traceback" not in errs[r]
    print(f"ranks 0 and 1 gone {took:.1f} s after start (bound: --comm-timeout 6 s + start-up)")


@pytest.mark.integration
def test_store_host_lost_during_startup_is_named(tmp_path):
    """Without a torchrun agent rank 0 hosts the store; if it dies before it starts it, the others
    say so within --comm-timeout and exit 3 (no traceback)."""
    k = 3
    procs = _launch(k, [*STARTUP_ARGV, "--out", str(tmp_path / "run")], tmp_path, fault="rank=0,at=startup")
    try:
        alive = _wait_all(procs, 60)
    finally:
        _kill(procs)
    assert not alive
    for r in (1, 2):
        err = (tmp_path / f"err{r}.txt").read_text()
        assert procs[r].returncode == PEER_LOST_EXIT, err[-2000:]
        assert "cannot reach the store rank 0 hosts (no torchrun agent)" in err and "rank 0 is missing" in err, err
        assert err.count("geodml: error:") == 1 and "Traceback" not in err


@pytest.mark.integration
def test_rank_killed_after_the_summary_does_not_fail_the_finished_job(tmp_path):
    """Issue 20, class 5: rank 1 is SIGKILLed once summary.json exists (as if it died during
    --metrics-linger). torchrun --max-restarts 1 restarts the workers; they find the run finished
    and exit 0, so the job exits 0, and they change nothing in the run directory."""
    from geodml import rundir
    from tests.support.procs import run_torchrun
    out = tmp_path / "run"
    argv = [*STARTUP_ARGV, "--steps", "20", "--out", str(out)]
    r = run_torchrun(2, argv, timeout_s=240, extra_torchrun=["--max-restarts", "1"],
                     env={"GEODML_FAULT": "rank=1,at=finished"})
    text = r.stdout + r.stderr
    assert "GEODML_FAULT: rank 1 dies at finished (kill)" in text, text[-3000:]
    assert r.returncode == 0, text[-3000:]
    assert "already holds this run, finished (summary.json): nothing to do after the torchrun restart" in text
    assert "Traceback" not in text
    summary = rundir.read_summary(out)
    assert summary is not None and summary["steps"] == 20
    # the restarted attempt wrote nothing: every file is older than the summary (written last)
    written_last = (out / rundir.SUMMARY).stat().st_mtime
    newer = [p.name for p in out.rglob("*") if p.is_file() and p.stat().st_mtime > written_last + 0.5]
    assert not newer, newer


# ---- leaving together: the store's host outlives every rank's last store call ----
def test_the_store_host_waits_for_every_rank_to_leave(monkeypatch):
    """Rank 0 hosts the store without a torchrun agent; the run's other ranks count out 0.3 s later than it
    would leave. leave_together on rank 0 returns only once both have (>= 0.3 s, well before the 5 s bound);
    with a rank that never counts out it gives up at ``wait_s``; another rank never waits."""
    import threading
    import time as _time
    from datetime import timedelta

    import torch.distributed as dist

    from geodml.runtime import Env, leave_together
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=5))
    late = [threading.Timer(0.3, leave_together, args=(store, Env(r, 3, r, 3, True))) for r in (1, 2)]
    t0 = _time.monotonic()
    for t in late:
        t.start()
    leave_together(store, Env(0, 3, 0, 3, True), wait_s=5.0)
    waited = _time.monotonic() - t0
    assert 0.3 <= waited < 3.0 and store.add("geodml/leave/0", 0) == 3
    for t in late:
        t.join(5)
    alone = dist.HashStore()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")   # a new attempt counts afresh
    t0 = _time.monotonic()
    leave_together(alone, Env(0, 2, 0, 2, True), wait_s=0.2)
    assert 0.2 <= _time.monotonic() - t0 < 2.0 and alone.add("geodml/leave/1", 0) == 1
    t0 = _time.monotonic()
    leave_together(alone, Env(1, 2, 1, 2, True), wait_s=5.0)
    assert _time.monotonic() - t0 < 0.5 and alone.add("geodml/leave/1", 0) == 2
