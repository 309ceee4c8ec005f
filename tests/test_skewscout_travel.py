"""Model traveling across 3 processes with constructed partitions whose accuracy loss is known,
travel bytes = model size x trips, and the controller's decision applied on every rank."""

import json
import sys

import numpy as np
import pytest

from tests.support.procs import run_command, run_torchrun, run_workers

C = 3  # classes = partitions


def _travel_worker(rank, world, mode, rounds):
    import torch

    from geodml.algorithms.base import FlatParams
    from geodml.comm import build_comm
    from geodml.config import CommConfig
    from geodml.skewscout.traveling import ModelTraveler

    comm = build_comm(CommConfig(wan="off"), rank=rank, world_size=world)
    try:
        # Data: one-hot inputs x = e_y; partition k holds only label k (disjoint labels).
        n = 30
        y = torch.arange(C).repeat_interleave(n)
        x = torch.eye(C)[y]
        model = torch.nn.Linear(C, C)
        flat = FlatParams(model)
        with torch.no_grad():
            if mode == "specialized":
                # predicts its own label whatever the input: right at home, wrong everywhere else
                model.weight.zero_()
                model.bias.zero_()
                model.bias[rank] = 1.0
            else:
                # the identity classifier is right on every partition
                model.weight.copy_(torch.eye(C))
                model.bias.zero_()
        local = np.flatnonzero(y.numpy() == rank)
        t = ModelTraveler(rank=rank, world_size=world, model=model, flat=flat, comm=comm, train_x=x, train_y=y,
                          local_indices=local, samples=10, seed=4)
        out = [t.travel(r, step=100 * (r + 1)) for r in range(rounds)]
        return {"results": out, "rows": comm.ledger.rows(), "numel": flat.numel}
    finally:
        comm.close()


@pytest.mark.integration
@pytest.mark.parametrize("mode,expected_al", [("specialized", 1.0), ("general", 0.0)])
def test_accuracy_loss_known_for_constructed_partitions(mode, expected_al):
    rounds = 4
    res = run_workers("tests.test_skewscout_travel:_travel_worker", 3, timeout_s=90, mode=mode, rounds=rounds)
    for rank, r in enumerate(res):
        for rr in r["results"]:
            assert rr["local_accuracy"] == 1.0
            assert rr["accuracy_loss"] == pytest.approx(expected_al)
            # 10 of 10 (or 0 of 10) on each side: p~ = 11/12 (1/12), v = (11/12)(1/12)/10 = 11/1440, twice
            assert rr["accuracy_loss_var"] == pytest.approx(22 / 1440)
            assert rr["dst"] != rank and rr["src"] != rank
    # seeded rotation: with K=3 the shifts alternate 1, 2, so each partition visits both others
    for rank, r in enumerate(res):
        assert {rr["dst"] for rr in r["results"]} == {(rank + 1) % 3, (rank + 2) % 3}
    # the traveled model's bytes: every trip carries the 3x3 weight + 3 bias floats (12 x 4 B
    # = 48 B of payload) plus one envelope; control replies carry two float32 (correct, evaluated) + envelope
    for r in res:
        travel = [row for row in r["rows"] if row["kind"] == "travel"]
        assert sum(row["messages"] for row in travel) == rounds
        payload = r["numel"] * 4
        overhead = sum(row["bytes"] for row in travel) - rounds * payload
        assert r["numel"] == 12 and 0 < overhead <= rounds * 200  # envelope bytes only


def _trajectory(out):
    return [t["theta"] for t in json.loads((out / "summary.json").read_text())["theta_trajectory"]]


@pytest.mark.parametrize("partition,direction", [(["--partition", "label", "--skew", "1.0"], "tighter"),
                                                  (["--partition", "iid"], "looser")])
@pytest.mark.integration
def test_gaia_skewscout_end_to_end(tmp_path, partition, direction):
    """Same start (T0 = 10%): 100% non-IID partitions diverge (high AL) and SkewScout tightens T0;
    IID partitions agree (AL ~ 0) and it loosens T0. Travel bytes = model bytes x trips + envelopes."""
    import msgpack

    from geodml.comm.wire import PROTOCOL_VERSION
    # 40 steps before the first decision (barely trained models disagree even on IID data) and
    # 300 evaluation samples (AL's sampling noise is about +-0.03 with 100)
    k, every, steps, out = 3, 40, 120, tmp_path / "run"
    r = run_torchrun(k, ["--dataset", "digits", "--model", "cnn", "--algo", "gaia", "--t0", "0.1", "--skewscout",
                         "--travel-every", str(every), "--travel-samples", "300", "--steps", str(steps), "--no-progress",
                         "--wan", "off",
                         "--eval-every", "1000", "--out", str(out), *partition], timeout_s=180)
    assert r.returncode == 0, r.stderr[-3000:]
    traj = _trajectory(out)
    assert traj[0] == 0.1 and len(traj) == 1 + steps // every
    if direction == "tighter":
        assert traj[1] < 0.1 and min(traj) <= 0.05
    else:
        assert traj[1] > 0.1 and traj[-1] >= 0.3
    s = json.loads((out / "summary.json").read_text())
    numel = 188_810  # the CNN on 8x8 digits
    expected = 0
    for step in range(every, steps + 1, every):
        for src in range(k):
            env = len(msgpack.packb([PROTOCOL_VERSION, "travel", step, src, 0.0, [["<f4", [numel]]]]))
            expected += env + 4 * numel
    assert s["wan_bytes_by_kind"]["travel"] == expected
    decisions = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if "accuracy_loss" in x]
    assert len(decisions) == steps // every and all(len(d["accuracy_loss_per_partition"]) == k for d in decisions)


@pytest.mark.integration
def test_backoff_end_to_end_hosted(tmp_path):
    """IID digits, 3 hosted partitions in one process, T0 at the grid's loose end (0.5), --travel-every 10
    --travel-backoff 4: every decision comes one interval after the last, the interval doubles after a settled
    decision (up to 40) and returns to 10 after any other; AL stays near 0 on IID data, so some decisions settle.
    (The schedule on scripted AL values is worked out by hand in tests/test_skewscout_backoff.py.) Travel bytes
    are 3 trips a decision, each an envelope plus the model."""
    import msgpack

    from geodml.comm.wire import PROTOCOL_VERSION
    k, steps, out = 3, 170, tmp_path / "run"
    r = run_command([sys.executable, "-m", "geodml", "--partitions", str(k), "--dataset", "digits", "--model", "cnn",
                     "--algo", "gaia", "--t0", "0.5", "--skewscout", "--travel-every", "10", "--travel-backoff", "4",
                     "--travel-samples", "300", "--steps", str(steps), "--no-progress", "--wan", "off",
                     "--eval-every", "1000", "--out", str(out)], timeout_s=240)
    assert r.returncode == 0, r.stderr[-3000:]
    decisions = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if "accuracy_loss" in x]
    steps_at = [d["step"] for d in decisions]
    assert steps_at[0] == 10 and decisions[0]["skewscout_interval_steps"] == 10
    for d, nxt in zip(decisions, decisions[1:] + [None]):
        want = min(2 * d["skewscout_interval_steps"], 40) if d["skewscout_settled"] else 10
        assert d["skewscout_next_interval_steps"] == want, d
        if nxt is not None:
            assert nxt["step"] == d["step"] + want and nxt["skewscout_interval_steps"] == want
    assert any(d["skewscout_settled"] for d in decisions) and len(decisions) < steps // 10
    s = json.loads((out / "summary.json").read_text())
    assert s["skewscout_rounds"] == len(decisions) and s["skewscout_travel_backoff"] == 4
    numel = 188_810  # the CNN on 8x8 digits
    expected = sum(len(msgpack.packb([PROTOCOL_VERSION, "travel", step, src, 0.0, [["<f4", [numel]]]])) + 4 * numel
                   for step in steps_at for src in range(k))
    assert s["wan_bytes_by_kind"]["travel"] == expected
