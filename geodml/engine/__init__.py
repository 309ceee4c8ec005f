"""The engine: how a process trains the block of partitions it hosts (docs/design.md "Per-partition state
and the engine").

One code path for every algorithm, feature and process count. A process hosts a contiguous block
of the P partitions (geodml.comm.crossproc.blocks: all of them with one process, one with P
processes); each hosted partition is a task of the process's :class:`~geodml.engine.hub.Hub`
running the one training loop (geodml.trainer.Trainer) with its own parts (geodml.parts) and its
own Comm, and the tasks take turns on the process's one thread. With one hosted partition (one
partition per process, torchrun's default) its Comm is a DistComm (torch.distributed and
ZeroMQ); with several it is their in-process group's, linked to the other processes' blocks
(geodml.comm.crossproc). The same bytes, messages and emulated seconds are charged either way.

:func:`host` is the engine's entry: join the job, build the Comm group, start the metrics exporter,
run the hosted partitions' tasks, and return the summary (process 0; partition 0 writes the run
directory). geodml.compose is the composition root that calls it after the preflight.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from geodml.comm.api import CommError
from geodml.config import RunConfig
from geodml.engine.hub import Hub
from geodml.engine.job import InputError, joined
from geodml.engine.worker import Worker
from geodml.parts import DeviceData, Preflight, Startup, build_worker, start_process_exporter
from geodml.runtime import Env

if TYPE_CHECKING:

    from geodml.comm.api import RunComm
    from geodml.metrics.prometheus import RankExporter
    from geodml.parts import Parts
    from geodml.trainer import EvalCache


def host(cfg: RunConfig, env: Env, pre: Preflight, *, device_name: str) -> dict | None:
    """Train this process's block of the partitions (module docstring) on ``device_name``; the
    summary on process 0 (None elsewhere)."""
    from geodml.comm.crossproc import blocks

    P, R = len(pre.partitions), env.world_size
    block = blocks(P, R)[env.rank]
    torch.set_num_threads(cfg.threads)
    wall_t0 = time.monotonic()
    startup = Startup()  # per-rank start-up breakdown -> rank<k>/startup.json (docs/launch.md)
    from geodml.interrupt import Interrupted
    with joined(cfg, env, pre.backend, device_name) as (device, out):
        startup.lap("process_group_s")
        try:
            if P == R:
                return _one_partition(cfg, env, pre, out=out, device=device, startup=startup, wall_t0=wall_t0)
            return _hosted(cfg, env, pre, block=block, out=out, device=device, wall_t0=wall_t0)
        except Interrupted as stop:
            stop.out = out   # for the CLI's line: where the checkpoint is
            raise


def _one_partition(cfg: RunConfig, env: Env, pre: Preflight, *, out: Path, device: torch.device, startup: Startup,
                   wall_t0: float) -> dict | None:
    """One partition in this process: one task, whose Comm is a DistComm (built by geodml.parts)."""
    hub = Hub()
    task = hub.spawn(lambda: train_partition(cfg, env, pre, out=out, device=device, startup=startup,
                                             wall_t0=wall_t0, processes=env.world_size), name=f"partition {env.rank}")
    hub.run()
    if task.error is not None:
        raise task.error
    return task.result


def _hosted(cfg: RunConfig, env: Env, pre: Preflight, *, block: range, out: Path, device: torch.device,
            wall_t0: float) -> dict | None:
    """Several partitions in this process: one task each over an in-process group linked to the
    other processes. Partition p's task is "rank p" of the run; partition 0 (in process 0) writes the
    run directory. On a GPU (``--device cuda``) the process's partitions share its GPU and one copy
    of the dataset there."""
    from geodml.comm import build_hosted_group
    from geodml.metrics.prometheus import MetricsError
    from geodml.runtime import collective_device
    from geodml.trainer import EvalCache

    P, R = len(pre.partitions), env.world_size
    summaries: dict[int, dict | None] = {}
    with ExitStack() as stack:
        group_box: list = []

        def on_error(exc: BaseException) -> None:
            from geodml.interrupt import Interrupted
            if isinstance(exc, Interrupted):
                return   # every hosted partition stops at this step by itself; the group stays up for them
            if group_box:
                group_box[0].abort(f"a partition failed: {type(exc).__name__}: {exc}")

        hub = Hub(external=lambda: R > 1 or cfg.comm.wan == "real", on_error=on_error)
        # A wait on a peer may last as long as the other hosted partitions' work in turn: the bound on
        # any wait (--comm-timeout) is scaled by the block's size.
        group = build_hosted_group(dataclasses.replace(cfg.comm, timeout_s=cfg.comm.timeout_s * len(block)),
                                   partitions=P, process=env.rank, processes=R, topology=pre.topology,
                                   device=collective_device(pre.backend), hub=hub)
        group_box.append(group)
        stack.callback(group.close)  # also when a step below fails (closing twice is a no-op)
        eval_cache = EvalCache()  # partitions holding the same model are evaluated once
        assert pre.dataset is not None
        tensors = DeviceData.of(pre.dataset, device)  # one copy on the device for every hosted partition
        try:
            exporter = start_process_exporter(cfg, env, out, stack, partitions=P, device=device, wire_rejected=(
                group.cross.wire_rejected if group.cross is not None else None))
        except MetricsError as exc:
            raise InputError(str(exc)) from None
        if device.type == "cuda":
            torch.cuda.set_device(device)
        worker = build_worker(cfg, pre.dataset, tensors, device)  # one model for the partitions, bound in turn
        model_files = ModelFiles()

        def partition(p: int) -> None:
            penv = Env(rank=p, world_size=P, local_rank=p - block.start, local_world_size=len(block),
                       under_torchrun=False)
            summaries[p] = train_partition(cfg, penv, pre, out=out, device=device, startup=Startup(), wall_t0=wall_t0,
                                           comm=group.comm(p), eval_cache=eval_cache, host_exporter=exporter,
                                           tensors=tensors, worker=worker, model_files=model_files, processes=R)

        for p in block:
            hub.spawn(lambda p=p: partition(p), name=f"partition {p}", enter=lambda p=p: worker.enter(p))
        try:
            tasks = hub.run()
        finally:
            group.close()
        errors = [t.error for t in tasks if t.error is not None]
        if errors:
            first = next((e for e in errors if not isinstance(e, CommError)), errors[0])
            if isinstance(first, ValueError) and not isinstance(first, InputError):
                raise InputError(str(first)) from None
            raise first
    return summaries.get(0)


def train_partition(cfg: RunConfig, env: Env, pre: Preflight, *, out: Path, device: torch.device, startup: Startup,
                    wall_t0: float, comm: RunComm | None = None, eval_cache: EvalCache | None = None,
                    host_exporter: RankExporter | None = None, tensors: DeviceData | None = None,
                    worker: Worker | None = None, model_files: ModelFiles | None = None,
                    processes: int = 1) -> dict | None:
    """Build one partition's parts, train, finish (closes what it opened); the summary on rank 0."""
    from geodml.parts import build_parts
    with ExitStack() as stack:
        try:
            parts = build_parts(cfg, env, pre, out=out, device=device, stack=stack, startup=startup, comm=comm,
                                eval_cache=eval_cache, host_exporter=host_exporter, tensors=tensors, worker=worker,
                                processes=processes)
        except ValueError as exc:  # set-up reads only inputs: a ValueError here is a bad input, not a bug
            raise InputError(str(exc)) from None
        startup.lap("model_s")
        startup.done()
        result = parts.trainer.run()
        parts.sink.close()
        return finish_partition(cfg, env, parts, result, wall_t0=wall_t0, startup=startup, model_files=model_files)


class ModelFiles:
    """The partitions' rank<k>/model.pt files of one process: a model already saved by another hosted
    partition (FedAvg's participants after an average, partitions holding the same stale global
    model, DGC's one model) is a hard link to that file instead of another copy (a copy where the
    file system has no hard links)."""

    SAMPLES = 64
    """Values per tensor in the cheap key; a key match is confirmed by comparing every value."""

    def __init__(self) -> None:
        self._saved: dict[bytes, list[tuple[Path, dict[str, torch.Tensor]]]] = {}

    @classmethod
    def _key(cls, state: dict[str, torch.Tensor]) -> bytes:
        parts = []
        for name, t in state.items():
            flat = t.reshape(-1)
            sample = flat[::max(1, flat.numel() // cls.SAMPLES)].cpu()
            parts.append(f"{name}:{t.dtype}:{tuple(t.shape)}".encode() + sample.numpy().tobytes())
        return b"|".join(parts)

    def save(self, model: torch.nn.Module, path: Path) -> None:
        """Save ``model``'s state to ``path``, or link it to an equal one saved before. Equality is
        exact (``torch.equal`` of every tensor, after a key of a few sampled values: at P = 1,000 a
        hash of every model cost 10% of a run); the saved partitions' tensors stay alive for the
        process's life anyway, so keeping references to them costs nothing."""
        from geodml import rundir
        state = {k: v.detach() for k, v in model.state_dict().items()}
        candidates = self._saved.setdefault(self._key(state), [])
        first = next((p for p, other in candidates if all(torch.equal(other[k], v) for k, v in state.items())), None)
        if first is None:
            rundir.save_torch(path, {k: v.cpu() for k, v in state.items()})
            candidates.append((path, state))
            return
        path.unlink(missing_ok=True)
        try:
            os.link(first, path)
        except OSError:
            shutil.copyfile(first, path)


def finish_partition(cfg: RunConfig, env: Env, parts: Parts, result: dict, *, wall_t0: float,
                     startup: Startup, model_files: ModelFiles | None = None) -> dict | None:
    """Totals (uncharged bookkeeping) and the run directory; the summary on rank 0."""
    from geodml import rundir
    from geodml.comm.collectives import ring_allreduce_wan_bytes
    from geodml.comm.ledger import PEAK_WINDOW_S, Ledger

    comm, out, trainer = parts.comm, parts.out, parts.trainer
    global_sd = trainer.global_state_dict(keep=env.rank == 0)   # rank 0 writes it
    ledgers = comm.meta_all_gather_object(comm.ledger.rows())
    windows = comm.meta_all_gather_object(comm.ledger.window_bytes())
    emulated_s = max(comm.meta_all_gather_object(float(comm.emulated_s)))
    own = rundir.rank_dir(out, env.rank)
    (model_files or ModelFiles()).save(parts.model, own / rundir.MODEL)
    rundir.write_json(own / rundir.STARTUP, startup.report(rank=env.rank, local_rank=env.local_rank))
    if env.rank != 0:
        return None
    rows = [r for rank_rows in ledgers for r in rank_rows]
    flat = parts.flat
    bsp_bytes = trainer.state.step * ring_allreduce_wan_bytes(flat.numel, flat.data.element_size(),
                                                              comm.region_of_rank)
    totals = {**Ledger.summarize(rows), "wan_peak_bps_by_link": Ledger.peaks(windows) if cfg.comm.wan != "off" else None,
              "peak_window_s": PEAK_WINDOW_S}
    summary = rundir.make_summary(cfg, world_size=env.world_size, result=result, totals=totals,
                                  # a resumed run: the wall time before its checkpoint, then this process's
                                  emulated_s=emulated_s, wall_s=trainer.resumed_wall_s + time.monotonic() - wall_t0,
                                  steps=trainer.state.step,
                                  steps_per_epoch=parts.steps_per_epoch, bsp_bytes=bsp_bytes, algo=parts.algo,
                                  skewscout=parts.skewscout.summary() if parts.skewscout is not None else {})
    rundir.save_torch(out / rundir.MODEL, global_sd)
    if cfg.tensorboard:   # after metrics.jsonl, before summary.json (written last: "finished")
        from geodml.metrics.tensorboard import run_log_dir, write_summary_events
        write_summary_events(run_log_dir(cfg.tensorboard, out), summary)
    rundir.write_json(out / rundir.SUMMARY, summary)
    print(rundir.done_text(summary, out), flush=True)
    return summary
