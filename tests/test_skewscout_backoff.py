"""SkewScout's ``--travel-backoff``: the decision cadence stretches while theta is settled.

Rank 0's SkewScout driven step by step with a scripted traveler (the accuracy loss each trip
reports) and a fake Comm (the other partitions' reports, the ledger's algorithm bytes), so the
decision steps, the intervals, the bytes the controller sees and the checkpoint round trip are
checked against schedules worked out by hand. Grid = Gaia's T0 grid, start 0.10, K = 2, cadence
10 steps; AL_k var 1e-6 (SE of the mean 0.0007), so bounds sit within 0.002 of the mean.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geodml.algorithms.knob import KnobSpec
from geodml.config import SkewScoutConfig
from geodml.skewscout import SkewScout

GRID = (0.02, 0.05, 0.10, 0.20, 0.30, 0.40, 0.50)
BYTES_PER_STEP = 100  # the algorithm's bytes per step and partition in the fake ledger


class FakeLedger:
    def __init__(self) -> None:
        self.bytes = 0

    def rows(self) -> list[dict]:
        return [{"kind": "update", "bytes": self.bytes}, {"kind": "travel", "bytes": 10**9}]


class FakeComm:
    """Rank 0 of K = 2: rank 1 reports the same AL as rank 0 and the same bytes."""

    def __init__(self, script: list[float]) -> None:
        self.ledger = FakeLedger()
        self.script = script
        self.trip = 0
        self.broadcasts: list[int] = []

    own: np.ndarray
    """Rank 0's own report (AL, var, interval bytes); rank 1 reports the same."""

    def recv(self, src: int, kind: str, *, step: int) -> list[np.ndarray]:
        return [self.own.copy()]

    def broadcast(self, t: torch.Tensor, src: int, kind: str) -> None:
        self.broadcasts.append(t.numel())


class FakeTraveler:
    def __init__(self, comm: FakeComm) -> None:
        self.comm = comm

    def travel(self, rounds: int, step: int) -> dict:
        self.comm.trip += 1
        return {"accuracy_loss": self.comm.script[self.comm.trip - 1], "accuracy_loss_var": 1e-6}


class FakeAlgo:
    def __init__(self) -> None:
        self.t0 = 0.10
        self.knob = KnobSpec("t0", GRID).bind(get=lambda: self.t0, set=self._set)

    def _set(self, v: float) -> None:
        self.t0 = float(v)


def scout(script: list[float], backoff: int, total_steps: int = 400) -> tuple[SkewScout, FakeComm, FakeAlgo]:
    comm = FakeComm(script)
    algo = FakeAlgo()
    cfg = SkewScoutConfig(enabled=True, travel_every=10, travel_backoff=backoff)
    s = SkewScout(cfg=cfg, algo=algo, traveler=FakeTraveler(comm), comm=comm, rank=0, world_size=2,  # type: ignore[arg-type]
                  model_bytes=1000, total_steps=total_steps, seed=0)
    comm.own = s.msg
    return s, comm, algo


def drive(s: SkewScout, comm: FakeComm, steps: range) -> list[dict]:
    """Steps done 1..n; the fake ledger grows by BYTES_PER_STEP each step; the records of the decisions."""
    out = []
    for step in steps:
        comm.ledger.bytes += BYTES_PER_STEP
        rec = s.maybe_run(step)
        if rec is not None:
            out.append({"step": step, **rec})
    return out


def test_fixed_cadence_is_the_paper_and_sends_theta_alone():
    s, comm, _ = scout([0.0] * 40, backoff=1)
    recs = drive(s, comm, range(1, 101))
    assert [r["step"] for r in recs] == list(range(10, 101, 10))
    assert set(comm.broadcasts) == {1}  # theta only: the bytes of a fixed cadence are unchanged
    assert "skewscout_interval_steps" not in recs[0] and "skewscout_travel_backoff" not in s.summary()


def test_settled_decisions_double_the_interval_up_to_the_cap_and_a_move_resets_it():
    # AL 0 throughout: loosen 0.10 -> 0.20 -> 0.30 -> 0.40 -> 0.50 (one trip each: n = 1, never settled),
    # then at the grid's end: trip 1 at 0.50 (n = 1: not settled, interval stays 10), trip 2 (n = 2, hi < 0.05:
    # settled -> 20), 3 -> 40, 4 -> 80 (cap 8 x 10), 5 -> 80 ...
    s, comm, algo = scout([0.0] * 40, backoff=8)
    recs = drive(s, comm, range(1, 401))
    steps = [r["step"] for r in recs]
    assert steps == [10, 20, 30, 40, 50, 60, 80, 120, 200, 280, 360]
    assert [r["theta"] for r in recs[:4]] == [0.20, 0.30, 0.40, 0.50] and algo.t0 == 0.50
    assert [r["skewscout_settled"] for r in recs] == [False] * 5 + [True] * 6
    assert [r["skewscout_next_interval_steps"] for r in recs] == [10] * 5 + [20, 40, 80, 80, 80, 80]
    assert set(comm.broadcasts) == {2}
    # C(theta) per cadence interval: the 40-step interval sent 2 partitions x 40 x 100 B, scaled by 10/40
    at120 = recs[7]
    assert at120["skewscout_interval_steps"] == 40 and at120["skewscout_bytes_interval"] == 2 * 10 * BYTES_PER_STEP
    assert s.summary()["skewscout_travel_backoff"] == 8


def test_a_rise_in_accuracy_loss_returns_to_the_cadence():
    # settled at 0.50 as above until the 9th trip (step 200); trip 10 at step 280 reports AL 0.30: the pool
    # (window 2 at K = 2: trips 9 and 10, AL 0 and 0.30) has mean 0.15 and SE = sd / sqrt(2) = 0.15, so its
    # bounds (-0.097, 0.397) straddle sigma_AL. Theta stays (0.40's memo costs the same bytes: a tie keeps the
    # current), the decision is not settled, and the next one comes one cadence (10 steps) later.
    script = [0.0] * 9 + [0.30] + [0.30] * 10
    s, comm, _ = scout(script, backoff=8)
    recs = drive(s, comm, range(1, 301))
    assert [r["step"] for r in recs][:11] == [10, 20, 30, 40, 50, 60, 80, 120, 200, 280, 290]
    r10 = recs[9]
    assert r10["accuracy_loss"] == pytest.approx(0.30) and not r10["skewscout_settled"]
    assert r10["skewscout_next_interval_steps"] == 10


def test_checkpoint_round_trip_keeps_the_schedule():
    s, comm, _ = scout([0.0] * 40, backoff=8)
    drive(s, comm, range(1, 121))  # last decision at 120, next at 200 (interval 80)
    state = s.state_dict()
    assert (state["interval"], state["next_at"]) == (80, 200)
    s2, comm2, _ = scout([0.0] * 40, backoff=8)
    s2.load_state_dict(state)
    comm2.trip, comm2.ledger.bytes = comm.trip, comm.ledger.bytes
    assert [r["step"] for r in drive(s2, comm2, range(121, 401))] == [200, 280, 360]
    # a checkpoint written before the back-off existed (a fixed cadence, no schedule in it) resumes at the next
    # multiple of the cadence, as the old `step % travel_every` rule did
    f, commf, _ = scout([0.0] * 40, backoff=1)
    drive(f, commf, range(1, 121))
    old = {k: v for k, v in f.state_dict().items() if k not in ("interval", "next_at")}
    assert old["rounds"] == 12
    s3, comm3, _ = scout([0.0] * 40, backoff=1)
    s3.load_state_dict(old)
    comm3.trip, comm3.ledger.bytes = commf.trip, commf.ledger.bytes
    assert [r["step"] for r in drive(s3, comm3, range(121, 151))] == [130, 140, 150]


def test_bad_backoff_is_refused():
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="--travel-backoff"):
            SkewScoutConfig(travel_backoff=bad)
