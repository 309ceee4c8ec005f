"""A torchrun agent's SIGTERM, explained (issue 71 item 5; geodml.siblings, geodml.peerwatch.AgentStop).

This test process plays the agent: the workers are its children, with the environment torchrun gives
them. The two-node cases with real agents are in tests/test_multinode.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from geodml.peerwatch import PEER_LOST_EXIT
from tests.support.procs import REPO, _env, free_port

pytestmark = pytest.mark.integration

RUN_ID = "agent-stop-test"


def _worker_env(rank: int, world: int = 3, run_id: str = RUN_ID, port: int = 1) -> dict[str, str]:
    return _env({"TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0", "RANK": str(rank),
                 "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


def _sleeper(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env, start_new_session=True)


SIBLINGS = """
import json, sys
from geodml.siblings import ended, local_siblings
sys.stdin.readline()
sibs = local_siblings()
print(json.dumps([[s.rank, s.local_rank, s.pid] for s in sibs]), flush=True)
for line in sys.stdin:
    print(json.dumps([s.rank for s in ended(sibs)]), flush=True)
"""


def test_siblings_are_the_agents_other_workers_and_ended_ones_are_seen():
    """Same parent and run id: siblings (a worker of another run is not); a reaped sibling and a zombie
    have ended, a running one has not."""
    others = [_sleeper(_worker_env(r)) for r in (1, 2)]
    stranger = _sleeper(_worker_env(5, run_id="another-run"))
    me = subprocess.Popen([sys.executable, "-c", SIBLINGS], env=_worker_env(0), cwd=REPO, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    try:
        time.sleep(0.5)   # the sleepers have exec'd: their environment is the worker's
        me.stdin.write("go\n")
        me.stdin.flush()
        assert json.loads(me.stdout.readline()) == [[1, 1, others[0].pid], [2, 2, others[1].pid]]
        others[0].kill()
        others[0].wait()   # reaped: its pid is gone
        me.stdin.write("check\n")
        me.stdin.flush()
        assert json.loads(me.stdout.readline()) == [1]
        others[1].kill()   # not reaped: a zombie
        time.sleep(0.3)
        me.stdin.write("check\n")
        me.stdin.flush()
        assert json.loads(me.stdout.readline()) == [1, 2]
    finally:
        for p in (*others, stranger, me):
            p.kill()
            p.wait()


WORKER = """
import datetime, os, sys, time
import torch.distributed as dist
from geodml.peerwatch import AgentStop
mode = sys.argv[1]
store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=True,
                      timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
stop = AgentStop.install(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"]))
print("ready", flush=True)
if mode == "blocked":
    stop.enter("during the run")
    store.get("never set")   # the main thread blocked inside C++ for up to 60 s
    print("returned", flush=True)
    sys.exit(0)
t0 = time.monotonic()
while time.monotonic() - t0 < 1.5:   # "checking the input": the SIGTERM comes in here
    time.sleep(0.05)
print("checked", flush=True)
if mode == "bad-input":
    from geodml.cli import _bad_input_exit
    sys.exit(_bad_input_exit("bad", False, grace_s=30.0, agent_stop=stop))
stop.enter("at start-up")
time.sleep(30)
print("not stopped", flush=True)
"""


def _worker(mode: str, world: int = 2) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER, mode], env=_worker_env(0, world, port=free_port()),
                            cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


@pytest.mark.parametrize("mode, code", [("ordinary", -signal.SIGTERM), ("bad-input", 2)])
def test_a_sigterm_while_the_input_is_checked_waits_for_the_checks_then_acts_as_before(mode, code):
    """No sibling ended and the store answers: an ordinary SIGTERM. It arrives while this rank checks
    its input; the checks finish, then the signal has its old effect: death by SIGTERM (no handler was
    there before), or exit 2 on the bad-input path (geodml.cli._bad_input_exit), silent."""
    proc = _worker(mode)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, (out, err)
    assert out == "checked\n" and "geodml: error" not in err and "Traceback" not in err, (out, err)


def test_a_rank_blocked_in_a_collective_names_the_sibling_that_ended_first():
    """The agent stops this rank after its sibling (rank 1) died; the main thread is stuck in a C++
    store wait that no Python handler interrupts, yet the rank says at once which rank was lost and
    exits 3 (the thread reads the signal from the wakeup fd)."""
    sibling = _sleeper(_worker_env(1, world=2))
    time.sleep(0.3)
    proc = _worker("blocked")
    try:
        assert proc.stdout.readline() == "ready\n"
        sibling.kill()
        sibling.wait()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        for p in (proc, sibling):
            p.kill()
            p.wait()
    assert proc.returncode == PEER_LOST_EXIT and took < 10, (took, out, err)
    assert err.count("geodml: error:") == 1, err
    assert (f"geodml: error: rank 1 lost during the run: its process (local rank 1, pid {sibling.pid}) ended on "
            "the node of rank 0; its torchrun agent stopped rank 0 (SIGTERM)") in err, err
    assert "returned" not in out and "Traceback" not in err
    print(f"named {took:.2f} s after the SIGTERM")


def test_no_agent_no_watcher(monkeypatch):
    from geodml.peerwatch import AgentStop
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert AgentStop.install(0, 2, 2) is None
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert AgentStop.install(0, 1, 1) is None   # nobody to lose
    assert os.environ["TORCHELASTIC_RUN_ID"] == "x"
