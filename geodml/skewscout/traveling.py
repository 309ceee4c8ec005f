"""Model traveling: estimate the accuracy loss between partitions (Quagmire §7.1-7.2).

Every travel round each partition k sends its current model (weights and BatchNorm buffers)
to one remote partition over the ZeroMQ transport (kind ``travel``). The pairing is a seeded
rotation: in round r partition k sends to (k + s) mod K and receives from (k - s) mod K with
shift s = 1 + (r + offset) mod (K-1), offset drawn once from the run seed, so every ordered
pair is visited once every K-1 rounds and every partition hosts exactly one visitor per round.

The host evaluates the visitor on a random subset of its own training data (``samples``
examples, seeded by round; SkewScoutConfig.samples sizes it for a target standard error) and
returns the count correct and the count evaluated (kind ``control``, two float32: 8 B, charged
to the ledger like every travel byte). The sender evaluates its own model on a same-size random
subset of its own data; the accuracy loss is AL_k = local_k - remote_k, and its sampling variance
is that of a difference of two independent binomial proportions,

    Var(AL_k) = v(x_l, n_l) + v(x_r, n_r),   v(x, n) = p~(1 - p~) / n,   p~ = (x + 1) / (n + 2)

(p~ the add-one estimate, so a trip that gets every example right still reports a non-zero
error). Evaluation is in eval mode (BatchNorm uses the model's running statistics), so both
sides measure the same function.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from geodml.algorithms.base import FlatParams, copy_array_into

if TYPE_CHECKING:
    from geodml.comm.api import Comm


def accuracy_variance(correct: int, n: int) -> float:
    """Sampling variance of an accuracy measured as ``correct`` of ``n`` (add-one estimate, module docstring)."""
    assert 0 <= correct <= n and n >= 1
    p = (correct + 1) / (n + 2)
    return p * (1 - p) / n


class ModelTraveler:
    def __init__(self, *, rank: int, world_size: int, model: nn.Module, flat: FlatParams, comm: Comm,
                 train_x: torch.Tensor, train_y: torch.Tensor, local_indices: np.ndarray, samples: int,
                 seed: int, visitor: tuple[nn.Module, FlatParams] | None = None) -> None:
        assert world_size >= 2, "the preflight refuses --skewscout with fewer than 2 partitions"
        self.rank, self.world_size = rank, world_size
        self.model, self.flat, self.comm = model, flat, comm
        self.train_x, self.train_y = train_x, train_y
        self.local_indices = np.asarray(local_indices, dtype=np.int64)
        self.samples = min(int(samples), len(self.local_indices))
        self.seed = seed
        self.offset = int(np.random.default_rng([seed, 0x7EA]).integers(world_size - 1))
        # The visitor lives in a preallocated copy of the model (``visitor``: one that partitions hosted
        # by one process share; a visitor is received and evaluated with no wait in between).
        if visitor is None:
            model_copy = copy.deepcopy(model)
            visitor = (model_copy, FlatParams(model_copy))
        self.visitor, self.visitor_flat = visitor
        self.acc_buf = np.zeros(2, dtype=np.float32)  # (correct, evaluated): exact integers below 2**24

    def partners(self, round_: int) -> tuple[int, int]:
        """(destination, source) of this partition's model exchange in ``round_``."""
        k = self.world_size
        shift = 1 + (round_ + self.offset) % (k - 1)
        return (self.rank + shift) % k, (self.rank - shift) % k

    def _subset(self, round_: int, salt: int) -> torch.Tensor:
        rng = np.random.default_rng([self.seed, self.rank, round_, salt])
        idx = rng.choice(self.local_indices, size=self.samples, replace=False)
        return torch.from_numpy(np.sort(idx)).to(self.train_x.device)

    @torch.no_grad()
    def _correct(self, model: nn.Module, idx: torch.Tensor) -> int:
        was = model.training
        model.eval()
        correct = int((model(self.train_x[idx]).argmax(1) == self.train_y[idx]).sum())
        model.train(was)
        return correct

    def travel(self, round_: int, step: int) -> dict[str, float]:
        """One travel round; returns local and remote accuracy, AL and AL's sampling variance for this
        partition's model (and the partners)."""
        dst, src = self.partners(round_)
        payload = [self.flat.data, *self.flat.float_buffers]
        self.comm.send(dst, "travel", payload, step=step)
        arrays = self.comm.recv(src, "travel", step=step)
        copy_array_into(self.visitor_flat.data, arrays[0])
        for b, a in zip(self.visitor_flat.float_buffers, arrays[1:]):
            copy_array_into(b, a)
        self.acc_buf[0], self.acc_buf[1] = self._correct(self.visitor, self._subset(round_, 1)), self.samples
        self.comm.send(src, "control", [self.acc_buf], step=step)
        local_correct = self._correct(self.model, self._subset(round_, 2))
        reply = self.comm.recv(dst, "control", step=step)[0]
        remote_correct, remote_n = int(round(float(reply[0]))), int(round(float(reply[1])))
        local, remote = local_correct / self.samples, remote_correct / remote_n
        var = accuracy_variance(local_correct, self.samples) + accuracy_variance(remote_correct, remote_n)
        return {"local_accuracy": local, "remote_accuracy": remote, "accuracy_loss": local - remote,
                "accuracy_loss_var": var, "dst": dst, "src": src}
