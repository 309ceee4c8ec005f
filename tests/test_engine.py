"""The engine (geodml.engine): cooperative hosting, the worker, shared state, the local launcher.

The golden matrix (tests/test_golden.py) shows every shipped algorithm unchanged on every process
count. Here: an algorithm the engine has never seen, with state of its own per partition, hosted
with P > R and checkpointed, with no change to the engine; the hub's scheduling, failures and
deadlock report, worked by hand; the shared buffers' identity and leases; the launcher's default.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from geodml.algorithms.local import Local
from geodml.algorithms.shared import ProcessShared
from geodml.engine.hub import Deadlock, Hub

COUNTED: dict[int, tuple[int, int]] = {}
"""What each CountingLocal partition saw at its finish: (its steps, its weighted sum)."""


class CountingLocal(Local):
    """A test double: ``local`` training plus state of each partition's own -- a step counter and a
    sum weighted by the partition's rank -- kept in the object, checkpointed, logged by partition 0,
    and reported at the finish. Nothing in the engine knows it."""

    name = "counting-local"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.count = 0
        self.weighted = 0

    def after_step(self, step: int, lr: float) -> None:
        self.count += 1
        self.weighted += (self.ctx.rank + 1) * (step + 1)

    def finish(self) -> None:
        COUNTED[self.ctx.rank] = (self.count, self.weighted)

    def stats(self) -> dict[str, float]:
        return {"counting_count": float(self.count)}

    def state_dict(self):
        return {**super().state_dict(), "count": self.count, "weighted": self.weighted}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.count, self.weighted = int(state["count"]), int(state["weighted"])


ARGV = ["--dataset", "digits", "--model", "logreg", "--partitions", "6", "--steps", "20", "--eval-every", "10",
        "--log-every", "5", "--no-progress", "--wan", "virtual", "--algo", "local"]


def _counting(monkeypatch):
    from geodml import algorithms
    monkeypatch.setitem(algorithms.REGISTRY, "local", "tests.test_engine:CountingLocal")
    COUNTED.clear()


def test_an_algorithm_with_state_of_its_own_is_hosted_with_no_engine_change(tmp_path, monkeypatch):
    """Six partitions in one process, each with its own counter: each counts its own 20 steps and its
    own rank-weighted sum (k + 1) * (1 + ... + 20) = 210 (k + 1), so no state is shared or lost; the
    metrics log partition 0's counter; the variant name reaches summary.json."""
    from geodml.cli import main
    _counting(monkeypatch)
    assert main([*ARGV, "--out", str(tmp_path / "run")]) == 0
    assert COUNTED == {k: (20, 210 * (k + 1)) for k in range(6)}
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["counting_count"]) for r in lines] == [(5, 5.0), (10, 10.0), (15, 15.0), (20, 20.0)]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["algo_variant"] == "counting-local"


def test_its_state_is_checkpointed_and_resumed_per_partition(tmp_path, monkeypatch):
    """Stopped after step 12 (checkpoints every 5: steps 11-12 are redone) and resumed: every partition's
    counters continue from its own checkpoint and end as in an uninterrupted run."""
    from geodml.cli import main
    from geodml.trainer import Trainer
    _counting(monkeypatch)
    argv = [*ARGV, "--checkpoint-every", "5", "--out", str(tmp_path / "run")]
    real_run = Trainer.run

    def stop_after_12(self):
        self.step_hooks = (*self.step_hooks, lambda t: _stop(t))
        return real_run(self)

    class Stop(Exception):
        pass

    def _stop(t):
        if t.state.step == 12:
            raise Stop

    monkeypatch.setattr(Trainer, "run", stop_after_12)
    with pytest.raises(Stop):
        main(argv)
    monkeypatch.setattr(Trainer, "run", real_run)
    assert sorted(p.name for p in (tmp_path / "run" / "rank3").glob("ckpt-*.pt")) == ["ckpt-00000010.pt"]
    COUNTED.clear()
    assert main([*argv, "--resume"]) == 0
    assert COUNTED == {k: (20, 210 * (k + 1)) for k in range(6)}


# ---- the hub ---------------------------------------------------------------------------------------
def test_tasks_take_turns_at_their_waits_in_order():
    """Two tasks hand a token back and forth through waits; the hub resumes each once its key is
    notified: the interleaving is exactly a0 b0 a1 b1 a2 b2."""
    hub, seen, box = Hub(), [], {"turn": "a"}

    def task(me, other):
        for i in range(3):
            hub.wait(("turn", me), lambda: box["turn"] == me, None)
            seen.append(f"{me}{i}")
            box["turn"] = other
            hub.notify(("turn", other))

    hub.spawn(lambda: task("a", "b"), name="a")
    hub.spawn(lambda: task("b", "a"), name="b")
    tasks = hub.run()
    assert seen == ["a0", "b0", "a1", "b1", "a2", "b2"] and all(t.error is None for t in tasks)


def test_every_task_waiting_with_nothing_to_wake_it_is_a_deadlock_naming_the_waits():
    hub = Hub()
    hub.spawn(lambda: hub.wait("never", lambda: False, None), name="partition 0")
    hub.spawn(lambda: hub.wait(("collective", 7), lambda: False, None), name="partition 1")
    with pytest.raises(Deadlock, match=r"partition 0 waits for never; partition 1 waits for \('collective', 7\)"):
        hub.run()


def test_a_failing_task_calls_on_error_once_and_the_others_see_it():
    """The failure reaches on_error (the engine aborts the Comm group there, which fails every wait);
    the other task is woken and ends; run() returns both outcomes."""
    hub, errors = Hub(), []
    failed = {"yes": False}

    def on_error(exc):
        errors.append(exc)
        failed["yes"] = True

    hub = Hub(on_error=on_error)

    def waits():
        hub.wait("x", lambda: failed["yes"], time.monotonic() + 30)
        raise RuntimeError("woken by the failure")

    hub.spawn(waits, name="w")
    hub.spawn(lambda: 1 / 0, name="z")
    tasks = hub.run()
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)
    assert [type(t.error).__name__ for t in tasks] == ["RuntimeError", "ZeroDivisionError"]


def test_a_wait_past_its_deadline_returns_false_and_another_thread_can_wake_the_hub():
    hub, out = Hub(external=lambda: True), {}
    flag = {"set": False}

    def later():
        time.sleep(0.2)
        flag["set"] = True
        hub.notify("flag")

    threading.Thread(target=later, daemon=True).start()

    def task():
        out["timed_out"] = hub.wait("never", lambda: False, time.monotonic() + 0.05)
        out["woken"] = hub.wait("flag", lambda: flag["set"], time.monotonic() + 10)
        t0 = time.monotonic()
        hub.sleep(0.1)
        out["slept"] = time.monotonic() - t0

    hub.spawn(task, name="t")
    assert hub.run()[0].error is None
    assert out["timed_out"] is False and out["woken"] is True and out["slept"] >= 0.1


# ---- shared state ------------------------------------------------------------------------------------
def test_scratch_is_one_buffer_per_name_shape_and_dtype_and_leases_are_reused():
    s = ProcessShared()
    a, b = s.scratch("x", 5, torch.float32), s.scratch("x", 5, torch.float32)
    assert a is b and s.scratch("x", 6, torch.float32) is not a and s.scratch("y", 5, torch.float32) is not a
    t = s.tensor("w", torch.ones(3), lambda v: v.fill_(7))
    assert s.tensor("w", torch.ones(3), lambda v: v.fill_(0)) is t and t.tolist() == [7.0, 7.0, 7.0]
    u = s.lease("u", torch.zeros(4))
    s.release("u", u)
    assert s.lease("u", torch.zeros(4)) is u and s.lease("u", torch.zeros(4)) is not u
    s.poison()
    assert torch.isnan(a).all()


# ---- the launcher ------------------------------------------------------------------------------------
def test_the_default_process_count(monkeypatch):
    from geodml.engine import launcher
    monkeypatch.delenv(launcher.PROCESSES_ENV, raising=False)
    monkeypatch.setattr("geodml.cores.usable_cores", lambda: 2)
    assert launcher.default_processes(6) == 2 and launcher.default_processes(1) == 1
    monkeypatch.setenv(launcher.PROCESSES_ENV, "4")
    assert launcher.default_processes(6) == 4 and launcher.default_processes(3) == 3
    monkeypatch.setenv(launcher.PROCESSES_ENV, "0")
    with pytest.raises(ValueError, match="GEODML_PROCESSES='0': expected a whole number of processes >= 1"):
        launcher.default_processes(6)


def test_the_launcher_forks_only_where_no_thread_has_started(monkeypatch):
    import threading

    from geodml.engine import launcher
    monkeypatch.delenv(launcher.LAUNCH_ENV, raising=False)
    assert launcher.launch_mode() == "fork"
    monkeypatch.setattr(launcher, "_os_threads", lambda: launcher.THREADS_AT_IMPORT)
    assert launcher.can_fork() == (threading.active_count() == 1)
    monkeypatch.setattr(launcher, "_os_threads", lambda: launcher.THREADS_AT_IMPORT + 1)  # e.g. torch's OpenMP pool
    assert not launcher.can_fork()
    monkeypatch.setattr(launcher, "_os_threads", lambda: launcher.THREADS_AT_IMPORT)
    monkeypatch.setenv(launcher.LAUNCH_ENV, "exec")
    assert not launcher.can_fork()
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        monkeypatch.delenv(launcher.LAUNCH_ENV)
        assert not launcher.can_fork()  # a Python thread: a fork would copy it without it running
    finally:
        stop.set()
        t.join(timeout=10)
    monkeypatch.setenv(launcher.LAUNCH_ENV, "spawn")
    with pytest.raises(ValueError, match="GEODML_LAUNCH='spawn': expected fork"):
        launcher.launch_mode()


@pytest.mark.integration
def test_forked_and_fresh_ranks_give_the_same_bits(tmp_path):
    """`python -m geodml --processes 2` with its ranks forked after the imports (the default) and started as fresh
    interpreters (GEODML_LAUNCH=exec): the same model files, summary numbers and metrics lines but measured time; a bad
    GEODML_LAUNCH is one error line and exit 2 before anything is written."""
    import os
    import subprocess
    import sys
    repo = Path(__file__).resolve().parents[1]
    argv = ["--dataset", "digits", "--partitions", "4", "--steps", "30", "--no-progress", "--algo", "fedavg",
            "--iter-local", "5", "--processes", "2"]
    outs = {}
    for mode in ("fork", "exec", "bogus"):
        env = {**os.environ, "PYTHONPATH": str(repo), "GEODML_LAUNCH": mode}
        outs[mode] = tmp_path / mode
        r = subprocess.run([sys.executable, "-m", "geodml", *argv, "--out", str(outs[mode])], env=env,
                           capture_output=True, text=True, timeout=240)
        if mode == "bogus":
            assert r.returncode == 2 and r.stderr.strip().splitlines()[0] == (
                "geodml: error: GEODML_LAUNCH='bogus': expected fork (the default) or exec"), r.stderr
            assert not outs[mode].exists()
            continue
        assert r.returncode == 0, r.stderr[-3000:]
        assert "done:" in r.stdout + r.stderr
    for k in range(4):
        a, b = (torch.load(outs[m] / f"rank{k}" / "model.pt") for m in ("fork", "exec"))
        assert all(torch.equal(a[n], b[n]) for n in a), k

    def lines(out):
        # wall and emulated seconds are measured (the emulated clock adds each step's measured compute time)
        return [{k: v for k, v in json.loads(x).items() if k not in ("wall_s", "emulated_s")}
                for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines(outs["fork"]) == lines(outs["exec"])
    sa, sb = (json.loads((outs[m] / "summary.json").read_text()) for m in ("fork", "exec"))
    assert sa["wan_bytes_by_link"] == sb["wan_bytes_by_link"] and sa["final_val_accuracy"] == sb["final_val_accuracy"]


@pytest.mark.integration
def test_python_m_geodml_uses_every_core_by_default_with_the_same_result(tmp_path):
    """Outside torchrun, P = 6 with GEODML_PROCESSES unset on a machine (a taskset) of 2 cores runs as 2
    processes of 3 partitions (config.json says so, both ranks wrote startup.json) and ends with the
    bits of the one-process run; --processes 1 keeps one process."""
    import os
    import subprocess
    import sys
    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "GEODML_PROCESSES"}
    env["PYTHONPATH"] = str(repo)
    argv = ["--dataset", "digits", "--partitions", "6", "--steps", "20", "--no-progress", "--algo", "gaia", "--t0", "0.05"]
    outs = {}
    for name, extra in (("auto", []), ("one", ["--processes", "1"])):
        outs[name] = tmp_path / name
        r = subprocess.run(["taskset", "-c", "0,1", sys.executable, "-m", "geodml", *argv, *extra, "--out",
                            str(outs[name])], env=env, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr[-3000:]
    configs = {n: json.loads((o / "config.json").read_text()) for n, o in outs.items()}
    assert configs["auto"]["processes"] == 2 and configs["one"]["processes"] == 1
    for k in range(6):
        a, b = (torch.load(o / f"rank{k}" / "model.pt") for o in outs.values())
        assert all(torch.equal(a[n], b[n]) for n in a), k
    sa, sb = (json.loads((o / "summary.json").read_text()) for o in outs.values())
    assert sa["wan_bytes_by_link"] == sb["wan_bytes_by_link"] and sa["final_val_accuracy"] == sb["final_val_accuracy"]


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["fork", "exec"])
def test_the_ranks_sessions_keep_a_nice_launchers_priority(tmp_path, mode):
    """`nice -n 7 python -m geodml --processes 2`: each rank runs in a session of its own, which with Linux
    autogroups would start at autogroup nice 0 and compete with the foreground at full weight; the ranks'
    autogroups get nice 7 (geodml.cores.session_nice), forked or fresh."""
    import os
    import subprocess
    import sys
    import time

    import psutil
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("this kernel has no scheduler autogroups (nothing to keep)")
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "GEODML_LAUNCH": mode}
    p = subprocess.Popen(["nice", "-n", "7", sys.executable, "-m", "geodml", "--dataset", "digits", "--partitions", "2",
                          "--processes", "2", "--steps", "100000", "--no-progress", "--wan", "off", "--out",
                          str(tmp_path / "run")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        groups: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(groups) < 2:
            kids = [c for c in psutil.Process(p.pid).children() if c.is_running()]
            groups = []
            for c in kids:
                try:
                    groups.append(Path(f"/proc/{c.pid}/autogroup").read_text().split()[-1])
                except OSError:
                    pass
            time.sleep(0.2)
        assert groups == ["7", "7"], groups
    finally:
        ranks = psutil.Process(p.pid).children(recursive=True) if p.poll() is None else []
        os.killpg(p.pid, 9)
        for c in ranks:  # in sessions of their own: not in the launcher's group
            try:
                c.kill()
            except psutil.NoSuchProcess:
                pass
        p.wait(timeout=30)
