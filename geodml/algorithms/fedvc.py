"""FedVC: federated virtual clients (Hsu, Qi & Brown 2020, "Federated visual classification with
real-world data distribution", Section 5.3).

Every selected partition trains on exactly N_VC examples per round, resampled uniformly from
its n_k examples -- without replacement when n_k >= N_VC, with replacement otherwise -- and a
partition's chance to be selected is proportional to its size (instead of uniform). All
virtual clients have the same size, so the participants are averaged with equal weights.

Mapping onto the trainer: a round is ``ceil(N_VC / B)`` trainer steps (B = --batch-size; it
replaces --iter-local). Round t's draw comes from ``default_rng([seed, rank, t, 0xFEDC])``.
When B does not divide N_VC, the last minibatch is padded with repeats of the round's first
examples whose loss weight is 0, and the valid ones are reweighted so that the loss is their
mean: exactly N_VC examples contribute per round. (With BatchNorm, the padded examples still
enter that one minibatch's batch statistics.)

Selection "proportional to size" is made exact for m > 1 participants: inclusion
probabilities ``pi_k = m * n_k / N`` (capped at 1, the excess redistributed over the rest) and
systematic PPS sampling over a random order of the partitions (Madow 1949): one uniform u
selects the partitions whose cumulative-pi interval contains u, u+1, ..., u+m-1; each is
included with probability exactly pi_k, never twice. Seeded by (seed, round): identical on
every rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from geodml.algorithms.base import BatchSource
from geodml.algorithms.fedavg import ITER_LOCAL, FedAvg, local_steps, num_participants
from geodml.algorithms.knob import KnobSpec

_SELECT_TAG = 0xFEDB
_DRAW_TAG = 0xFEDC


def pps_inclusion_probabilities(sizes: np.ndarray, m: int) -> np.ndarray:
    """pi_k proportional to size with sum m and every pi_k <= 1 (capped units get exactly 1)."""
    n = np.asarray(sizes, dtype=np.float64)
    if not 1 <= m <= np.count_nonzero(n):
        raise ValueError(f"cannot select {m} of {np.count_nonzero(n)} non-empty partitions")
    capped = np.zeros(len(n), dtype=bool)
    while True:
        pi = np.ones(len(n))
        free = ~capped
        pi[free] = (m - capped.sum()) * n[free] / n[free].sum()
        over = free & (pi > 1.0)
        if not over.any():
            return pi
        capped |= over


def systematic_pps_sample(pi: np.ndarray, rng: np.random.Generator) -> tuple[int, ...]:
    """Sorted sample of m = sum(pi) distinct units, unit k included with probability pi_k."""
    m = int(round(float(pi.sum())))
    order = rng.permutation(len(pi))
    edges = np.cumsum(pi[order])
    edges[-1] = m                                 # exact end: the last point u + m - 1 < m always lands
    points = rng.random() + np.arange(m)
    return tuple(sorted(int(order[i]) for i in np.searchsorted(edges, points, side="right")))


class FedVC(FedAvg):
    name = "fedvc"

    def __init__(self, *, virtual_client_size: int, **kw: Any) -> None:
        """N_VC >= 1 (RunConfig validated it; the builder picks FedVC only for N_VC > 0)."""
        ctx = kw["ctx"]
        self.batch = ctx.batch_size
        sizes = np.asarray(ctx.label_counts).sum(axis=1)
        m = num_participants(kw.get("client_fraction", 1.0), ctx.world_size)
        self.inclusion = pps_inclusion_probabilities(sizes, m)
        self._set_size(int(virtual_client_size))
        self.drawn_last_round = 0
        self.with_replacement = False
        super().__init__(**kw)

    def _set_size(self, n_vc: int) -> None:
        self.virtual_client_size = n_vc
        self.vc_steps = local_steps(n_vc, 1.0, self.batch)   # ceil(N_VC / B), one epoch of the virtual client
        self.vc_idx = np.empty(self.vc_steps * self.batch, dtype=np.int64)   # one round's minibatches

    # ---- round structure ---------------------------------------------------------------------
    def round_length(self) -> int:
        return self.vc_steps

    def select_partitions(self, round_index: int) -> tuple[int, ...]:
        if self.num_selected == self.ctx.world_size:
            return tuple(range(self.ctx.world_size))
        return systematic_pps_sample(self.inclusion, np.random.default_rng([self.ctx.seed, round_index, _SELECT_TAG]))

    def averaging_weights(self, selected: tuple[int, ...]) -> np.ndarray:
        return np.full(len(selected), 1.0 / len(selected))

    # ---- data --------------------------------------------------------------------------------
    def draw(self, indices: np.ndarray, round_index: int) -> None:
        """Fill the round's N_VC examples (then the zero-weight padding) from ``indices``."""
        n_vc = self.virtual_client_size
        rng = np.random.default_rng([self.ctx.seed, self.ctx.rank, round_index, _DRAW_TAG])
        self.with_replacement = len(indices) < n_vc
        self.vc_idx[:n_vc] = rng.choice(indices, size=n_vc, replace=self.with_replacement)
        pad = len(self.vc_idx) - n_vc
        self.vc_idx[n_vc:] = self.vc_idx[np.arange(pad) % n_vc]   # zero-weight filler (valid indices)
        self.drawn_last_round = n_vc

    def batch_indices(self, step: int, sampler: BatchSource) -> np.ndarray:
        j = self.steps_in_round
        if j == 0:
            self.draw(sampler.indices, self.round)
        return self.vc_idx[j * self.batch:(j + 1) * self.batch]

    def valid_in_batch(self) -> int:
        return min(self.batch, self.virtual_client_size - self.steps_in_round * self.batch)

    # ---- knob: N_VC, over Iter_Local's grid in examples (grid point x batch size) ------------------
    def knob_spec(self) -> KnobSpec:
        return KnobSpec("virtual_client_size", tuple(float(self.batch * g) for g in ITER_LOCAL.grid))

    def knob_value(self) -> float:
        return float(self.virtual_client_size)

    def apply_knob(self, value: float) -> None:
        self._set_size(int(value))

    # ---- checkpoint --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Adds N_VC (SkewScout may have changed it) and the current round's draw (a resume mid-round
        continues the same examples)."""
        return {**super().state_dict(), "virtual_client_size": self.virtual_client_size,
                "vc_idx": torch.from_numpy(self.vc_idx.copy()),
                "drawn_last_round": self.drawn_last_round, "with_replacement": self.with_replacement}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._set_size(int(state["virtual_client_size"]))   # before FedAvg's: round_length() reads it
        super().load_state_dict(state)
        self.vc_idx[:] = np.asarray(state["vc_idx"])
        self.drawn_last_round = int(state["drawn_last_round"])
        self.with_replacement = bool(state["with_replacement"])

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "fedvc_examples_per_round": float(self.drawn_last_round),
                "fedvc_with_replacement": float(self.with_replacement)}
