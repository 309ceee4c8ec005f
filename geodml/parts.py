"""The builder of a run's parts (docs/design.md "How a run flows", steps 1-4): the Comm, the metric
sinks and exporter, the data and its partitions, the model, the algorithm, SkewScout, the
checkpointer and the trainer, wired together and registered for teardown.

``geodml.compose`` is the composition root that calls :func:`build_parts` once per run; this module
holds the wiring so that ``run()`` stays a short list of phases. Every part that must be closed
is pushed onto the caller's ``ExitStack`` as soon as it exists, so a failure half-way through
the build closes exactly what was opened, in reverse order.
"""

from __future__ import annotations

import functools
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from geodml import __version__, rundir
from geodml.config import RunConfig
from geodml.runtime import Env

if TYPE_CHECKING:
    from geodml.algorithms import Algorithm, FlatParams
    from geodml.comm.api import RunComm
    from geodml.comm.topology import Topology
    from geodml.data.datasets import Dataset
    from geodml.engine.worker import Worker
    from geodml.metrics.prometheus import PartitionSource, RankExporter
    from geodml.metrics.sinks import Sink
    from geodml.skewscout import SkewScout
    from geodml.trainer import EvalCache, Trainer


@dataclass(frozen=True)
class DeviceData:
    """The dataset's tensors on the training device (the CPU's are the dataset's own, not copies)."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    @classmethod
    def of(cls, ds: Dataset, device: torch.device) -> DeviceData:
        return cls(ds.train_x.to(device), ds.train_y.to(device), ds.test_x.to(device), ds.test_y.to(device))


@dataclass(frozen=True)
class Preflight:
    """What the preflight resolved once, before any process group, for the run to use as is."""

    backend: str
    """torch.distributed backend (``geodml.runtime.resolve_backend``)."""
    topology: Topology
    """The loaded topology (unscaled; the Comm applies ``--wan-scale``)."""
    region_of_rank: list[str]
    """The placement of the ranks' partitions into regions."""
    dataset: Dataset | None
    """The decoded dataset (None only from a flag-only preflight: ``preflight(..., data=False)``)."""
    partitions: list[np.ndarray]
    """Every partition's training-set indices, computed from the seed (identical on every rank)."""
    data_s: float = 0.0
    """Seconds the preflight spent decoding and partitioning (reported as the start-up's ``data_s``)."""
    own_eval_indices: torch.Tensor | None = None
    """The test rows each partition's own final model is scored on (``--partition-eval-examples``;
    None: all of them; geodml.trainer.partition_eval_indices)."""
    advice: tuple[str, ...] = ()
    """``geodml: warning:`` lines about settings that leave the run unable to measure what it prints
    (geodml.advice); rank 0 prints them before training."""

    @functools.cached_property
    def report(self) -> dict:
        """Every partition's size and label counts (geodml.data.partition.partition_report): once per
        process, for all the partitions it hosts."""
        from geodml.data.partition import partition_report
        assert self.dataset is not None, "a preflight that loaded the data"
        return partition_report(self.dataset.train_y.numpy(), self.partitions, self.dataset.num_classes)

    @functools.cached_property
    def sizes(self) -> np.ndarray:
        """Every partition's number of training examples (one array for the hosted partitions)."""
        return np.asarray([len(p) for p in self.partitions], dtype=np.int64)

    @functools.cached_property
    def label_counts(self) -> np.ndarray:
        """[P, C] training-label counts of every partition (one array, shared by the hosted partitions)."""
        return np.asarray(self.report["label_counts"], dtype=np.int64)


class Startup:
    """Per-rank start-up breakdown in seconds: process start -> run() (interpreter, imports, flag
    parsing: ``imports_s``), process group + run directory, ZeroMQ mesh, data (load + partition),
    model/algorithm/trainer set-up; plus this process's peak RSS when the report is written."""

    def __init__(self) -> None:
        import psutil
        self.laps: dict[str, float] = {"imports_s": max(0.0, time.time() - psutil.Process().create_time())}
        self._t = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = now - self._t
        self._t = now

    def moved_to_preflight(self, name: str, seconds: float) -> None:
        """A phase the preflight ran before ``run()``: count it as ``name``, not as ``imports_s``."""
        self.laps[name] = seconds
        self.laps["imports_s"] = max(0.0, self.laps["imports_s"] - seconds)

    def done(self) -> None:
        self.laps["total_s"] = sum(v for k, v in self.laps.items() if k != "total_s")

    def report(self, **extra: object) -> dict:
        import resource
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        gpu = {"peak_cuda_bytes": int(torch.cuda.max_memory_allocated())} if torch.cuda.is_initialized() else {}
        return {**extra, **{k: round(v, 4) for k, v in self.laps.items()}, "peak_rss_bytes": int(peak_kib) * 1024,
                **gpu}


@dataclass
class Parts:
    """Everything a run trains with; built by :func:`build_parts`."""

    out: Path
    comm: RunComm
    sink: Sink
    model: torch.nn.Module
    flat: FlatParams
    algo: Algorithm
    trainer: Trainer
    skewscout: SkewScout | None
    steps_per_epoch: int
    total_steps: int


def _linger_then_stop(exporter: RankExporter, cfg: RunConfig, is0: bool):
    """Exit callback: keep the exporters up ``--metrics-linger`` seconds after a successful run."""
    def exit_(exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if exc_type is None and cfg.metrics_linger_s > 0:
            if is0:
                print(f"metrics: exporters stay up {cfg.metrics_linger_s:g} s (--metrics-linger) for the last scrape",
                      flush=True)
            time.sleep(cfg.metrics_linger_s)
        exporter.stop()
        return False
    return exit_


def _start_exporter(cfg: RunConfig, env: Env, comm: RunComm, out: Path, device: torch.device,
                    stack: ExitStack) -> RankExporter | None:
    """Every rank's Prometheus exporter (``--metrics-port``); rank 0 writes the file_sd targets."""
    if not cfg.metrics_port:
        return None
    from geodml.metrics.prometheus import file_sd_groups, start_rank_exporter
    exporter, targets = start_rank_exporter(comm, rank=env.rank, local_rank=env.local_rank, base_port=cfg.metrics_port,
                                            host=cfg.metrics_host, run=out.name, algo=cfg.algo.algo, device=device)
    stack.push(_linger_then_stop(exporter, cfg, env.rank == 0))
    if env.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        rundir.write_json(out / rundir.PROMETHEUS_TARGETS,
                          file_sd_groups(targets, comm.region_of_rank, run=out.name, algo=cfg.algo.algo))
        print(f"metrics: Prometheus exporters at {', '.join(targets)} (file_sd: {out / rundir.PROMETHEUS_TARGETS})",
              flush=True)
        if env.local_world_size < env.world_size and cfg.metrics_host.startswith(("127.", "localhost", "::1")):
            print(f"metrics: warning: the job spans nodes but --metrics-host {cfg.metrics_host} is loopback: a "
                  f"Prometheus server reaches only its own node's exporters; use --metrics-host 0.0.0.0",
                  file=sys.stderr, flush=True)
    return exporter


def start_process_exporter(cfg: RunConfig, env: Env, out: Path, stack: ExitStack, *, partitions: int,
                           device: torch.device, wire_rejected: Callable[[], dict[str, int]] | None
                           ) -> RankExporter | None:
    """This process's one Prometheus exporter for the partitions it hosts (``--metrics-port`` +
    local rank; collective over the processes), labelled by partition up to
    PARTITION_LABEL_LIMIT partitions, by process and region above; process 0 writes the file_sd
    targets. Partitions join it with ``RankExporter.add_partition`` (build_parts)."""
    if not cfg.metrics_port:
        return None
    import torch.distributed as dist

    from geodml.metrics.prometheus import PARTITION_LABEL_LIMIT, RankExporter, process_sd_groups, start_together

    def all_gather(obj: object) -> list:
        if env.world_size == 1:
            return [obj]
        got: list = [None] * env.world_size
        dist.all_gather_object(got, obj)
        return got

    by_region = partitions > PARTITION_LABEL_LIMIT
    exporter = RankExporter(device=device, wire_rejected=wire_rejected,
                            group_by_region=env.rank if by_region else None)
    targets = start_together(exporter, all_gather, who=f"process {env.rank}", index=env.rank, local_index=env.local_rank,
                             base_port=cfg.metrics_port, host=cfg.metrics_host)
    stack.push(_linger_then_stop(exporter, cfg, env.rank == 0))
    if env.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        rundir.write_json(out / rundir.PROMETHEUS_TARGETS, process_sd_groups(targets, run=out.name, algo=cfg.algo.algo))
        how = (f"by process and region (more than {PARTITION_LABEL_LIMIT} partitions)" if by_region
               else "by partition")
        print(f"metrics: Prometheus exporters at {', '.join(targets)}, one per process, labelled {how} (file_sd: "
              f"{out / rundir.PROMETHEUS_TARGETS})", flush=True)
    return exporter


def partition_source(exporter: RankExporter, cfg: RunConfig, comm: RunComm, rank: int, out: Path) -> PartitionSource:
    """Hosted partition ``rank``'s source in its process's exporter."""
    return exporter.add_partition(labels={"rank": rank, "region": comm.region_of_rank[rank], "algo": cfg.algo.algo,
                                          "run": out.name},
                                  ledger_rows=comm.ledger.rows, emulated_s=lambda: float(comm.emulated_s),
                                  ledger_windows=comm.ledger.window_bytes)


def training_length(cfg: RunConfig, sizes: np.ndarray, spe: int) -> tuple[int, frozenset[int]]:
    """The run's trainer steps and its validation steps beyond --eval-every: --steps, --epochs x the
    steps per epoch, or with --rounds R the first R rounds' lengths summed (``round_steps``); --eval-at,
    plus with --eval-every-rounds N the last step of every N-th round."""
    eval_at = frozenset(int(x) for x in cfg.eval_at)
    a = cfg.fedavg
    if a.rounds is None:
        return cfg.optim.steps or max(1, round(cfg.optim.epochs * spe)), eval_at
    from geodml.algorithms.fedavg import round_steps
    lengths = round_steps(sizes, rounds=a.rounds, seed=cfg.seed, client_fraction=a.client_fraction,
                          batch_size=cfg.optim.batch_size, iter_local=cfg.fedavg_iter_local(), local_epochs=a.local_epochs,
                          virtual_client_size=a.virtual_client_size)
    ends = np.cumsum(lengths)
    if a.eval_every_rounds:
        eval_at |= frozenset(int(e) for e in ends[a.eval_every_rounds - 1::a.eval_every_rounds])
    return int(ends[-1]), eval_at


def _rank0_sinks(cfg: RunConfig, out: Path, total_steps: int) -> Sink:
    from geodml.metrics.sinks import ConsoleProgress, JsonlSink, MultiSink
    sinks: list[Sink] = [JsonlSink(out / rundir.METRICS)]
    if cfg.progress:
        sinks.append(ConsoleProgress(total_steps))
    if cfg.tensorboard:
        from geodml.metrics.tensorboard import TensorBoardSink, run_log_dir
        sinks.append(TensorBoardSink(run_log_dir(cfg.tensorboard, out)))
    return MultiSink(sinks)


def write_run_header(cfg: RunConfig, pre: Preflight, out: Path, *, comm: RunComm, world: int, device: torch.device,
                     model: torch.nn.Module, spe: int, total_steps: int, report: dict, processes: int = 1) -> None:
    """config.json and partitions.json, and the run's opening lines on the console (rank 0)."""
    from geodml.data.partition import format_partition_table
    from geodml.models import count_parameters

    config_doc = {"version": __version__, "world_size": world, "backend": pre.backend, "device": str(device),
                  "config": cfg.to_dict(), "region_of_rank": comm.region_of_rank,
                  "parameters": count_parameters(model), "steps_per_epoch": spe, "total_steps": total_steps,
                  "topology": comm.topology.to_dict() if comm.topology is not None else None,
                  "processes": processes}
    rundir.write_header(out, config_doc=config_doc, partitions=report)
    print(f"geodml {__version__}: {cfg.algo.algo} on {cfg.data.dataset}, K={world} partitions "
          f"({cfg.data.partition}), {cfg.model.model}/{cfg.model.norm} with {count_parameters(model):,} "
          f"parameters, {total_steps} steps ({spe}/epoch), {processes} process{'es' if processes > 1 else ''}, "
          f"backend {pre.backend} on {device}, wan {cfg.comm.wan}")
    print(format_partition_table(report), flush=True)


def build_worker(cfg: RunConfig, ds: Dataset, tensors: DeviceData, device: torch.device) -> Worker:
    """The process's worker (geodml.engine.worker): the model with the run's initial weights (seeded
    by the run's seed, so every partition starts from the same w_0), on ``device``."""
    from geodml.algorithms import FlatParams
    from geodml.engine.worker import Worker
    from geodml.models import build_from_config, param_multipliers
    model = build_from_config(cfg.model, ds.input_shape, ds.num_classes, generator_seed=cfg.seed,
                              pixel_std=ds.pixel_std).to(device)
    flat = FlatParams(model, param_multipliers(cfg.model, model))
    return Worker(model, flat, train_x=tensors.train_x, train_y=tensors.train_y, optim=cfg.optim,
                  channels_last=cfg.channels_last)


def build_parts(cfg: RunConfig, env: Env, pre: Preflight, *, out: Path, device: torch.device, stack: ExitStack,
                startup: Startup, comm: RunComm | None = None, eval_cache: EvalCache | None = None,
                host_exporter: RankExporter | None = None, tensors: DeviceData | None = None,
                worker: Worker | None = None, processes: int = 1) -> Parts:
    """Build every part of this rank's run (collective: every rank calls it in the same order).
    ``env`` is the partition's view (rank = partition, world size = partitions); ``comm``, when
    given, is the partition's in-process Comm (geodml.compose hosts several partitions in one process);
    ``tensors``: the dataset already on ``device``, shared by the partitions a process hosts;
    ``worker``: the process's model and shared buffers (geodml.engine.worker; None: one of its own)."""
    from geodml.algorithms import AlgoContext, build_algorithm
    from geodml.checkpoint import Checkpointer, find_resume_step, fingerprint, resume_requested, truncate_metrics
    from geodml.comm import build_comm
    from geodml.metrics.sinks import MultiSink, Sink
    from geodml.peerwatch import fault_hook_from_env
    from geodml.runtime import collective_device
    from geodml.trainer import Schedule, TrainData, Trainer, steps_per_epoch

    rank, world, is0 = env.rank, env.world_size, env.rank == 0
    if comm is None:
        comm = build_comm(cfg.comm, rank=rank, world_size=world, device=collective_device(pre.backend),
                          topology=pre.topology)
    stack.callback(comm.close)
    startup.lap("zmq_mesh_s")
    exporter: RankExporter | PartitionSource | None = (
        partition_source(host_exporter, cfg, comm, rank, out) if host_exporter is not None
        else _start_exporter(cfg, env, comm, out, device, stack))

    # Data: decoded and partitioned by the preflight (every rank computed ALL partitions from the seed).
    ds, parts = pre.dataset, pre.partitions
    assert ds is not None, "build_parts needs a preflight that loaded the data"
    labels = ds.train_y.numpy()
    report = pre.report
    startup.moved_to_preflight("data_s", pre.data_s)

    t = tensors or DeviceData.of(ds, device)
    if worker is None:  # this partition alone in its process: a worker of its own
        worker = build_worker(cfg, ds, t, device)
    model, flat = worker.model, worker.new_partition(rank)  # the model is bound to this partition's weights
    spe = steps_per_epoch(len(labels), world, cfg.optim.batch_size)
    total_steps, eval_at = training_length(cfg, pre.sizes, spe)
    ctx = AlgoContext(rank=rank, world_size=world, seed=cfg.seed, steps_per_epoch=spe, total_steps=total_steps,
                      batch_size=cfg.optim.batch_size, label_counts=pre.label_counts, shared=worker.shared)
    algo = build_algorithm(cfg, flat=flat, comm=comm, ctx=ctx)
    fp = fingerprint(cfg, world)
    resume_step = find_resume_step(out, world, fp) if resume_requested(cfg) else None
    if len(set(comm.meta_all_gather_object(resume_step))) != 1:
        raise RuntimeError("ranks disagree on the checkpoint step to resume from (is --out on a shared file system?)")
    if is0 and resume_requested(cfg):  # the lines after the checkpoint are written again
        truncate_metrics(out / rundir.METRICS, resume_step or 0)
    if is0 and cfg.reliability.restart:   # afresh: nothing of the unfinished run is kept (before any rank trains)
        from geodml.checkpoint import checkpoint_files
        for old in checkpoint_files(out):
            old.unlink(missing_ok=True)
        truncate_metrics(out / rundir.METRICS, 0)

    sink: Sink = Sink()
    if is0:
        rundir.rank_dir(out, rank).mkdir(parents=True, exist_ok=True)
        write_run_header(cfg, pre, out, comm=comm, world=world, device=device, model=model, spe=spe,
                         total_steps=total_steps, report=report, processes=processes)
        sink = _rank0_sinks(cfg, out, total_steps)
    stack.callback(sink.close)
    rundir.rank_dir(out, rank).mkdir(parents=True, exist_ok=True)

    data = TrainData(train_x=t.train_x, train_y=t.train_y, test_x=t.test_x, test_y=t.test_y,
                     local_indices=parts[rank], own_eval_indices=pre.own_eval_indices)
    skewscout = None
    if cfg.skewscout.enabled:
        from geodml.skewscout import ModelTraveler, SkewScout
        traveler = ModelTraveler(rank=rank, world_size=world, model=model, flat=flat, comm=comm,
                                 train_x=data.train_x, train_y=data.train_y, local_indices=parts[rank],
                                 samples=cfg.skewscout.samples(world), seed=cfg.seed, visitor=worker.visitor())
        skewscout = SkewScout(cfg=cfg.skewscout, algo=algo, traveler=traveler, comm=comm, rank=rank, world_size=world,
                              model_bytes=flat.numel * flat.data.element_size(), total_steps=total_steps,
                              seed=cfg.seed)
    if exporter is not None:
        sink = MultiSink([sink, exporter])  # every rank: the exporter keeps the last validation accuracy
    checkpointer = Checkpointer(out, rank=rank, world_size=world, every_steps=cfg.reliability.checkpoint_every, fp=fp)
    step_hooks = [h for h in (checkpointer, fault_hook_from_env(rank)) if h is not None]
    schedule = Schedule(optim=cfg.optim, total_steps=total_steps, steps_per_epoch=spe, eval_every=cfg.eval_every,
                        log_every=cfg.log_every, seed=cfg.seed, eval_at=eval_at,
                        divergence_loss=cfg.reliability.divergence_loss, partition_scores=cfg.partition_scores,
                        compute_s_per_step=cfg.comm.compute_s_per_step)
    trainer = Trainer(model=model, flat=flat, algo=algo, comm=comm, data=data, schedule=schedule, sink=sink,
                      skewscout=skewscout, step_hooks=step_hooks, eval_cache=eval_cache, worker=worker)
    if resume_step is not None:
        checkpointer.restore(trainer, resume_step)
        if is0:
            print(f"resumed from step {resume_step} (checkpoints in {out}/rank<k>/)", flush=True)
    if exporter is not None:  # read at scrape time, nothing per step
        exporter.watch(state=trainer.state, algo=algo, accuracy_loss=None if skewscout is None else
                       (lambda: float(skewscout.msg[0]) if skewscout.rounds else None))
    return Parts(out=out, comm=comm, sink=sink, model=model, flat=flat, algo=algo, trainer=trainer,
                 skewscout=skewscout, steps_per_epoch=spe, total_steps=total_steps)
