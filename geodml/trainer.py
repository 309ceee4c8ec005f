"""The per-partition training loop (docs/design.md "How a run flows", steps 5-6).

Every process trains on its own partition with vanilla momentum SGD; the algorithm's hooks
do all communication. One epoch is ``ceil(N_train / (K * batch_size))`` steps on every rank
(so BSP-style lock-step algorithms agree on the step count whatever the partition sizes);
each partition walks its own data in a seeded random order and reshuffles when it runs out.

The *global model* evaluated on the whole test set is the average of the partitions'
weights (identical to every partition's weights for BSP, DGC and FedAvg after averaging)
with the average of their BatchNorm running statistics. Evaluation, metric averaging and the
end-of-run totals go through the Comm layer's uncharged ``meta_*`` collectives: they are the
emulator's bookkeeping, not traffic of the emulated system.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from geodml.algorithms.base import Algorithm, FlatParams, regularize
from geodml.channels_last import ChannelsLastTwin
from geodml.config import OptimConfig
from geodml.cores import usable_cores
from geodml.interrupt import Interrupted, requested
from geodml.metrics.sinks import Sink

if TYPE_CHECKING:
    from geodml.comm.api import RunComm
    from geodml.engine.worker import Worker
    from geodml.skewscout import SkewScout


class BatchSampler:
    """Seeded minibatch order over one partition: a fresh permutation per pass, wrap-around.

    Pure function of (indices, batch_size, seed, rank): tests recompute the exact sequence.
    """

    def __init__(self, indices: np.ndarray, batch_size: int, seed: int, rank: int,
                 labels: np.ndarray | None = None) -> None:
        if len(indices) == 0:
            raise ValueError(f"partition of rank {rank} is empty; use fewer partitions or another --partition")
        self.indices = np.asarray(indices, dtype=np.int64)
        self.labels = labels  # the labels of ``indices`` (geodml.algorithms.base.BatchSource)
        self.batch_size = batch_size
        self.rng = np.random.default_rng([seed, rank, 0x5A3])
        self.order = self.rng.permutation(self.indices)
        self.pos = 0
        self.out = np.empty(batch_size, dtype=np.int64)

    def next(self) -> np.ndarray:
        filled = 0
        while filled < self.batch_size:
            if self.pos == len(self.order):
                self.order = self.rng.permutation(self.indices)
                self.pos = 0
            take = min(self.batch_size - filled, len(self.order) - self.pos)
            self.out[filled:filled + take] = self.order[self.pos:self.pos + take]
            filled += take
            self.pos += take
        return self.out

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "order": self.order.copy(), "pos": self.pos}

    def load_state_dict(self, s: dict) -> None:
        self.rng.bit_generator.state = s["rng"]
        self.order = np.asarray(s["order"], dtype=np.int64)
        self.pos = int(s["pos"])


def steps_per_epoch(num_train: int, world_size: int, batch_size: int) -> int:
    return max(1, math.ceil(num_train / (world_size * batch_size)))


def learning_rate(cfg: OptimConfig, step: int, spe: int, total_steps: int) -> float:
    """Step schedule: divide by 10 at each milestone epoch. Poly: eta0 * (1 - step/total)**power."""
    if cfg.lr_schedule == "poly":
        return cfg.lr * max(0.0, 1.0 - step / total_steps) ** cfg.poly_power
    epoch = step / spe
    drops = sum(1 for m in cfg.lr_milestones if epoch >= m)
    return cfg.lr * (0.1 ** drops)


# Evaluations at once in this process: partitions hosted as threads would otherwise hold one
# 1000-example batch of activations each (hundreds of MB apiece for the CNN on 28x28 images).
_CORES = usable_cores()  # the affinity mask's cores, not the machine's
_EVAL_SLOTS = threading.BoundedSemaphore(_CORES)
# Training forwards and backwards at once in this process, for the same reason (a minibatch's
# activations and autograd graph per partition in flight) and so that hosted partitions do not
# contend for the cores they share; it holds nothing across a Comm call, so it cannot deadlock.
_STEP_SLOTS = threading.BoundedSemaphore(_CORES)
# On a GPU the kernels of concurrent evaluations run one after another anyway, while each holds
# its batch's activations (about 160 MiB for LeNet on 1,000 28x28 images): one at a time per process.
_GPU_EVAL_SLOTS = threading.BoundedSemaphore(1)


def logs_after(step: int, *, total_steps: int, eval_every: int, log_every: int, eval_at: frozenset[int]) -> bool:
    """Whether the training loop writes a log line after ``step`` (0-based; the last step's line comes
    from the final evaluation instead): the step ``--divergence-loss`` checks on."""
    n = step + 1
    return n < total_steps and (n % eval_every == 0 or n in eval_at or n % log_every == 0)


def diverged(loss_sum: float, loss_count: float, limit: float) -> bool:
    """``--divergence-loss``: whether a mean training loss (``loss_sum / loss_count`` over the steps
    since the last log line; no step counted: not diverged) is NaN, infinite or above ``limit``."""
    if loss_count <= 0:
        return not math.isfinite(loss_sum)
    mean = loss_sum / loss_count
    return not math.isfinite(mean) or mean > limit


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1000,
             indices: torch.Tensor | None = None) -> tuple[int, float]:
    """(correct count, summed loss) of ``model`` in eval mode on (x, y), or on the rows
    ``indices`` of them, gathered one batch at a time (no copy of the whole subset: a partition
    of the whole training set would copy all of it; the batches hold the same values)."""
    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    n = len(y) if indices is None else len(indices)
    with _GPU_EVAL_SLOTS if x.is_cuda else _EVAL_SLOTS:
        for i in range(0, n, batch):
            if indices is None:
                xb, yb = x[i:i + batch], y[i:i + batch]
            else:
                xb, yb = x[indices[i:i + batch]], y[indices[i:i + batch]]
            logits = model(xb)
            correct += int((logits.argmax(1) == yb).sum())
            loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
    model.train(was_training)
    return correct, loss_sum


def partition_eval_indices(test_examples: int, examples: int | None, seed: int) -> torch.Tensor | None:
    """The test rows each partition's own final model is scored on (``--partition-eval-examples``):
    None for the whole test set, else ``examples`` distinct rows in ascending order, drawn by a
    generator seeded with the run's seed alone, so every partition, process count and engine of a
    run scores on the same rows. Pure: the same arguments give the same rows."""
    if examples is None:
        return None
    if not 1 <= examples <= test_examples:
        raise ValueError(f"--partition-eval-examples {examples}: the test set has {test_examples} examples; "
                         f"choose 1 to {test_examples}, or leave it out for the whole test set")
    rows = np.random.default_rng([seed, 0xE7A1]).choice(test_examples, size=examples, replace=False)
    return torch.from_numpy(np.sort(rows))


class EvalCache:
    """Results of evaluating a model on the test set, by the exact bytes of its weights and
    buffers, shared by the partitions one process hosts: partitions that hold the same model
    (FedAvg's participants after an average, non-participants holding the same stale model) are
    evaluated once. Identical bytes give identical results on the CPU, so nothing is approximated."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: dict[bytes, tuple[int, float]] = {}
        self._pending: dict[bytes, threading.Event] = {}  # being evaluated by another partition now

    @staticmethod
    def key(model: nn.Module) -> bytes:
        h = hashlib.blake2b(digest_size=32)
        for t in model.state_dict().values():
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.digest()

    def evaluate(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                 indices: torch.Tensor | None = None) -> tuple[int, float]:
        """evaluate(model, x, y, indices=indices), once per distinct model: one cache serves one
        (x, y, indices), the run's final evaluation."""
        key = self.key(model)
        while True:
            with self._lock:
                if key in self._results:
                    return self._results[key]
                pending = self._pending.get(key)
                if pending is None:  # this partition evaluates it; the others holding it wait
                    self._pending[key] = threading.Event()
                    break
            pending.wait()
        try:
            result = evaluate(model, x, y, indices=indices)
            with self._lock:
                self._results[key] = result
            return result
        finally:
            with self._lock:
                self._pending.pop(key).set()


@dataclass
class TrainState:
    """The loop's position and the metric accumulators of the current log interval."""

    step: int = 0
    loss_sum: float = 0.0
    loss_count: int = 0
    correct: int = 0
    seen: int = 0
    local_train_loss: float = math.nan
    """This rank's own mean training loss over the last log interval that had steps (read by the exporter)."""


@dataclass(frozen=True)
class TrainData:
    """The tensors a partition trains and validates on (already on the training device)."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    local_indices: np.ndarray
    """This partition's training-set indices."""
    own_eval_indices: torch.Tensor | None = None
    """The test rows this partition's own final model is scored on (:func:`partition_eval_indices`;
    None: all of them)."""


@dataclass(frozen=True)
class Schedule:
    """How long the loop runs and how often it logs and validates."""

    optim: OptimConfig
    total_steps: int
    steps_per_epoch: int
    eval_every: int
    log_every: int
    seed: int
    """Seeds this partition's minibatch order (with its rank)."""
    eval_at: frozenset[int] = frozenset()
    """Further steps after which the global model is validated (``--eval-at``)."""
    divergence_loss: float | None = None
    """End the loop at the first log step whose mean training loss is not finite or above this (``--divergence-loss``)."""
    partition_scores: str = "all"
    """``--partition-scores``: all: score every partition's own final model; auto: only where partitions end
    with models of their own (``Algorithm.partitions_hold_global_models`` False)."""
    compute_s_per_step: float | None = None
    """``--compute-s-per-step``: each computed step's emulated compute time (None: the measured time)."""


class Minibatch(Protocol):
    """What :func:`local_gradient` works with: a model over a flat buffer, the training tensors and
    preallocated minibatch buffers (a :class:`Trainer`, or geodml.pool's worker)."""

    model: nn.Module
    flat: FlatParams
    train_x: torch.Tensor
    train_y: torch.Tensor
    xb: torch.Tensor
    yb: torch.Tensor
    idx: torch.Tensor
    optim: OptimConfig
    twin: ChannelsLastTwin | None
    """``--channels-last``: the copy of ``model`` that runs the forward and backward pass (None: the model)."""


def local_gradient(mb: Minibatch, indices: np.ndarray,
                   sample_weights: Callable[[torch.Tensor], torch.Tensor | None]) -> tuple[float, int, float]:
    """Forward and backward of one minibatch (training-set ``indices``) into ``mb.flat.grad``,
    weight decay and the per-parameter multipliers applied (geodml.algorithms.base.regularize):
    returns (loss, correct predictions, compute seconds). The loss is the mean, or
    mean(w_i * l_i) with ``sample_weights(labels)`` when that is not None."""
    mb.idx.copy_(torch.from_numpy(indices))
    torch.index_select(mb.train_x, 0, mb.idx, out=mb.xb)
    torch.index_select(mb.train_y, 0, mb.idx, out=mb.yb)
    t0 = time.perf_counter()
    logits = mb.model(mb.xb) if mb.twin is None else mb.twin.forward(mb.model, mb.xb)
    weights = sample_weights(mb.yb)
    if weights is None:
        loss = F.cross_entropy(logits, mb.yb)
    else:
        loss = (F.cross_entropy(logits, mb.yb, reduction="none") * weights).mean()
    mb.flat.zero_grad()
    loss.backward()
    if mb.twin is not None:  # the convolution weights' gradients are the twin's (zeroed by its forward)
        mb.twin.push_grads()
    regularize(mb.flat, mb.optim.weight_decay)
    compute_s = time.perf_counter() - t0
    return float(loss.detach()), int((logits.detach().argmax(1) == mb.yb).sum()), compute_s


class Trainer:
    """Runs one partition's loop; rank 0 also writes the metrics sinks.

    ``state_dict``/``load_state_dict`` capture everything the loop needs to continue bit for bit
    (model, algorithm, sampler, loop state, torch's generator, the Comm's ledger and clock,
    SkewScout, wall time so far); geodml.checkpoint wraps it in a checkpoint file.
    """

    def __init__(self, *, model: nn.Module, flat: FlatParams, algo: Algorithm, comm: RunComm, data: TrainData,
                 schedule: Schedule, sink: Sink | None = None, skewscout: SkewScout | None = None,
                 step_hooks: Sequence[Callable[[Trainer], None]] = (), eval_cache: EvalCache | None = None,
                 channels_last: bool = False, worker: Worker | None = None) -> None:
        self.rank, self.world_size = comm.rank, comm.world_size
        self.eval_cache = eval_cache  # shared by the partitions of one process (geodml.compose hosts them)
        self.model, self.flat, self.algo, self.comm, self.optim = model, flat, algo, comm, schedule.optim
        if not algo.l2_in_gradient:  # the algorithm applies --weight-decay itself (Algorithm.l2_in_gradient)
            self.optim = dataclasses.replace(schedule.optim, weight_decay=0.0)
        self.train_x, self.train_y, self.test_x, self.test_y = data.train_x, data.train_y, data.test_x, data.test_y
        self.own_eval_indices = None if data.own_eval_indices is None else data.own_eval_indices.to(data.test_x.device)
        self.sampler = BatchSampler(data.local_indices, schedule.optim.batch_size, schedule.seed, self.rank,
                                    labels=data.train_y[torch.as_tensor(data.local_indices)].cpu().numpy())
        self.total_steps, self.spe = schedule.total_steps, schedule.steps_per_epoch
        self.eval_every, self.log_every, self.eval_at = schedule.eval_every, schedule.log_every, schedule.eval_at
        self.divergence_loss = schedule.divergence_loss
        self.compute_s_per_step = schedule.compute_s_per_step
        self.partition_scores = schedule.partition_scores
        self.sink = sink if sink is not None else Sink()
        self.skewscout = skewscout
        self.step_hooks = tuple(step_hooks)  # called with the trainer after each step's logging (checkpoints, fault tests)
        self.state = TrainState()
        optim, train_x, train_y = schedule.optim, data.train_x, data.train_y
        if worker is None:  # a partition alone: a worker of its own, over this very model
            from geodml.engine.worker import Worker
            worker = Worker.of(model, flat, train_x=train_x, train_y=train_y, optim=optim, channels_last=channels_last)
        # the process's worker (geodml.engine.worker): minibatch buffers shared by its partitions
        self.worker = worker
        self.xb, self.yb, self.idx, self.twin = worker.xb, worker.yb, worker.idx, worker.twin
        self.shard = slice(self.rank, None, self.world_size)
        self.wall_t0 = time.monotonic()
        self.resumed_wall_s = 0.0  # the training wall time a restored checkpoint had recorded (0: a fresh run)
        self.diverged_at_step: int | None = None  # --divergence-loss ended the loop after this step
        self.interrupt_signum = 0  # a signal some rank received, learnt at a log line: the run ends there (geodml.interrupt)
        self._grad_keep: torch.Tensor | None = None  # --divergence-loss: the gradient across its check's wait

    # ---- checkpoint ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything the loop continues from (tensors and plain values only: ``weights_only`` loads it)."""
        s = self.sampler.state_dict()
        return {
            "model": {k: v.detach().clone().cpu() for k, v in self.model.state_dict().items()},
            "algo": self.algo.state_dict(),
            "sampler": {"rng": s["rng"], "order": torch.from_numpy(np.asarray(s["order"], dtype=np.int64).copy()),
                        "pos": s["pos"]},
            "train_state": dataclasses.asdict(self.state),
            "torch_rng": torch.get_rng_state(),
            "comm": self.comm.state_dict(),
            "skewscout": self.skewscout.state_dict() if self.skewscout is not None else None,
            "wall_s": time.monotonic() - self.wall_t0,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (a ``state_dict()``); KeyError/RuntimeError/TypeError when it does not fit."""
        self.model.load_state_dict(state["model"])  # copies into the flat-buffer views
        self.algo.load_state_dict(state["algo"])
        s = state["sampler"]
        self.sampler.load_state_dict({"rng": s["rng"], "order": np.asarray(s["order"]), "pos": s["pos"]})
        ts = state["train_state"]  # in place: the exporter holds this object (old checkpoints' "history" is ignored)
        st = self.state
        st.step, st.loss_sum, st.loss_count = int(ts["step"]), float(ts["loss_sum"]), int(ts["loss_count"])
        st.correct, st.seen, st.local_train_loss = int(ts["correct"]), int(ts["seen"]), float(ts["local_train_loss"])
        torch.set_rng_state(state["torch_rng"])
        if state.get("comm") is not None:
            self.comm.load_state_dict(state["comm"])
        if self.skewscout is not None:
            self.skewscout.load_state_dict(state["skewscout"])
        self.resumed_wall_s = float(state.get("wall_s", 0.0))
        self.wall_t0 = time.monotonic() - self.resumed_wall_s

    # ---- the loop ----------------------------------------------------------------------
    def train_step(self, step: int) -> float:
        lr = learning_rate(self.optim, step, self.spe, self.total_steps)
        work = self.algo.work
        if not work.computes(step):
            if self.algo.idle_steps_read_grad:
                self.flat.zero_grad()
            self._check_divergence(step)
            self.algo.step(step, lr)
            return lr
        with _STEP_SLOTS:
            loss, correct, compute_s = local_gradient(self, work.batch_indices(step, self.sampler),
                                                      lambda labels: work.sample_weights(labels, step))
        self.comm.advance_compute(compute_s if self.compute_s_per_step is None else self.compute_s_per_step)
        s = self.state
        s.loss_sum += loss
        s.loss_count += 1
        s.correct += correct
        s.seen += len(self.yb)
        self._check_divergence(step)
        self.algo.step(step, lr)
        return lr

    def _check_divergence(self, step: int) -> None:
        """--divergence-loss: before the hooks of a step that ends in a log line, whether the mean training
        loss over every partition since the last line (this step's included) is NaN, infinite or above
        the limit (one uncharged collective: every rank answers alike, at the same step). If so, this
        step becomes the last, as in a run of ``step + 1`` steps (``Algorithm.end_after``)."""
        if self.divergence_loss is None or not logs_after(step, total_steps=self.total_steps, eval_every=self.eval_every,
                                                          log_every=self.log_every, eval_at=self.eval_at):
            return
        t = torch.tensor([self.state.loss_sum, float(self.state.loss_count)], dtype=torch.float64)
        # The reduction waits for the other partitions; when the process hosts several (geodml.engine)
        # they run meanwhile and the gradient buffer is theirs to use: keep this step's gradient aside.
        if self._grad_keep is None:
            self._grad_keep = torch.empty_like(self.flat.grad)
        self._grad_keep.copy_(self.flat.grad)
        self.comm.meta_all_reduce(t)
        self.flat.grad.copy_(self._grad_keep)
        if diverged(float(t[0]), float(t[1]), self.divergence_loss):
            self.diverged_at_step = step + 1
            self.algo.end_after(step)

    def run(self) -> dict:
        self.model.train()
        s = self.state
        lr = self.optim.lr
        while s.step < self.total_steps:
            lr = self.train_step(s.step)
            s.step += 1
            if self.skewscout is not None:
                decision = self.skewscout.maybe_run(s.step)
                if decision:  # rank 0 only
                    self.sink.log({"step": s.step, "epoch": s.step / self.spe, "emulated_s": self._emulated_s(),
                                   "wall_s": time.monotonic() - self.wall_t0, **decision})
            stop = self.diverged_at_step is not None  # this step was made the last (_check_divergence)
            if s.step < self.total_steps and not stop:  # the last step is logged by _finish, with the final evaluation
                do_eval = s.step % self.eval_every == 0 or s.step in self.eval_at
                if do_eval or s.step % self.log_every == 0:
                    self._log(lr, with_eval=do_eval)
            for hook in self.step_hooks:   # (the checkpointer writes one at an interrupted step too)
                hook(self)
            if self.interrupt_signum:
                raise Interrupted(self.interrupt_signum, s.step, self.total_steps)
            if stop:
                break
        self.algo.finish()
        return self._finish(lr)

    # ---- metrics -----------------------------------------------------------------------
    def _emulated_s(self) -> float:
        return float(self.comm.emulated_s)

    def _log(self, lr: float, *, with_eval: bool) -> dict:
        s = self.state
        local = torch.tensor([s.loss_sum, float(s.loss_count), float(s.correct), float(s.seen),
                              float(self.comm.ledger.wan_bytes)], dtype=torch.float64)
        self.comm.meta_all_reduce(local)
        mine = requested()
        seen = self.comm.meta_all_gather_object((self._emulated_s(), mine))
        emu = max(e for e, _ in seen)
        self.interrupt_signum = mine or max(signum for _, signum in seen)   # every rank stops here alike
        rec = {
            "step": s.step,
            "epoch": s.step / self.spe,
            "emulated_s": emu,
            "wall_s": time.monotonic() - self.wall_t0,
            "train_loss": float(local[0]) / max(float(local[1]), 1.0),
            "train_accuracy": float(local[2]) / max(float(local[3]), 1.0),
            "lr": lr,
            "wan_bytes_total": int(local[4]),
        }
        rec.update(self.algo.stats())
        if with_eval:
            rec["val_accuracy"], rec["val_loss"] = self.evaluate_global()
        if s.loss_count:
            s.local_train_loss = s.loss_sum / s.loss_count
        s.loss_sum = s.loss_count = s.correct = s.seen = 0
        self.sink.log(rec)
        return rec

    @contextmanager
    def _global_model(self) -> Iterator[None]:
        """The model bound to the global model for the body (uncharged bookkeeping): the weights of
        ``algo.global_model_rank`` when it names one, else the partitions' average, and the average
        of the float buffers. Computed into the worker's scratch model (geodml.engine.worker), so the
        partition's own weights are never touched; the body runs within this partition's turn."""
        k = self.world_size
        agree = self.algo.models_agree
        if agree and not self.flat.float_buffers:  # the partition's own model is the global one
            yield
            return
        src = None if agree else self.algo.global_model_rank
        g, packed = self.worker.global_view()
        # one collective over what differs between partitions (the weights unless they agree, the float
        # buffers): the scratch model holds nothing across a wait, so it is filled once, after it
        part = packed if not agree else packed[self.flat.numel:]
        if not agree:
            g.data.copy_(self.flat.data)
        for gb, b in zip(g.float_buffers, self.flat.float_buffers):
            gb.copy_(b)
        if src is None:
            self.comm.meta_all_reduce(part)
            part.div_(k)
        else:
            self.comm.meta_broadcast(part, src)
        if agree:
            g.data.copy_(self.flat.data)
        for gb, b in zip(g.buffers, self.flat.buffers):  # step counters: the partition's own
            if not b.is_floating_point():
                gb.copy_(b)
        self.worker.bind(g)
        try:
            yield
        finally:
            self.worker.bind(self.flat)

    def evaluate_global(self) -> tuple[float, float]:
        """Accuracy and loss of the global model on the whole test set (sharded over ranks)."""
        with self._global_model():
            correct, loss_sum = evaluate(self.model, self.test_x[self.shard], self.test_y[self.shard])
        t = torch.tensor([float(correct), loss_sum], dtype=torch.float64)
        self.comm.meta_all_reduce(t)
        n = len(self.test_y)
        return float(t[0] / n), float(t[1] / n)

    def global_state_dict(self, *, keep: bool = True) -> dict:
        """The global model's state_dict (call on every rank: it uses collectives); ``keep=False``: take
        part in the collectives and return ``{}`` (the ranks that do not write model.pt: a process
        hosting 1,000 partitions copied the model 1,000 times for one file)."""
        with self._global_model():
            if not keep:
                return {}
            return {k: v.detach().clone().cpu() for k, v in self.model.state_dict().items()}

    def _finish(self, lr: float) -> dict:
        final = self._log(lr, with_eval=True)
        if self.partition_scores == "auto" and self.algo.partitions_hold_global_models:
            # every partition holds a copy of a global model: its own score would repeat one (--partition-scores)
            self.comm.meta_all_gather_object(None)  # the ranks stay in step with a run that scores
            return {"final": final, "per_rank_val_accuracy": None, "per_rank_train_accuracy": None,
                    "diverged_at_step": self.diverged_at_step}
        # Each partition's own model: on the test set (or --partition-eval-examples of it), and on its own training data.
        rows = self.own_eval_indices
        if self.eval_cache is not None:
            own_correct, _ = self.eval_cache.evaluate(self.model, self.test_x, self.test_y, rows)
        else:
            own_correct, _ = evaluate(self.model, self.test_x, self.test_y, indices=rows)
        local = torch.from_numpy(self.sampler.indices).to(self.train_x.device)
        train_correct, _ = evaluate(self.model, self.train_x, self.train_y, indices=local)
        scored = len(self.test_y) if rows is None else len(rows)
        per_rank = self.comm.meta_all_gather_object((own_correct / scored, train_correct / len(local)))
        return {"final": final, "per_rank_val_accuracy": [v for v, _ in per_rank],
                "per_rank_train_accuracy": [t for _, t in per_rank], "diverged_at_step": self.diverged_at_step}
