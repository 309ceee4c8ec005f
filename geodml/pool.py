"""Pooled partitions: a process's partitions as state, not threads (``--engine pool``).

This module is the FedAvg family's pool and the engine's common part (set-up, logging,
evaluation, the run directory); Gaia's and DGC's, whose partitions all compute and exchange every
step, are geodml.pool_gaia and geodml.pool_dgc on :class:`EveryStepPool`.

With P > R partitions, the threads engine (geodml.run) gives every hosted partition a thread
with its own model, optimizer buffers and trainer: general (every algorithm) but its memory and
set-up grow with P and every partition wakes every step. The FedAvg family needs much less: a
partition that is not sampled does nothing, and between its rounds it keeps only its momentum
buffer u^k (Algorithm 2 keeps it across rounds; with ``--reset-momentum`` nothing at all). The
pool engine runs a process's partitions in one thread on one worker model:

* per round t, the participants this process hosts each get a slot (weights, BatchNorm buffers;
  u^k from its store, or zeros) holding w_t; step by step, each participant in rank order is
  loaded into the worker, takes its minibatch (its own sampler), forward, backward, weight
  decay and the algorithm's hooks (FedProx's proximal term, the momentum-SGD update), and is
  stored back;
* at the round's end the participants' weighted deltas are averaged exactly as
  ``FedAvg._synchronize`` does: through every participant's own Comm (the star of point-to-point
  messages, or one charged all-reduce when every partition takes part), so the same bytes,
  messages and link seconds are charged to the same partitions and the same clocks move; the
  server step (FedAvgM's included) is the algorithm's own ``server_update``;
* a stale participant's download of the global state is sent and received through the Comms as
  in the threads engine, and every process keeps the global state itself (an uncharged
  broadcast from the leader's process after each average), so the received copy is not needed;
* what a partition that sat out holds (the global model of the round after the last one it took
  part in, as in the threads engine) is one shared snapshot per such round, freed when no
  partition holds it; per-partition outputs (summary.json's accuracies, rank<k>/model.pt, hard
  links to one file per snapshot) come from those.

Everything the run reports -- weights, the ledger, accuracies and losses, metrics.jsonl -- is
bit-identical to the threads engine's (tests/test_pool.py): the same operations on the same
values in the same order, the sums over partitions in rank order in float64 (geodml.comm).
Evaluation mid-round with client sampling averages every partition's current weights, as the
threads engine does (the snapshots stand in for the partitions that sat out).

``--vmap`` (FedAvg only) computes a step's participants' gradients in one ``torch.func.vmap`` call
(geodml.stacked) instead of one participant after another; weight decay and the algorithm's
hooks stay per participant. Its weights agree with the loop's to float32 rounding, not bit for
bit, and it measured no faster on the CPU (tests/test_stacked.py, docs/performance.md).

Scope: ``--algo fedavg`` with client sampling, FedAvgM, FedProx and ``--reset-momentum``, and
``--algo gaia`` and ``--algo dgc``, on the CPU, ``--wan off|virtual``, models without
BatchNorm/BatchReNorm. BSP and ``local`` (not ported), FedIR, IWDS and FedVC (per-partition
tables in their algorithm objects), FedNova and ``--local-epochs``, SkewScout,
checkpoints and ``--wan real`` use the threads engine (``--engine auto`` picks it; ``--engine
pool`` with them is an input error naming the reason). ``--metrics-port``: the process's one
exporter (geodml.parts.start_process_exporter) reads each partition's Comm and a
:class:`_Progress` per partition at scrape time.
"""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from geodml import rundir
from geodml.algorithms.base import regularize
from geodml.algorithms.fedavg import pack_into, unpack_from
from geodml.config import RunConfig
from geodml.runtime import Env

if TYPE_CHECKING:
    from geodml.algorithms.fedavg import FedAvg
    from geodml.comm.inprocess import InProcessComm, InProcessGroup
    from geodml.metrics.prometheus import RankExporter
    from geodml.parts import Preflight, Startup


def pool_refusal(cfg: RunConfig) -> str | None:
    """Why the pool engine cannot run ``cfg`` (None: it can)."""
    a = cfg.algo
    if a.algo not in ("fedavg", "gaia", "dgc"):
        return f"--algo {a.algo} (the pool engine runs the FedAvg family, Gaia and DGC; other algorithms use threads)"
    if a.fedir or a.iwds is not None or a.virtual_client_size:
        return "FedIR, IWDS and FedVC keep per-partition tables in their algorithm objects"
    if a.fednova or a.local_epochs:
        return "FedNova or --local-epochs (participants with different numbers of local steps)"
    if cfg.skewscout.enabled:
        return "--skewscout"
    if cfg.reliability.checkpoint_every or cfg.reliability.resume:
        return "checkpoints (--checkpoint-every/--resume)"
    if cfg.comm.wan == "real":
        return "--wan real"
    if cfg.model.norm in ("batch", "batchrenorm"):
        return f"--norm {cfg.model.norm} (per-partition step counters in the normalization layers)"
    if cfg.device == "cuda":
        return "--device cuda (the pool engine trains on the CPU)"
    return None


class _Model:
    """A model over a flat buffer (geodml.algorithms.base.FlatParams) that a partition's weights
    and float buffers are loaded into."""

    def __init__(self, model: torch.nn.Module, flat) -> None:
        self.model, self.flat = model, flat
        self.buffers = flat.float_buffers
        self.nbuf = sum(b.numel() for b in self.buffers)

    def load(self, weights: torch.Tensor, buffers: torch.Tensor) -> None:
        self.flat.data.copy_(weights)
        if self.nbuf:
            unpack_from(buffers, self.buffers)


class _Worker(_Model):
    """The one model a process trains its partitions on, with its minibatch buffers
    (geodml.trainer.Minibatch)."""

    def __init__(self, model: torch.nn.Module, flat, train_x: torch.Tensor, train_y: torch.Tensor, optim, *,
                 channels_last: bool = False) -> None:
        super().__init__(model, flat)
        self.train_x, self.train_y, self.optim = train_x, train_y, optim
        self.xb = torch.empty((optim.batch_size, *train_x.shape[1:]), dtype=train_x.dtype)
        self.yb = torch.empty(optim.batch_size, dtype=train_y.dtype)
        self.idx = torch.empty(optim.batch_size, dtype=torch.int64)
        self.twin = None  # --channels-last: geodml.channels_last.ChannelsLastTwin
        if channels_last:
            from geodml.channels_last import ChannelsLastTwin
            self.twin = ChannelsLastTwin(model, flat, self.xb)

    def store(self, weights: torch.Tensor, buffers: torch.Tensor) -> None:
        weights.copy_(self.flat.data)
        if self.nbuf:
            pack_into(self.buffers, buffers)


class _Progress:
    """What the Prometheus exporter reads of a pooled partition (the threads engine's TrainState):
    the run's step and the partition's own mean training loss over its last log interval with steps."""

    __slots__ = ("pool", "local_train_loss")

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.local_train_loss = float("nan")

    @property
    def step(self) -> int:
        return self.pool.step


class Pool:
    """One process's block of FedAvg partitions (module docstring). Build, then :meth:`run`."""

    def __init__(self, cfg: RunConfig, env: Env, pre: Preflight, *, out: Path, group: InProcessGroup,
                 startup: Startup, exporter: RankExporter | None = None) -> None:
        from geodml.algorithms import AlgoContext, FlatParams, build_algorithm
        from geodml.data.partition import partition_report
        from geodml.models import build_from_config, param_multipliers
        from geodml.parts import training_length, write_run_header
        from geodml.trainer import BatchSampler, steps_per_epoch

        self.cfg, self.out, self.group, self.startup = cfg, out, group, startup
        self.hosted = group.hosted
        P = self.P = group.world_size
        ds = pre.dataset
        assert ds is not None
        labels = ds.train_y.numpy()
        report = partition_report(labels, pre.partitions, ds.num_classes)
        model = build_from_config(cfg.model, ds.input_shape, ds.num_classes, generator_seed=cfg.seed,
                                  pixel_std=ds.pixel_std)
        self._shapes = (ds.input_shape, ds.num_classes, ds.pixel_std)  # for evaluation replicas
        flat = FlatParams(model, param_multipliers(cfg.model, model))
        self.spe = steps_per_epoch(len(labels), P, cfg.optim.batch_size)
        # further validation steps: --eval-at, and the ends of rounds --eval-every-rounds names
        self.total_steps, self.eval_at = training_length(cfg, np.asarray([len(p) for p in pre.partitions]), self.spe)
        self.ctx = AlgoContext(rank=self.hosted.start, world_size=P, seed=cfg.seed, steps_per_epoch=self.spe,
                               total_steps=self.total_steps, batch_size=cfg.optim.batch_size,
                               label_counts=np.asarray(report["label_counts"], dtype=np.int64))
        self.algo: FedAvg = build_algorithm(cfg, flat=flat, comm=group.comm(self.hosted.start), ctx=self.ctx)  # type: ignore[assignment]
        self.w = _Worker(model, flat, ds.train_x, ds.train_y, cfg.optim, channels_last=cfg.channels_last)
        self.test_x, self.test_y = ds.test_x, ds.test_y
        self.own_eval_indices = pre.own_eval_indices  # the test rows of each partition's own final score (None: all)
        self.samplers = {k: BatchSampler(pre.partitions[k], cfg.optim.batch_size, cfg.seed, k) for k in self.hosted}
        self.local_indices = {k: pre.partitions[k] for k in self.hosted}
        n, nb = flat.numel, self.w.nbuf
        self.n = n
        self.global_buf = torch.zeros(nb, dtype=flat.data.dtype)           # the global BatchNorm buffers
        if nb:
            pack_into(self.w.buffers, self.global_buf)
        self.u: dict[int, torch.Tensor] = {}                                 # u^k of partitions that took part
        # what each hosted partition holds: the global model of round held[k] (a shared snapshot)
        self.held = {k: 0 for k in self.hosted}
        self.snapshots: dict[int, torch.Tensor] = {0: torch.cat([flat.data, self.global_buf])}
        self.refs: dict[int, int] = {0: len(self.hosted)}
        # per-partition accumulators of the current log interval (the threads engine's TrainState)
        self.loss_sum = {k: 0.0 for k in self.hosted}
        self.loss_count = dict.fromkeys(self.hosted, 0)
        self.correct = dict.fromkeys(self.hosted, 0)
        self.seen = dict.fromkeys(self.hosted, 0)
        self.slots = torch.empty(0)       # [participants here, n + nb]: weights and buffers of this round's
        self.slot_u: list[torch.Tensor] = []
        self.slot_ctx: list = []
        self.scratch_u: list[torch.Tensor] = []  # the slots' momentum under --reset-momentum
        self.part: list[int] = []          # this round's hosted participants, in rank order
        self.stacked = None                # --vmap: geodml.stacked.StackedGradient and its step buffers
        if cfg.vmap:
            from geodml.stacked import StackedGradient
            self.stacked = StackedGradient(model)
            self.grads = self.sidx = self.sx = self.sy = torch.empty(0)
        self.sink = None
        if env.rank == 0:
            from geodml.parts import _rank0_sinks
            write_run_header(cfg, pre, out, comm=group.comm(0), world=P, device=torch.device("cpu"), model=model,
                             spe=self.spe, total_steps=self.total_steps, report=report, engine="pool")
            self.sink = _rank0_sinks(cfg, out, self.total_steps)
        else:
            from geodml.metrics.sinks import Sink
            self.sink = Sink()
        self.step = 0
        self.progress: dict[int, _Progress] = {}
        if exporter is not None:  # read at scrape time, nothing per step
            from geodml.metrics.sinks import MultiSink
            from geodml.parts import partition_source
            for k in self.hosted:
                self.progress[k] = _Progress(self)
                partition_source(exporter, cfg, group.comm(k), k, out).watch(state=self.progress[k], algo=self.algo)
            self.sink = MultiSink([self.sink, exporter])
        self.wall_t0 = time.monotonic()
        self.diverged_at_step: int | None = None  # --divergence-loss ended the loop after this step

    # ---- helpers ---------------------------------------------------------------------------
    def comm(self, k: int) -> InProcessComm:
        return self.group.comm(k)

    def _hold(self, k: int, round_index: int) -> None:
        old = self.held[k]
        self.refs[old] -= 1
        if self.refs[old] == 0:
            del self.refs[old], self.snapshots[old]
        self.held[k] = round_index
        self.refs[round_index] = self.refs.get(round_index, 0) + 1

    def _global_state(self) -> list[torch.Tensor]:
        return self.algo.server_state() + ([self.global_buf] if self.w.nbuf else [])

    # ---- the round -------------------------------------------------------------------------
    def _begin_round(self) -> None:
        """FedAvg._begin_round for every hosted partition: downloads, the participants' slots."""
        algo = self.algo
        stale = algo.plan_round()
        if stale:
            src, tag = min(algo.holders), 2 * algo.round + 1
            if src in self.hosted:
                tensors = self._global_state()
                buf = torch.empty(sum(t.numel() for t in tensors), dtype=self.algo.flat.data.dtype)
                pack_into(tensors, buf)
                for dst in stale:
                    self.comm(src).send(dst, "model", [buf], step=tag)
            for dst in stale:
                if dst in self.hosted:  # the content is this process's own global state (module docstring)
                    self.comm(dst).recv(src, "model", step=tag)
            algo.holders = algo.holders | frozenset(stale)
            algo.download_count += int(self.hosted.start == 0 and 0 in stale)
        self._fill_slots()
        algo.on_round_start()

    def _fill_slots(self) -> None:
        """This round's hosted participants each get a slot holding w_t, its context and its
        momentum (its own u^k; a reused scratch buffer, zeroed, under --reset-momentum)."""
        algo, n = self.algo, self.n
        self.part = [k for k in algo.selected if k in self.hosted]
        m = len(self.part)
        if self.slots.shape[0] < m:
            self.slots = torch.empty((m, n + self.w.nbuf), dtype=algo.flat.data.dtype)
        while len(self.scratch_u) < (m if algo.reset_momentum else 0):
            self.scratch_u.append(torch.zeros(n, dtype=algo.flat.data.dtype))
        self.slot_u, self.slot_ctx = [], []
        for i, k in enumerate(self.part):
            self.slots[i, :n].copy_(algo.global_w)
            self.slots[i, n:].copy_(self.global_buf)
            if algo.reset_momentum:
                u = self.scratch_u[i]
                u.zero_()
            else:
                u = self.u.get(k)
                if u is None:
                    u = self.u[k] = torch.zeros(n, dtype=algo.flat.data.dtype)
            self.slot_u.append(u)
            self.slot_ctx.append(dataclasses.replace(self.ctx, rank=k))

    def _train_step(self, step: int, lr: float) -> None:
        if self.stacked is not None:
            self._train_step_stacked(step, lr)
            return
        from geodml.trainer import local_gradient
        algo, w, n = self.algo, self.w, self.n
        for i, k in enumerate(self.part):
            w.load(self.slots[i, :n], self.slots[i, n:])
            algo.ctx = self.slot_ctx[i]
            algo.u = self.slot_u[i]
            loss, correct, compute_s = local_gradient(w, algo.batch_indices(step, self.samplers[k]),
                                                      lambda labels: algo.sample_weights(labels, step))
            self.comm(k).advance_compute(compute_s)
            algo.before_step(step, lr)
            algo.local_update(step, lr)
            w.store(self.slots[i, :n], self.slots[i, n:])
            self.loss_sum[k] += loss
            self.loss_count[k] += 1
            self.correct[k] += correct
            self.seen[k] += len(w.yb)
        algo.steps_in_round += 1

    def _train_step_stacked(self, step: int, lr: float) -> None:
        """``_train_step`` with the participants' gradients from one vmap call (geodml.stacked);
        weight decay and the algorithm's hooks as in the loop, participant by participant."""
        algo, w, n, m = self.algo, self.w, self.n, len(self.part)
        if m == 0:
            algo.steps_in_round += 1
            return
        flat, b = algo.flat, self.cfg.optim.batch_size
        if self.grads.shape[0] < m:
            self.grads = torch.empty((m, n), dtype=flat.data.dtype)
            self.sidx = torch.empty(m * b, dtype=torch.int64)
            self.sx = torch.empty((m * b, *w.train_x.shape[1:]), dtype=w.train_x.dtype)
            self.sy = torch.empty(m * b, dtype=w.train_y.dtype)
        for i, k in enumerate(self.part):
            algo.ctx = self.slot_ctx[i]
            self.sidx[i * b:(i + 1) * b].copy_(torch.from_numpy(algo.batch_indices(step, self.samplers[k])))
        idx, x, y = self.sidx[:m * b], self.sx[:m * b], self.sy[:m * b]
        torch.index_select(w.train_x, 0, idx, out=x)
        torch.index_select(w.train_y, 0, idx, out=y)
        assert self.stacked is not None
        losses, correct, compute_s = self.stacked(self.slots[:m, :n], x.view(m, b, *x.shape[1:]), y.view(m, b),
                                                  self.grads[:m])
        wd = self.cfg.optim.weight_decay
        for i, k in enumerate(self.part):
            flat.data.copy_(self.slots[i, :n])
            flat.grad.copy_(self.grads[i])
            regularize(flat, wd)
            self.comm(k).advance_compute(compute_s / m)
            algo.ctx = self.slot_ctx[i]
            algo.u = self.slot_u[i]
            algo.before_step(step, lr)
            algo.local_update(step, lr)
            self.slots[i, :n].copy_(flat.data)
            self.loss_sum[k] += float(losses[i])
            self.loss_count[k] += 1
            self.correct[k] += int(correct[i])
            self.seen[k] += b
        algo.steps_in_round += 1

    def _synchronize(self) -> None:
        """FedAvg._synchronize for every hosted partition (module docstring)."""
        from geodml.algorithms.base import copy_array_into
        from geodml.algorithms.fedavg import add_array
        algo, n = self.algo, self.n
        sel = algo.selected
        p = algo.averaging_weights(sel)
        diags = []
        for i, k in enumerate(self.part):
            row = self.slots[i]
            delta = row[:n]
            torch.sub(algo.global_w, delta, out=delta)                    # w_t - w^k
            d = torch.zeros(3, dtype=torch.float64)
            d[0] = torch.linalg.vector_norm(delta)
            d[1] = 1.0
            diags.append(d)
            row.mul_(float(p[sel.index(k)]))                               # delta and buffers, weighted
        result = None
        if len(sel) == self.P:
            result = self.group.all_reduce_hosted([self.slots[i] for i in range(len(self.part))], "model")
        else:
            leader, tag = sel[0], 2 * algo.round
            for i, k in enumerate(self.part):
                if k != leader:
                    self.comm(k).send(leader, "model", [self.slots[i]], step=tag)
            if leader in self.hosted:
                buf = self.slots[0]                                         # the leader is the first here
                for r in sel[1:]:
                    add_array(buf, self.comm(leader).recv(r, "model", step=tag)[0])
                for r in sel[1:]:
                    self.comm(leader).send(r, "model", [buf], step=tag)
                result = buf
            for i, k in enumerate(self.part):
                if k != leader:
                    got = self.comm(k).recv(leader, "model", step=tag)[0]
                    if result is None:
                        result = self.slots[i]
                        copy_array_into(result, got)
        if result is not None:
            algo.server_update(result[:n])                                 # w_{t+1}
            self.global_buf.copy_(result[n:])
        if self.group.cross is not None and len(sel) < self.P:              # every process keeps the global state
            state = self._global_state()
            flat_state = torch.cat([t.reshape(-1) for t in state])
            self.group.cross.broadcast_(flat_state, sel[0])
            off = 0
            for t in state:
                t.copy_(flat_state[off:off + t.numel()].view_as(t))
                off += t.numel()
        norm = torch.linalg.vector_norm(algo.global_w) / len(sel)
        for d in diags:
            d[2] = norm
        total = self.group.sum_hosted(diags or [torch.zeros(3, dtype=torch.float64)])
        algo.end_round(total.tolist())
        if self.part:
            snap = torch.cat([algo.global_w, self.global_buf])
            r = algo.round
            self.snapshots[r] = snap
            for k in self.part:
                self._hold(k, r)
        self.part = []

    # ---- metrics -----------------------------------------------------------------------------
    def _divergence_due(self, step: int) -> bool:
        """--divergence-loss, as geodml.trainer.Trainer._check_divergence: after ``step``'s training and
        before its round ends, when a log line follows it, whether the mean training loss over every
        partition since the last line is NaN, infinite or above the limit (one uncharged reduction
        over the processes: every process answers alike)."""
        cfg = self.cfg
        limit = cfg.reliability.divergence_loss
        if limit is None:  # off (the default): no work on this per-step path
            return False
        from geodml.trainer import diverged, logs_after
        if not logs_after(step, total_steps=self.total_steps, eval_every=cfg.eval_every, log_every=cfg.log_every,
                          eval_at=self.eval_at):
            return False
        t = self.group.sum_hosted([torch.tensor([self.loss_sum[k], float(self.loss_count[k])], dtype=torch.float64)
                                   for k in self.hosted])
        return diverged(float(t[0]), float(t[1]), limit)

    def _log(self, step: int, lr: float, *, with_eval: bool) -> dict:
        g = self.group
        rows = [torch.tensor([self.loss_sum[k], float(self.loss_count[k]), float(self.correct[k]), float(self.seen[k]),
                              float(self.comm(k).ledger.wan_bytes)], dtype=torch.float64) for k in self.hosted]
        local = g.sum_hosted(rows).clone()
        emu = g.max_hosted([float(self.comm(k).emulated_s) for k in self.hosted])
        rec = {
            "step": step,
            "epoch": step / self.spe,
            "emulated_s": emu,
            "wall_s": time.monotonic() - self.wall_t0,
            "train_loss": float(local[0]) / max(float(local[1]), 1.0),
            "train_accuracy": float(local[2]) / max(float(local[3]), 1.0),
            "lr": lr,
            "wan_bytes_total": int(local[4]),
        }
        if self.hosted.start == 0:
            rec.update(self._stats())
        if with_eval:
            rec["val_accuracy"], rec["val_loss"] = self._evaluate_global()
        for k in self.hosted:
            if self.progress and self.loss_count[k]:
                self.progress[k].local_train_loss = self.loss_sum[k] / self.loss_count[k]
            self.loss_sum[k], self.loss_count[k], self.correct[k], self.seen[k] = 0.0, 0, 0, 0
        assert self.sink is not None
        self.sink.log(rec)
        return rec

    def _stats(self) -> dict[str, float]:
        """The algorithm's statistics as partition 0's Trainer logs them (called where partition 0 is hosted)."""
        return self.algo.stats()

    def _current(self, k: int) -> torch.Tensor:
        """Partition k's weights and buffers now (a slot when it takes part, else its snapshot)."""
        if k in self.part:
            return self.slots[self.part.index(k)]
        return self.snapshots[self.held[k]]

    def _load_global(self) -> None:
        """The global model into the worker, as Trainer._swap_in_global chooses it."""
        algo, n = self.algo, self.n
        if algo.models_agree or algo.global_model_rank is not None:
            self.w.load(algo.global_w, self.global_buf)
            return
        avg = self.group.sum_hosted([self._current(k) for k in self.hosted]).clone()
        # the threads engine sums weights and buffers in separate calls: the same bits (elementwise)
        avg.div_(self.P)
        self.w.load(avg[:n], avg[n:])

    def _evaluate_global(self) -> tuple[float, float]:
        from geodml.trainer import evaluate
        self._load_global()
        rows = []
        for k in self.hosted:
            shard = slice(k, None, self.P)
            correct, loss_sum = evaluate(self.w.model, self.test_x[shard], self.test_y[shard])
            rows.append(torch.tensor([float(correct), loss_sum], dtype=torch.float64))
        t = self.group.sum_hosted(rows)
        n = len(self.test_y)
        return float(t[0] / n), float(t[1] / n)

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> dict:
        from geodml.trainer import learning_rate
        algo, cfg = self.algo, self.cfg
        self.w.model.train()
        self._fill_slots()  # round 0 was planned by FedAvg's constructor: every partition holds w_0
        lr = cfg.optim.lr
        step = 0
        while step < self.total_steps:
            lr = learning_rate(cfg.optim, step, self.spe, self.total_steps)
            self._train_step(step, lr)
            stop = self._divergence_due(step)  # this step becomes the last: no further round begins
            if algo.steps_in_round == algo.round_len:
                self._synchronize()
                if step + 1 < self.total_steps and not stop:
                    self._begin_round()
            step += 1
            self.step = step
            if stop:
                self.diverged_at_step = step  # _finish logs this step, with the final evaluation
                break
            if step < self.total_steps:
                do_eval = step % cfg.eval_every == 0 or step in self.eval_at
                if do_eval or step % cfg.log_every == 0:
                    self._log(step, lr, with_eval=do_eval)
        if algo.steps_in_round > 0:
            self._synchronize()
        return self._finish(step, lr)

    def _finish(self, step: int, lr: float) -> dict:
        final = self._log(step, lr, with_eval=True)
        states = {k: self._final_state(k) for k in self.hosted}
        own_val, train_acc = self._evaluate_partitions(states)
        per: list[tuple[float, float]] = []
        files: dict[object, Path] = {}
        for k in self.hosted:
            r, state = states[k]
            per.append((own_val[r], train_acc[k]))
            own = rundir.rank_dir(self.out, k)
            own.mkdir(parents=True, exist_ok=True)
            if r in files:
                _replace_link(files[r], own / rundir.MODEL)
            else:
                self.w.load(state[:self.n], state[self.n:])
                rundir.save_torch(own / rundir.MODEL, {n: v.detach().clone() for n, v in
                                                       self.w.model.state_dict().items()})
                files[r] = own / rundir.MODEL
            rundir.write_json(own / rundir.STARTUP, self.startup.report(rank=k, local_rank=k - self.hosted.start))
        per_rank = self.group.gather_hosted_objects(per)
        return {"final": final, "per_rank_val_accuracy": [v for v, _ in per_rank],
                "per_rank_train_accuracy": [t for _, t in per_rank], "diverged_at_step": self.diverged_at_step}

    @property
    def own_eval_count(self) -> int:
        """How many test examples each partition's own final model is scored on."""
        return len(self.test_y) if self.own_eval_indices is None else len(self.own_eval_indices)

    def _evaluate_partitions(self, states: dict[int, tuple[object, torch.Tensor]]
                             ) -> tuple[dict[object, float], dict[int, float]]:
        """Each hosted partition's final model on the test set (or the rows ``--partition-eval-examples``
        picks; once per distinct model) and on
        its own training data, as the threads engine's partitions evaluate them: on up to
        ``geodml.cores.usable_cores()`` threads at once (geodml.trainer's evaluation slots), each with a model of
        its own into which a partition's state is loaded. The same weights give the same bits
        on any thread."""
        import queue
        from concurrent.futures import ThreadPoolExecutor

        from geodml.algorithms import FlatParams
        from geodml.models import build_from_config
        from geodml.trainer import _CORES, evaluate
        distinct = {r: state for r, state in states.values()}
        jobs = len(distinct) + len(states)
        models: queue.SimpleQueue[_Model] = queue.SimpleQueue()
        models.put(self.w)
        for _ in range(min(_CORES, jobs) - 1):
            m = build_from_config(self.cfg.model, *self._shapes[:2], generator_seed=self.cfg.seed,
                                  pixel_std=self._shapes[2])
            models.put(_Model(m, FlatParams(m)))

        def on_a_model(state: torch.Tensor, x: torch.Tensor, y: torch.Tensor, indices: torch.Tensor | None) -> int:
            m = models.get()
            try:
                m.load(state[:self.n], state[self.n:])
                return evaluate(m.model, x, y, indices=indices)[0]
            finally:
                models.put(m)

        with ThreadPoolExecutor(max_workers=min(_CORES, jobs), thread_name_prefix="geodml-eval") as ex:
            rows = self.own_eval_indices
            val = {r: ex.submit(on_a_model, state, self.test_x, self.test_y, rows) for r, state in distinct.items()}
            local = {k: torch.from_numpy(self.local_indices[k]) for k in states}
            train = {k: ex.submit(on_a_model, states[k][1], self.w.train_x, self.w.train_y, local[k]) for k in states}
            own_val = {r: f.result() / self.own_eval_count for r, f in val.items()}
            train_acc = {k: f.result() / len(local[k]) for k, f in train.items()}
        return own_val, train_acc

    def _final_state(self, k: int) -> tuple[object, torch.Tensor]:
        """Partition k's model at the end (weights then buffers) and a key shared by the partitions
        that hold the same one (evaluated and saved once): FedAvg's round of its snapshot."""
        r = self.held[k]
        return r, self.snapshots[r]

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()


class EveryStepPool(Pool):
    """The loop of algorithms whose partitions all compute and exchange every step (Gaia, DGC:
    geodml.pool_gaia, geodml.pool_dgc): Trainer.run for every hosted partition at once, each
    step's work in :meth:`_train_step` (no rounds, snapshots or slots)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        assert self.w.nbuf == 0, "pool_refusal keeps models with float buffers (BatchNorm) off the pool"
        self.snapshots.clear()   # FedAvg's round snapshots
        self.refs.clear()

    def run(self) -> dict:
        from geodml.trainer import learning_rate
        cfg = self.cfg
        self.w.model.train()
        lr = cfg.optim.lr
        step = 0
        while step < self.total_steps:
            lr = learning_rate(cfg.optim, step, self.spe, self.total_steps)
            self._train_step(step, lr)
            stop = self._divergence_due(step)
            step += 1
            self.step = step
            if stop:
                self.diverged_at_step = step
                break
            if step < self.total_steps:  # the last step is logged by _finish, with the final evaluation
                do_eval = step % cfg.eval_every == 0 or step in self.eval_at
                if do_eval or step % cfg.log_every == 0:
                    self._log(step, lr, with_eval=do_eval)
        self.algo.finish()
        return self._finish(step, lr)

    def _count(self, k: int, loss: float, correct: int) -> None:
        """Partition k's step into its log-interval accumulators."""
        self.loss_sum[k] += loss
        self.loss_count[k] += 1
        self.correct[k] += correct
        self.seen[k] += len(self.w.yb)


def no_sample_weights(labels: torch.Tensor) -> None:
    """The plain minibatch mean loss (geodml.algorithms.base.PlainWork), for local_gradient."""
    return None


def _replace_link(target: Path, link: Path) -> None:
    """``link`` becomes a hard link to ``target`` (a copy where hard links are not possible)."""
    link.unlink(missing_ok=True)
    try:
        os.link(target, link)
    except OSError:
        import shutil
        shutil.copyfile(target, link)


def run_pool(cfg: RunConfig, env: Env, pre: Preflight) -> dict | None:
    """This process's block of the P partitions on the pool engine (module docstring); the
    summary on process 0. The run directory is the threads engine's (geodml.run)."""
    from geodml.comm import build_hosted_group
    from geodml.comm.collectives import ring_allreduce_wan_bytes
    from geodml.comm.crossproc import blocks
    from geodml.comm.ledger import Ledger
    from geodml.metrics.prometheus import MetricsError
    from geodml.parts import Startup, start_process_exporter
    from geodml.run import InputError, _joined, _limit_malloc_arenas

    torch.set_num_threads(cfg.threads)
    _limit_malloc_arenas()
    P, R = len(pre.partitions), env.world_size
    wall_t0 = time.monotonic()
    startup = Startup()
    with _joined(cfg, env, "gloo", "cpu") as (_, out), ExitStack() as stack:
        startup.lap("process_group_s")
        group = build_hosted_group(cfg.comm, partitions=P, process=env.rank, processes=R, topology=pre.topology)
        try:
            startup.lap("zmq_mesh_s")
            startup.moved_to_preflight("data_s", pre.data_s)
            try:
                exporter = start_process_exporter(cfg, env, out, stack, partitions=P, device=torch.device("cpu"), wire_rejected=(
                    group.cross.wire_rejected if group.cross is not None else None))
                cls: type[Pool] = Pool
                if cfg.algo.algo == "gaia":
                    from geodml.pool_gaia import GaiaPool
                    cls = GaiaPool
                elif cfg.algo.algo == "dgc":
                    from geodml.pool_dgc import DGCPool
                    cls = DGCPool
                pool = cls(cfg, env, pre, out=out, group=group, startup=startup, exporter=exporter)
            except (ValueError, MetricsError) as exc:
                raise InputError(str(exc)) from None
            startup.lap("model_s")
            startup.done()
            try:
                result = pool.run()
            finally:
                pool.close()
            hosted = list(blocks(P, R)[env.rank])
            rows = [r for rank_rows in group.gather_hosted_objects([group.comm(k).ledger.rows() for k in hosted])
                    for r in rank_rows]
            emulated_s = group.max_hosted([float(group.comm(k).emulated_s) for k in hosted])
            global_sd = _global_state_dict(pool)
        finally:
            group.close()
        if env.rank != 0:
            return None
        flat = pool.algo.flat
        bsp_bytes = pool.step * ring_allreduce_wan_bytes(flat.numel, flat.data.element_size(),
                                                         group.region_of_rank)
        summary = rundir.make_summary(cfg, world_size=P, result=result, totals=Ledger.summarize(rows),
                                      emulated_s=emulated_s, wall_s=time.monotonic() - wall_t0,
                                      steps=pool.step, steps_per_epoch=pool.spe, bsp_bytes=bsp_bytes,
                                      algo=pool.algo, skewscout={})
        rundir.save_torch(out / rundir.MODEL, global_sd)
        rundir.write_json(out / rundir.SUMMARY, summary)
        print(rundir.done_text(summary, out), flush=True)
        return summary


def _global_state_dict(pool: Pool) -> dict:
    pool._load_global()
    return {k: v.detach().clone() for k, v in pool.w.model.state_dict().items()}
