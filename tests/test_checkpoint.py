"""Checkpoint and resume (issue 10 item 1): the file rules by hand, and the equivalence that
matters -- a run stopped after some steps and resumed from its newest common checkpoint ends
with the same weights, bit for bit, and the same ledger totals as an uninterrupted run.

Most runs here are K partitions as K threads of one process (an InProcessGroup: the real
charges, no sockets), so every algorithm is covered in seconds; one torchrun test kills a rank
with SIGKILL under ``--max-restarts 1`` and compares the finished run with an uninterrupted one.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch

from geodml import checkpoint as ck
from geodml.algorithms import build_algorithm
from geodml.algorithms.base import AlgoContext, FlatParams
from geodml.cli import parse_config
from geodml.comm import InProcessGroup
from geodml.comm.ledger import Ledger
from geodml.comm.pacing import EmulatedClock
from geodml.comm.topology import WanLink

# ---- file rules -------------------------------------------------------------------------------
FP = {"world_size": 2, "optim.lr": 0.02, "seed": 0}


def _fake(path, rank, step, fp=FP):
    path.parent.mkdir(parents=True, exist_ok=True)
    ck.atomic_save({"format": ck.FORMAT, "step": step, "rank": rank, "fingerprint": fp, "model": {}, "algo": {},
                    "sampler": {}, "train_state": {}}, path)


def test_newest_step_every_rank_has(tmp_path):
    for r, steps in ((0, (10, 20, 30)), (1, (10, 20))):
        for s in steps:
            _fake(ck.checkpoint_path(tmp_path, r, s), r, s)
    (tmp_path / "rank1" / "ckpt-00000030.pt.tmp").write_bytes(b"half a file")   # a crash mid-write: ignored
    assert ck.list_steps(tmp_path, 1) == [10, 20]
    assert ck.find_resume_step(tmp_path, 2, FP) == 20
    assert ck.find_resume_step(tmp_path / "nothing", 2, FP) is None
    assert not list(tmp_path.glob("rank0/*.tmp"))  # atomic_save leaves no temp file behind


def test_corrupt_and_mismatched_files_are_clear_value_errors(tmp_path):
    _fake(ck.checkpoint_path(tmp_path, 0, 10), 0, 10)
    bad = ck.checkpoint_path(tmp_path, 1, 10)
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ValueError, match=r"rank1/ckpt-00000010.pt is corrupt"):
        ck.find_resume_step(tmp_path, 2, FP)
    _fake(bad, 1, 10, fp={**FP, "optim.lr": 0.05})
    with pytest.raises(ValueError, match=r"optim.lr=0.05 but this run has optim.lr=0.02; resume with the same --lr"):
        ck.find_resume_step(tmp_path, 2, FP)
    _fake(bad, 0, 10)  # rank 0's file in rank 1's directory
    with pytest.raises(ValueError, match="belongs to rank 0, not rank 1"):
        ck.find_resume_step(tmp_path, 2, FP)


def test_a_checkpoint_from_before_the_algo_sections_split_resumes(tmp_path):
    """Checkpoints written when the ``algo`` section held every algorithm's options name them ``algo.t0``,
    ``algo.iter_local``, ...: the same settings as today's ``gaia.t0``, ``fedavg.iter_local`` (issue 66 item 7)."""
    from geodml.config import MOVED_FROM_ALGO
    fp = ck.fingerprint(parse_config(["--algo", "gaia", "--t0", "0.05"]), 2)
    old = {(f"algo.{k.partition('.')[2]}" if k.partition(".")[2] in MOVED_FROM_ALGO else k): v for k, v in fp.items()}
    assert old["algo.t0"] == 0.05 and "gaia.t0" not in old and old["algo.iter_local"] == 20
    for r in (0, 1):
        _fake(ck.checkpoint_path(tmp_path, r, 10), r, 10, fp=old)
    assert ck.find_resume_step(tmp_path, 2, fp) == 10
    other = ck.fingerprint(parse_config(["--algo", "gaia", "--t0", "0.1"]), 2)
    with pytest.raises(ValueError, match=r"gaia.t0=0.05 but this run has gaia.t0=0.1; resume with the same --t0"):
        ck.find_resume_step(tmp_path, 2, other)


def test_a_checkpoint_older_than_a_setting_resumes_at_its_default(tmp_path):
    """A fingerprint without a key (written before the setting existed) ran with the setting's default."""
    plain = ck.fingerprint(parse_config(["--algo", "fedavg"]), 2)
    assert plain["fedavg.rounds"] is None and plain["fedavg.eval_every_rounds"] == 0   # the defaults
    old = {k: v for k, v in plain.items() if k not in ("fedavg.rounds", "fedavg.eval_every_rounds")}
    for r in (0, 1):
        _fake(ck.checkpoint_path(tmp_path, r, 10), r, 10, fp=old)
    assert ck.find_resume_step(tmp_path, 2, plain) == 10
    later = ck.fingerprint(parse_config(["--algo", "fedavg", "--rounds", "3"]), 2)
    with pytest.raises(ValueError, match=r"written before fedavg.rounds existed, so with its default None, but this "
                                         r"run has fedavg.rounds=3; resume with --rounds at its default"):
        ck.find_resume_step(tmp_path, 2, later)
    newer = {**plain, "algo.knob_from_the_future": 1}   # a key the checkpoint has and this geodml lacks: refused
    for r in (0, 1):
        _fake(ck.checkpoint_path(tmp_path, r, 10), r, 10, fp=newer)
    with pytest.raises(ValueError, match=r"algo.knob_from_the_future=1 but this run has algo.knob_from_the_future=None"):
        ck.find_resume_step(tmp_path, 2, plain)


def test_truncate_metrics_keeps_lines_up_to_the_step(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_text('{"step": 5}\n{"step": 10}\n{"step": 15}\n{"step": 2')
    ck.truncate_metrics(m, 10)
    assert m.read_text() == '{"step": 5}\n{"step": 10}\n'


def test_ledger_and_clock_state_round_trip():
    led = Ledger(0, ["a", "b"])
    led.charge(1, "update", 1000, messages=2, emulated_s=0.5)
    other = Ledger(0, ["a", "b"])
    other.load_state_dict(led.state_dict())
    assert other.rows() == [{"src_region": "a", "dst_region": "b", "kind": "update", "bytes": 1000, "messages": 2,
                             "emulated_s": 0.5}]
    with pytest.raises(ValueError, match="rank 0 in region a, this run in b; resume with the same --topology"):
        Ledger(0, ["b", "a"]).load_state_dict(led.state_dict())
    old = {"region_of_rank": ["a", "b"], "rows": led.rows()}      # the form before 2026-11-23: the whole placement
    Ledger(0, ["a", "b"]).load_state_dict(old)
    with pytest.raises(ValueError, match="same --topology"):
        Ledger(0, ["a", "a"]).load_state_dict(old)
    link = WanLink(bandwidth_mbps=8.0, latency_ms=10.0)           # 1 MB/s
    c = EmulatedClock([None, link])
    c.advance(1.0)
    assert c.send(1, 500_000) == pytest.approx(1.51)              # 1 + 0.5 s + 10 ms
    d = EmulatedClock([None, link])
    d.load_state_dict(c.state_dict())
    assert d.now_s == 1.0 and d.send(1, 500_000) == pytest.approx(2.01)   # FIFO: behind the first message
    e = EmulatedClock([None, link])                               # the list form before 2026-11-23
    e.load_state_dict({"now_s": 1.0, "buckets": [None, c.state_dict()["buckets"][1]]})
    assert e.send(1, 500_000) == pytest.approx(2.01)
    with pytest.raises(ValueError, match="3 links, this run 2"):
        e.load_state_dict({"now_s": 1.0, "buckets": [None, None, None]})


# ---- threaded runs: stop, resume, compare --------------------------------------------------
class _Stop(Exception):
    pass


_DS = {}


def _digits():
    if not _DS:
        from geodml.data.datasets import load_dataset
        _DS["ds"] = load_dataset("digits", None, seed=0)
    return _DS["ds"]


def _run(cfg, k, out, *, stop_after=None, resume=False):
    """K threads train ``cfg`` (checkpointing into ``out``); returns per rank (flat weights, ledger rows,
    skewscout trajectory) or None for ranks stopped by ``stop_after``."""
    from geodml.data.partition import make_partitioner, partition_report
    from geodml.metrics.sinks import Sink
    from geodml.models import build_model
    from geodml.skewscout import ModelTraveler, SkewScout
    from geodml.trainer import Schedule, TrainData, Trainer, steps_per_epoch

    ds = _digits()
    labels = ds.train_y.numpy()
    parts = make_partitioner(cfg.data).split(labels, k, np.random.default_rng([cfg.seed, 0xDA7A]))
    counts = np.asarray(partition_report(labels, parts, ds.num_classes)["label_counts"], dtype=np.int64)
    spe = steps_per_epoch(len(labels), k, cfg.optim.batch_size)
    total = cfg.optim.steps
    models = [build_model(cfg.model.model, cfg.model.norm, ds.input_shape, ds.num_classes, generator_seed=cfg.seed)
              for _ in range(k)]
    fp = ck.fingerprint(cfg, k)
    step = ck.find_resume_step(out, k, fp) if resume else None
    group = InProcessGroup(k)
    results, errors = [None] * k, []

    def target(rank):
        try:
            comm = group.comm(rank)
            model = models[rank]
            flat = FlatParams(model)
            ctx = AlgoContext(rank=rank, world_size=k, seed=cfg.seed, steps_per_epoch=spe, total_steps=total,
                              batch_size=cfg.optim.batch_size, label_counts=counts)
            algo = build_algorithm(cfg, flat=flat, comm=comm, ctx=ctx)
            sk = None
            if cfg.skewscout.enabled:
                trav = ModelTraveler(rank=rank, world_size=k, model=model, flat=flat, comm=comm, train_x=ds.train_x,
                                     train_y=ds.train_y, local_indices=parts[rank],
                                     samples=cfg.skewscout.samples(k), seed=cfg.seed)
                sk = SkewScout(cfg=cfg.skewscout, algo=algo, traveler=trav, comm=comm, rank=rank, world_size=k,
                               model_bytes=flat.numel * 4, total_steps=total, seed=cfg.seed)
            cp = ck.Checkpointer(out, rank=rank, world_size=k, every_steps=cfg.reliability.checkpoint_every, fp=fp)

            def stop(tr):
                if stop_after is not None and tr.state.step == stop_after:
                    raise _Stop

            data = TrainData(train_x=ds.train_x, train_y=ds.train_y, test_x=ds.test_x, test_y=ds.test_y,
                             local_indices=parts[rank])
            schedule = Schedule(optim=cfg.optim, total_steps=total, steps_per_epoch=spe, eval_every=cfg.eval_every,
                                log_every=cfg.log_every, seed=cfg.seed)
            tr = Trainer(model=model, flat=flat, algo=algo, comm=comm, data=data, schedule=schedule, sink=Sink(),
                         skewscout=sk, step_hooks=(cp, stop))
            if step is not None:
                cp.restore(tr, step)
            tr.run()
            results[rank] = (flat.data.clone(), comm.ledger.rows(), sk.trajectory if sk else None)
        except _Stop:
            pass
        except BaseException as e:  # noqa: BLE001 -- re-raised below
            errors.append(e)
            group.abort(f"rank {rank} failed: {e!r}")

    threads = [threading.Thread(target=target, args=(r,)) for r in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a rank thread hung"
    if errors:
        raise errors[0]
    return results, step


COMMON = ["--dataset", "digits", "--model", "mlp", "--batch-size", "8", "--lr", "0.05", "--lr-milestones", "0.2",
          "--steps", "20", "--eval-every", "7", "--log-every", "3", "--partition", "label", "--checkpoint-every", "6"]
CASES = {
    "bsp": ["--algo", "bsp"],
    "local": ["--algo", "local"],
    "gaia": ["--algo", "gaia", "--t0", "0.02"],
    "dgc": ["--algo", "dgc", "--e-warm", "0.05", "--sparsity", "0.99"],
    "fedavg": ["--algo", "fedavg", "--iter-local", "4", "--client-fraction", "0.67"],
    "fedavgm": ["--algo", "fedavg", "--iter-local", "4", "--server-momentum", "0.9"],
    "fedprox": ["--algo", "fedavg", "--iter-local", "5", "--prox-mu", "0.1"],
    "fedir": ["--algo", "fedavg", "--iter-local", "4", "--fedir"],
    "fedvc": ["--algo", "fedavg", "--virtual-client-size", "20", "--client-fraction", "0.67"],
    "iwds": ["--algo", "fedavg", "--iter-local", "4", "--iwds", "0.9,0.1,0.5"],
    "iwds-resample": ["--algo", "fedavg", "--iter-local", "4", "--iwds", "0.9,0.1,0.5", "--iwds-mode", "resample"],
    "fednova": ["--algo", "fedavg", "--fednova", "--local-epochs", "0.05", "--client-fraction", "0.67",
                "--momentum", "0.9"],
    "gaia+skewscout": ["--algo", "gaia", "--skewscout", "--travel-every", "4", "--travel-samples", "30"],
    "fedavg+skewscout": ["--algo", "fedavg", "--iter-local", "3", "--skewscout", "--travel-every", "5",
                         "--travel-samples", "30"],
}


@pytest.mark.parametrize("name", list(CASES))
def test_stopped_and_resumed_run_equals_uninterrupted(tmp_path, name):
    """Stop after step 15 (checkpoints at 6 and 12: steps 13-15 are redone) and resume: weights bit for
    bit, every ledger row (bytes, messages) and the SkewScout trajectory equal the uninterrupted run's."""
    k = 3
    cfg = parse_config([*COMMON, *CASES[name]])
    full, _ = _run(cfg, k, tmp_path / "full")
    stopped, _ = _run(cfg, k, tmp_path / "cut", stop_after=15)
    assert stopped == [None] * k
    assert ck.list_steps(tmp_path / "cut", 0) == [12]        # the older checkpoint was dropped after the barrier
    resumed, step = _run(cfg, k, tmp_path / "cut", resume=True)
    assert step == 12
    for r in range(k):
        (w_full, rows_full, traj_full), (w_res, rows_res, traj_res) = full[r], resumed[r]
        assert torch.equal(w_full, w_res), f"rank {r}: weights differ after resume"
        assert rows_full == rows_res, f"rank {r}: ledger differs"
        assert traj_full == traj_res
    if name == "bsp":  # by hand: a ring all-reduce makes the K ranks send 2(K-1) x n elements in all; 20 steps
        n = full[0][0].numel()
        assert sum(r["bytes"] for _, rows, _ in resumed for r in rows) == 20 * 2 * (k - 1) * n * 4


def test_resume_rejects_other_settings(tmp_path):
    cfg = parse_config([*COMMON, *CASES["gaia"]])
    _run(cfg, 2, tmp_path, stop_after=7)
    other = parse_config([*COMMON, "--algo", "gaia", "--t0", "0.05"])
    with pytest.raises(ValueError, match=r"gaia.t0=0.02 but this run has gaia.t0=0.05; resume with the same --t0"):
        ck.find_resume_step(tmp_path, 2, ck.fingerprint(other, 2))
    with pytest.raises(ValueError, match="world_size=2 but this run has world_size=3"):
        ck.find_resume_step(tmp_path, 3, ck.fingerprint(cfg, 3))


@pytest.mark.integration
def test_torchrun_sigkill_and_restart_equals_uninterrupted(tmp_path):
    """Issue 10: SIGKILL one rank of a 3-rank Gaia+SkewScout run mid-way (after step 23; checkpoints
    every 10) under torchrun --max-restarts 1: the restarted run resumes from step 20 and finishes
    with every rank's weights bit-identical to an uninterrupted run and the same ledger totals."""
    from tests.support.procs import run_torchrun
    argv = ["--dataset", "digits", "--model", "logreg", "--no-progress", "--wan", "virtual", "--algo", "gaia", "--t0",
            "0.05", "--partition", "label", "--steps", "30", "--eval-every", "15", "--log-every", "5", "--skewscout",
            "--travel-every", "10", "--travel-samples", "50", "--checkpoint-every", "10", "--peer-timeout-s", "10"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    r = run_torchrun(3, [*argv, "--out", str(full)], timeout_s=240)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_torchrun(3, [*argv, "--out", str(cut)], timeout_s=300, extra_torchrun=["--max-restarts", "1"],
                     env={"GEODML_FAULT": "rank=1,step=23,how=kill"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "GEODML_FAULT: rank 1 dies after step 23" in r.stderr and "resumed from step 20" in r.stdout
    for k in range(3):
        a = torch.load(full / f"rank{k}" / "model.pt", weights_only=True)
        b = torch.load(cut / f"rank{k}" / "model.pt", weights_only=True)
        assert all(torch.equal(a[n], b[n]) for n in a), f"rank {k}"
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (full, cut))
    for key in ("wan_bytes_total", "wan_bytes_by_kind", "wan_bytes_by_link", "messages_total", "steps",
                "final_val_accuracy", "theta_trajectory"):
        assert sa[key] == sb[key], key
    steps = [[json.loads(line)["step"] for line in (d / "metrics.jsonl").read_text().splitlines()] for d in (full, cut)]
    assert steps[0] == steps[1]  # the lines of the redone steps 21-23 are not duplicated


def test_resumed_run_wall_seconds_count_the_time_before_the_checkpoint(tmp_path):
    """summary.json's wall_seconds of a resumed run is the training wall time its checkpoint recorded plus
    the resumed process's time (it was the resumed process's alone): checkpoints whose wall_s says 1000 s
    give a summary of at least 1000 s after a resume that takes a few seconds."""
    from geodml.cli import main
    argv = ["--dataset", "digits", "--model", "logreg", "--partition", "label", "--steps", "30", "--eval-every", "15",
            "--log-every", "10", "--no-progress", "--wan", "virtual", "--partitions", "3", "--algo", "fedavg",
            "--iter-local", "5", "--checkpoint-every", "10", "--out", str(tmp_path)]
    assert main(argv) == 0
    first = json.loads((tmp_path / "summary.json").read_text())["wall_seconds"]
    assert 0 < first < 60
    files = sorted(tmp_path.glob("rank*/ckpt-*.pt"))
    assert [f.name for f in files] == ["ckpt-00000020.pt"] * 3
    for f in files:
        state = torch.load(f, weights_only=True)
        state["wall_s"] = 1000.0
        torch.save(state, f)
    (tmp_path / "summary.json").unlink()
    assert main([*argv, "--resume"]) == 0
    wall = json.loads((tmp_path / "summary.json").read_text())["wall_seconds"]
    assert 1000.0 < wall < 1060.0, wall
    last = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["step"] == 30 and 1000.0 < last["wall_s"] <= wall
