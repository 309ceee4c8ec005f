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
from tests.mp import REPO, _env, _kill, free_port

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
