"""DGC on the pool engine: a process's DGC partitions as rows of state around one shared model.

Under Algorithm 3 (geodml.algorithms.dgc) every partition applies the same sum of every
partition's selected update in the same order, so all partitions hold one model: the process's
worker holds it once. What is a partition's own is its momentum u^k, its accumulated updates
v^k (rows of two ``[h, n]`` matrices, h partitions in this process) and its generator of the
sampled threshold; the gradient, the selectors' scratch (|v|, masks, candidates), the send and
receive buffers are the worker's :class:`~geodml.algorithms.dgc.DGC`, shared by the partitions.
The threads engine holds a model, its gradient, u, v and about eight n-sized selection and
exchange buffers per partition.

A step:

1. for the hosted partitions in rank order: point the worker's DGC at u^k, v^k and k's generator
   (``DGC.use_generator``); forward, backward and weight decay on partition k's minibatch at the
   shared weights (geodml.trainer.local_gradient, its own sampler); lines 4-13 (clip, momentum
   correction, accumulate, select, send to every other partition through k's own Comm, clear):
   ``DGC.before_step``;
2. every hosted partition receives every other partition's block (each Comm's ``recv_from_all``,
   as its thread would); the shared weights get lines 14-15 once: the blocks of partitions 0..P-1
   added in rank order (``DGC.apply_blocks``), each block the bytes its partition sent.

The threads engine's partition adds its own block from its send buffers and the others' from
the received copies: the same values, added in the same order, so the weights are bit-identical
(tests/test_pool.py), as are the ledger, the messages and the emulated link seconds (every
partition's Comm sees the same calls in the same order). Partition 0's statistics (the
metrics.jsonl columns: entries sent, dense wire, the threshold paths, the Appendix G residual)
are its own, kept beside the shared worker; other partitions' are not logged by either engine,
so the pool does not compute them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from geodml.pool import EveryStepPool, no_sample_weights

if TYPE_CHECKING:
    from geodml.algorithms.dgc import DGC


class DGCPool(EveryStepPool):
    """One process's block of DGC partitions (module docstring). Build, then :meth:`run`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from geodml.algorithms.dgc import DGC
        self.dgc: DGC = self.algo  # type: ignore[assignment]
        h, n = len(self.hosted), self.n
        dtype = self.dgc.flat.data.dtype
        self.U = torch.zeros((h, n), dtype=dtype)
        self.V = torch.zeros((h, n), dtype=dtype)
        self.gens = [DGC.generator(self.cfg.seed, k) for k in self.hosted]
        self.ctxs = [dataclasses.replace(self.ctx, rank=k) for k in self.hosted]
        self.own_block: list[np.ndarray] = []   # one hosted partition: its own block, kept for the apply
        # partition 0's statistics, swapped in for its step and its logging
        self.stats_state: dict[str, Any] = {"paths": dict(self.dgc.paths), "total_sent": 0}
        self.scratch_paths = dict(self.dgc.paths)  # the other partitions' counters: counted, never read
        self.stats0 = self.dgc.stats()

    def _stats(self) -> dict[str, float]:
        return self.stats0

    def _current(self, k: int) -> torch.Tensor:
        return self.dgc.flat.data

    def _final_state(self, k: int) -> tuple[object, torch.Tensor]:
        return "shared", self.dgc.flat.data

    def _load_global(self) -> None:
        """Nothing to load: the worker holds every partition's (the one) model."""

    def _swap_stats(self, k: int) -> None:
        """Partition 0's counters in for its step; a scratch set for the others' (not reported)."""
        dgc = self.dgc
        if k == 0:
            dgc.paths, dgc.total_sent = self.stats_state["paths"], self.stats_state["total_sent"]
        else:
            dgc.paths, dgc.total_sent = self.scratch_paths, 0

    def _train_step(self, step: int, lr: float) -> None:
        from geodml.trainer import local_gradient
        dgc, w = self.dgc, self.w
        single = len(self.hosted) == 1 and self.P > 1
        first = None
        for i, k in enumerate(self.hosted):
            comm = self.comm(k)
            dgc.u, dgc.v = self.U[i], self.V[i]
            dgc.use_generator(self.gens[i])
            dgc.comm, dgc.ctx = comm, self.ctxs[i]
            self._swap_stats(k)
            loss, correct, compute_s = local_gradient(w, self.samplers[k].next(), no_sample_weights)
            comm.advance_compute(compute_s)
            dgc.before_step(step, lr)
            if k == 0:
                self.stats_state.update(paths=dgc.paths, total_sent=dgc.total_sent)
                first = dgc.wire_state()
            if single:  # its block is in no other hosted partition's mailbox
                self.own_block = dgc.sent_block()
            self._count(k, loss, correct)
        blocks: dict[int, list[np.ndarray]] = {}
        if self.P > 1:
            received = [self.comm(k).recv_from_all(dgc.KIND, step=step) for k in self.hosted]
            blocks = dict(received[0])
            a = self.hosted.start
            blocks[a] = received[1][a] if len(self.hosted) > 1 else self.own_block
        dgc.apply_blocks(step, blocks, own=None if self.P > 1 else 0)
        if first is not None:  # partition 0's residual (Appendix G) and statistics, as its Trainer logs them
            dgc.v, dgc.paths, dgc.total_sent = self.V[0], self.stats_state["paths"], self.stats_state["total_sent"]
            dgc.restore_wire_state(first)
            dgc.record_residual(step)
            self.stats0 = dgc.stats()
