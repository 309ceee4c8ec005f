"""SkewScout (Quagmire §7): model traveling + communication control, run every travel interval.

``SkewScout.maybe_run(step)`` is called by the trainer after every step on every rank. At
each multiple of the travel interval (``SkewScoutConfig.interval_steps``: ``--travel-every``
steps, or the run's steps / ``--travel-decisions``; with ``--travel-backoff F`` the interval
doubles after each settled decision, up to F times, and rank 0 broadcasts it with theta) it (1) travels models
(geodml.skewscout.traveling), (2) sends each partition's accuracy loss, its sampling variance
and the algorithm bytes it sent during the interval to rank 0 (kind ``control``, 24 B each),
(3) rank 0's controller (geodml.skewscout.controller) pools the mean accuracy loss with its
standard error, sqrt(sum_k Var(AL_k)) / K, and picks the next theta from the total bytes,
(4) rank 0 broadcasts it (kind ``control``) and every rank applies it through ``algorithm.knob``
at the same step. The knob's values are ``--skewscout-grid`` when given (ordered like the
algorithm's grid), else the algorithm's own grid. Every travel and control byte is charged to
the ledger (so to ``wan_bytes_total``); only the algorithm's own kinds count as C(theta).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from geodml.skewscout.controller import Controller, Decision, comm_ratio_for
from geodml.skewscout.traveling import ModelTraveler

if TYPE_CHECKING:
    from geodml.algorithms.base import Algorithm
    from geodml.comm.api import Comm
    from geodml.config import SkewScoutConfig

# Traffic that is the algorithm's own (what theta controls); travel/control are SkewScout's.
ALGORITHM_KINDS = ("gradient", "update", "model")


class SkewScout:
    def __init__(self, *, cfg: SkewScoutConfig, algo: Algorithm, traveler: ModelTraveler, comm: Comm, rank: int,
                 world_size: int, model_bytes: int, total_steps: int, seed: int) -> None:
        assert algo.knob is not None, "RunConfig refuses --skewscout for an algorithm without a knob"
        self.cfg, self.knob, self.traveler, self.comm = cfg, algo.knob, traveler, comm
        self.rank, self.world_size = rank, world_size
        self.travel_every = cfg.interval_steps(total_steps)
        """The cadence: steps between decisions (the first is at this step)."""
        self.backoff = cfg.travel_backoff
        self.interval = self.travel_every
        """Steps from the last decision to the next: the cadence, or up to ``backoff`` times it while settled."""
        self.next_at = self.travel_every
        self.rounds = 0
        self.last_bytes = 0
        grid = self.knob.with_grid(cfg.skewscout_grid).grid
        # CM: the whole model from every partition to every other one, every step of the interval
        full_exchange = self.travel_every * world_size * (world_size - 1) * model_bytes
        # the pool spans one rotation of the travel pairs (K-1 rounds visit every ordered pair once), at least 2
        self.controller = Controller(grid, self.knob.get(), model_exchange_bytes=full_exchange,
                                     lambda_al=cfg.lambda_al, lambda_c=cfg.lambda_c, sigma_al=cfg.sigma_al,
                                     search=cfg.search, comm_ratio=comm_ratio_for(grid), confidence=cfg.al_confidence,
                                     window=max(2, world_size - 1), seed=seed)
        # start from the grid point nearest to the configured knob
        self.knob.set(self.controller.theta)
        self.trajectory: list[dict] = [{"step": 0, "theta": self.controller.theta}]
        self.msg = np.zeros(3, dtype=np.float64)  # (AL_k, Var(AL_k), algorithm bytes of the interval)
        # rank 0's decision: theta, and with a back-off the next interval (a fixed cadence sends theta alone)
        self.theta_t = torch.zeros(1 if self.backoff == 1 else 2, dtype=torch.float64)

    def _algorithm_bytes(self) -> int:
        return sum(r["bytes"] for r in self.comm.ledger.rows() if r["kind"] in ALGORITHM_KINDS)

    def maybe_run(self, step: int) -> dict | None:
        """Run SkewScout if ``step`` (steps done so far) ends a travel interval; return its record."""
        if step == 0 or step != self.next_at:
            return None
        res = self.traveler.travel(self.rounds, step)
        self.rounds += 1
        total = self._algorithm_bytes()
        interval_bytes, self.last_bytes = total - self.last_bytes, total
        self.msg[:] = (res["accuracy_loss"], res["accuracy_loss_var"], interval_bytes)
        interval = self.interval
        record: dict = {}
        if self.rank == 0:
            als, variances, byts = [res["accuracy_loss"]], [res["accuracy_loss_var"]], [interval_bytes]
            for src in range(1, self.world_size):
                arr = self.comm.recv(src, "control", step=step)[0]
                als.append(float(arr[0]))
                variances.append(float(arr[1]))
                byts.append(int(arr[2]))
            se = math.sqrt(sum(variances)) / len(als)  # of the mean of K independent partitions' AL
            # C(theta) per cadence interval, as CM is: a stretched interval's bytes scaled back
            c = sum(byts) if interval == self.travel_every else round(sum(byts) * self.travel_every / interval)
            d: Decision = self.controller.decide(float(np.mean(als)), int(c), se)
            self.theta_t[0] = d.theta_after
            if self.backoff > 1:
                self.theta_t[1] = min(2 * interval, self.backoff * self.travel_every) if d.settled else self.travel_every
            record = {"accuracy_loss": d.accuracy_loss, "accuracy_loss_se": d.accuracy_loss_se,
                      "accuracy_loss_per_partition": als, "theta_before": d.theta_before, "theta": d.theta_after,
                      "skewscout_bytes_interval": d.bytes_interval, "skewscout_pooled": d.pooled,
                      "skewscout_objective": {str(k): v for k, v in d.objective.items()},
                      "skewscout_estimated": d.estimated}
            if self.backoff > 1:
                record.update(skewscout_interval_steps=interval, skewscout_settled=d.settled,
                              skewscout_next_interval_steps=int(self.theta_t[1]))
        else:
            self.comm.send(0, "control", [self.msg], step=step)
        self.comm.broadcast(self.theta_t, 0, "control")
        theta = float(self.theta_t[0])
        if theta != self.knob.get():
            self.knob.set(theta)
        if self.backoff > 1:
            self.interval = int(self.theta_t[1])
        self.next_at = step + self.interval
        self.trajectory.append({"step": step, "theta": theta})
        return record

    def summary(self) -> dict:
        out = {"theta_trajectory": self.trajectory, "skewscout_rounds": self.rounds,
               "skewscout_travel_every": self.travel_every}
        if self.backoff > 1:
            out["skewscout_travel_backoff"] = self.backoff
        return out

    def state_dict(self) -> dict:
        return {"rounds": self.rounds, "last_bytes": self.last_bytes, "trajectory": list(self.trajectory),
                "controller": self.controller.state_dict(), "interval": self.interval, "next_at": self.next_at}

    def load_state_dict(self, s: dict) -> None:
        self.rounds, self.last_bytes = int(s["rounds"]), int(s["last_bytes"])
        # checkpoints written before --travel-backoff: a fixed cadence, the next decision one interval on
        self.interval = int(s.get("interval", self.travel_every))
        self.next_at = int(s.get("next_at", (self.rounds + 1) * self.travel_every))
        self.trajectory = list(s["trajectory"])
        self.controller.load_state_dict(s["controller"])


__all__ = ["SkewScout", "Controller", "ModelTraveler"]
