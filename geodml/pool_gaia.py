"""Gaia on the pool engine: a process's Gaia partitions as rows of state on one worker model.

Each hosted partition k keeps exactly its own state of Algorithm 1 (geodml.algorithms.gaia): its
weights w^k, its momentum u^k and its accumulated, not yet significant updates v^k, as rows of
three ``[h, n]`` matrices (h partitions in this process, n parameters). What a step needs besides
-- the model and its gradient, the minibatch, Gaia's selection and receive buffers -- is the
process's one worker: a :class:`~geodml.algorithms.gaia.Gaia` built on the worker's FlatParams,
shared by the partitions. Per partition that is 3n floats where the threads engine holds a model,
its gradient, about eight n-sized Gaia buffers and a thread.

A step:

1. for the hosted partitions in rank order: load w^k, u^k and v^k into the worker; forward,
   backward and weight decay on partition k's own minibatch (geodml.trainer.local_gradient, its
   own sampler); the local momentum-SGD update and line 7; the selection (lines 9-11) and the
   send of the significant updates to every other partition through k's own Comm
   (``Gaia.send_significant``; ``send`` copies the payload, so the worker's buffers are free
   when it returns); store the rows back;
2. for the hosted partitions in rank order: receive every other partition's update and add them
   in rank order to w^k (``Gaia.apply_received``, lines 13-15).

Every partition's Comm sees the calls the threads engine's thread makes, in the same order
(``advance_compute``, ``send_to_all``, ``recv_from_all``), so the ledger, the messages and the
emulated link seconds are the same; the arithmetic is the same operations on the same values in
the same order, so the weights, accuracies and metrics.jsonl are bit-identical to the threads
engine's (tests/test_pool.py). All sends of a step come before any receive, so one thread
cannot wait for itself; across processes every process does the same, and sends do not block.

Scope: what :func:`geodml.pool.pool_refusal` admits (no SkewScout, no checkpoints, no ``--wan
real``, no BatchNorm, the CPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from geodml import kernels
from geodml.pool import EveryStepPool, no_sample_weights

if TYPE_CHECKING:
    from geodml.algorithms.gaia import Gaia


class GaiaPool(EveryStepPool):
    """One process's block of Gaia partitions (module docstring). Build, then :meth:`run`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gaia: Gaia = self.algo  # type: ignore[assignment]
        h, n = len(self.hosted), self.n
        flat = self.gaia.flat
        self.W = flat.data.detach().clone().expand(h, n).contiguous()   # every partition starts at w_0
        self.U = torch.zeros((h, n), dtype=flat.data.dtype)
        self.V = torch.zeros((h, n), dtype=flat.data.dtype)
        self.sent_total = np.zeros(h, dtype=np.int64)                    # per-partition Gaia statistics
        self.last0 = (0, False, 0)  # partition 0's last (sent entries, dense, total): its stats() at log time
        self._rows_np = self.W.numpy() if kernels.compiled is not None else None  # W's storage, for the kernel

    def _stats(self) -> dict[str, float]:
        g = self.gaia
        g.sent_entries, g.sent_dense, g.sent_entries_total = self.last0
        return g.stats()

    def _current(self, k: int) -> torch.Tensor:
        return self.W[k - self.hosted.start]

    def _final_state(self, k: int) -> tuple[object, torch.Tensor]:
        return ("partition", k), self.W[k - self.hosted.start]

    def _load_global(self) -> None:
        """The partitions' average (Trainer._swap_in_global with models that differ)."""
        avg = self.group.sum_hosted([self._current(k) for k in self.hosted]).clone()
        avg.div_(self.P)
        self.w.load(avg, avg[:0])

    def _train_step(self, step: int, lr: float) -> None:
        from geodml.trainer import local_gradient
        gaia, w = self.gaia, self.w
        data, v = w.flat.data, gaia.v
        for i, k in enumerate(self.hosted):
            comm = self.comm(k)
            data.copy_(self.W[i])
            v.copy_(self.V[i])
            gaia.u = self.U[i]                          # local_update reads and writes u in place
            gaia.comm = comm
            gaia.sent_entries_total = int(self.sent_total[i])
            loss, correct, compute_s = local_gradient(w, self.samplers[k].next(), no_sample_weights)
            comm.advance_compute(compute_s)
            gaia.before_step(step, lr)
            gaia.local_update(step, lr)
            gaia.send_significant(step, lr)
            gaia.restore_buffers()
            self.W[i].copy_(data)
            self.V[i].copy_(v)
            self.sent_total[i] = gaia.sent_entries_total
            if k == 0:
                self.last0 = (gaia.sent_entries, gaia.sent_dense, gaia.sent_entries_total)
            self._count(k, loss, correct)
        if self.P > 1:
            self._apply_received(step)
            gaia.restore_buffers()

    def _apply_received(self, step: int) -> None:
        """Lines 13-15 for every hosted partition: each receives (its Comm's recv_from_all), then
        every row gets every other partition's update in rank order, as Gaia.apply_received adds
        them: with the compiled kernels (geodml/_kernels.c ``gaia_add_rows``) row by row, so a row
        stays in cache while the P - 1 updates are added to it; otherwise sender by sender, each
        update decoded once and added to the rows of every hosted partition but the sender's own
        in at most two torch calls (rows before it, rows after it). The same additions in the
        same order per entry: the same bits (tests/test_kernels.py, tests/test_pool.py)."""
        received = [self.comm(k).recv_from_all("update", step=step) for k in self.hosted]
        h, start = len(self.hosted), self.hosted.start
        if self._rows_np is not None:
            updates = received[0]                  # every partition's update but the first row's own
            own = received[1][start] if h > 1 else []
            kernels.compiled.gaia_add_rows(self._rows_np, start, [own if s == start else updates[s]
                                                                  for s in range(self.P)])
            return
        for src in range(self.P):
            j = src - start                        # the sender's row, when it is hosted here
            if 0 <= j < h:
                if h == 1:
                    continue                       # the only partition here is the sender
                arrays = received[1 if j == 0 else 0][src]
                blocks = [b for b in (self.W[:j], self.W[j + 1:]) if b.shape[0]]
            else:
                arrays = received[0][src]
                blocks = [self.W]
            for block in blocks:
                self.gaia.add_update(block, arrays)
