"""One run, end to end: the composition root (DESIGN.md "How a run flows").

    preflight(cfg, env)  every check that needs no process group; resolves backend, topology and
                         placement once and hands them on (a bad input stops here, exit 2)
    run(cfg, env, pre)   process group and run directory -> build_parts (geodml.parts) -> train
                         -> finish (summary.json, models) -> teardown in reverse order (ExitStack)

The run-directory files and their writers are geodml.rundir's; the wiring of the parts is
geodml.parts'.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from geodml import rundir
from geodml.comm.api import CommError
from geodml.config import RunConfig
from geodml.parts import DeviceData, Parts, Preflight, Startup, build_parts, start_process_exporter
from geodml.runtime import Env

if TYPE_CHECKING:
    from geodml.comm.api import RunComm
    from geodml.data.datasets import Dataset
    from geodml.metrics.prometheus import RankExporter
    from geodml.trainer import EvalCache


class InputError(ValueError):
    """A bad input found during set-up, after the process group exists (a port taken between the
    preflight and the exporter's start, a checkpoint the ranks disagree on, a bind address). The
    CLI prints it once (rank 0) and every rank exits 2; a rank other than the one that found it
    learns it through the peer watch (geodml.peerwatch)."""


def preflight(cfg: RunConfig, env: Env, *, data: bool = True) -> Preflight:
    """Everything that can be checked before a process group exists (raises ValueError), resolved
    once and handed on: backend, topology and placement, the decoded dataset and every partition
    (``data=False`` skips decoding and partitioning: the study runners' cheap flag check).
    Every rank of a node sees the same answers, so a bad input stops every rank alike."""
    from geodml.checkpoint import check_before_start as check_checkpoints
    from geodml.checkpoint import restarting, resume_requested
    from geodml.comm.topology import load_topology
    from geodml.data.datasets import check_dataset_available
    from geodml.runtime import resolve_backend
    from geodml.trainer import partition_eval_indices

    partitions = check_partitions(cfg, env)
    backend = resolve_backend(cfg.backend, env.local_world_size, hosting_device(cfg, partitions, env.world_size))
    if cfg.skewscout.enabled and partitions < 2:
        raise ValueError("--skewscout travels models between partitions: run at least 2 processes (torchrun --nproc_per_node=K)")
    rundir.check_out_dir(cfg.out, restarting=restarting())
    check_dataset_available(cfg.data.dataset, cfg.data.data_dir)
    topology = load_topology(cfg.comm.topology)
    regions = topology.placement(partitions)
    check_checkpoints(cfg, partitions)  # --resume/--checkpoint-every flags and checkpoint files
    if cfg.metrics_port:
        _check_metrics_ports(cfg.metrics_port, cfg.metrics_host, env.local_world_size)
    if not data:
        rundir.check_not_crashed(cfg.out, resume=resume_requested(cfg))
        return Preflight(backend=backend, topology=topology, region_of_rank=regions, dataset=None, partitions=[])
    t0 = time.monotonic()
    dataset, parts = _load_and_partition(cfg, partitions)
    own_eval = partition_eval_indices(len(dataset.test_y), cfg.partition_eval_examples, cfg.seed)
    rundir.check_not_crashed(cfg.out, resume=resume_requested(cfg))
    return Preflight(backend=backend, topology=topology, region_of_rank=regions, dataset=dataset, partitions=parts,
                     data_s=time.monotonic() - t0, own_eval_indices=own_eval)


def check_partitions(cfg: RunConfig, env: Env) -> int:
    """The number of partitions P (``--partitions``, default the number of processes R). P = R: one
    partition per process. P > R: each process hosts a contiguous block of partitions as threads
    over an in-process Comm linked to the other processes (geodml.comm.crossproc), with one
    Prometheus exporter per process; on the device :func:`hosting_device` names."""
    partitions = cfg.partitions or env.world_size
    if partitions < env.world_size:
        raise ValueError(f"--partitions {partitions} is fewer than the {env.world_size} processes; every process "
                         "hosts at least one partition: use --partitions >= the number of processes")
    if cfg.engine == "pool":
        from geodml.pool import pool_refusal
        why = pool_refusal(cfg)
        if why is not None:
            raise ValueError(f"--engine pool does not run {why}; use --engine threads (or auto)")
    if cfg.vmap and cfg.algo.algo != "fedavg":
        raise ValueError(f"--vmap applies to --algo fedavg only (it stacks the participants' gradients on the pool "
                         f"engine), not to --algo {cfg.algo.algo}: leave out --vmap")
    if cfg.vmap and engine(cfg, partitions, env.world_size) != "pool":
        from geodml.pool import pool_refusal
        why = ("--engine threads" if cfg.engine == "threads" else pool_refusal(cfg)
               or f"one partition per process (--partitions {partitions} over {env.world_size} process(es))")
        raise ValueError(f"--vmap needs the pool engine, which this run does not use: {why}")
    if partitions > env.world_size and cfg.backend == "nccl" and cfg.device != "cuda":
        raise ValueError(f"--backend nccl with --partitions {partitions} over {env.world_size} process(es): hosted "
                         "partitions train on the CPU unless --device cuda; add --device cuda, or use --backend auto")
    return partitions


def hosting_device(cfg: RunConfig, partitions: int, processes: int) -> str:
    """The ``--device`` the processes run on. One partition per process: ``--device`` as given.
    P > R: hosted partitions go to a GPU only with ``--device cuda`` (one GPU per process under
    NCCL, or shared GPUs over gloo, as for one partition per process); ``auto`` keeps them on the
    CPU, because the hosted GPU path has not yet been measured against the CPU on a GPU
    (tests/test_cuda.py holds that check; docs/performance.md says where it stands)."""
    if partitions > processes and cfg.device != "cuda":
        return "cpu"
    return cfg.device


def engine(cfg: RunConfig, partitions: int, processes: int) -> str:
    """The engine that runs the partitions: ``--engine``; auto: pool when P > R and it applies."""
    if cfg.engine != "auto":
        return cfg.engine
    from geodml.pool import pool_refusal
    return "pool" if partitions > processes and pool_refusal(cfg) is None else "threads"


def _check_metrics_ports(base: int, host: str, local_world_size: int) -> None:
    """Every port this node's exporters will listen on must be free (each rank probes all of them,
    so every rank gives the same answer; the probes bind without listening, so they do not
    collide with each other, only with a program that serves the port)."""
    import socket

    last = base + local_world_size - 1
    if last > 65535:
        raise ValueError(f"--metrics-port {base}: the {local_world_size} ranks of this node need ports up to "
                         f"{last}; choose a base <= {65536 - local_world_size}")
    for port in range(base, last + 1):
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ValueError(f"--metrics-host {host}: cannot resolve it ({exc.strerror or exc})") from None
        family, _, _, _, addr = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(addr)
            except OSError as exc:
                raise ValueError(f"--metrics-port {base}: port {port} (base + local rank {port - base}) on {host} is not "
                                 f"free ({exc.strerror or exc}); choose another --metrics-port, or 0 for no exporters") from None


def _load_and_partition(cfg: RunConfig, world_size: int) -> tuple[Dataset, list[np.ndarray]]:
    """Decode the dataset (through the shared cache) and compute ALL partitions from the seed."""
    from geodml.data.datasets import load_dataset, resolve_cache_dir
    from geodml.data.partition import make_partitioner

    ds = load_dataset(cfg.data.dataset, cfg.data.data_dir, seed=cfg.seed,
                      cache_dir=resolve_cache_dir(cfg.data.cache))  # decoded once per machine, mapped by all
    labels = ds.train_y.numpy()
    parts = make_partitioner(cfg.data).split(labels, world_size, np.random.default_rng([cfg.seed, 0xDA7A]))
    empty = [k for k, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ValueError(f"{len(empty)} of {world_size} partitions would be empty (partition {empty[0]} first): "
                         f"--dataset {cfg.data.dataset} has {len(labels)} training samples and --partition "
                         f"{cfg.data.partition} leaves some partitions none; run fewer processes or choose another --partition")
    return ds, parts


@contextmanager
def _peer_watch(cfg: RunConfig, env: Env) -> Iterator[None]:
    """Heartbeats between ranks (geodml.peerwatch) for the body; a peer's death surfaces in the
    body as a comm error, which the watch then names (exits non-zero itself when it does)."""
    if env.world_size < 2 or not env.under_torchrun:
        yield
        return
    from geodml.peerwatch import PeerWatch, looks_like_peer_loss, stopped_from_outside
    watch = PeerWatch(rank=env.rank, world_size=env.world_size, timeout_s=cfg.reliability.peer_timeout_s).start()
    main = threading.current_thread() is threading.main_thread()  # signal handlers live in the main thread
    previous = signal.signal(signal.SIGTERM, stopped_from_outside(watch, env.rank)) if main else None
    try:
        yield
    except InputError as failure:
        watch.mark_failed(input_error=str(failure))  # the peers exit 2 too; rank 0 prints it
        watch.stop(done=False)
        raise
    except BaseException as failure:
        if looks_like_peer_loss(failure):
            watch.await_verdict()
        else:
            watch.mark_failed()
        watch.stop(done=False)
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    watch.stop(done=True)


@contextmanager
def _joined(cfg: RunConfig, env: Env, backend: str, device: str) -> Iterator[tuple[torch.device, Path]]:
    """This process in the job for the body: every rank joined (or a StartupError naming the
    missing), the process group, seeds and the run directory, then the peer watch; torn down in
    reverse. Yields this rank's device and the run directory."""
    from geodml.peerwatch import fault_point
    from geodml.runtime import agree_on_out_dir, destroy_process_group, init_process_group, rendezvous, seed_everything

    with ExitStack() as stack:
        stack.callback(destroy_process_group)
        fault_point("startup", env.rank)
        store = rendezvous(env, cfg.comm.timeout_s)
        dev = init_process_group(env, backend, cfg.comm.timeout_s, device, store=store)
        seed_everything(cfg.seed, env.rank)
        out = agree_on_out_dir(env, cfg.out, cfg.algo.algo)
        # The watch starts once the process group exists: started before it, 16 ranks on 2 cores
        # showed a heartbeat silent for 30 s during the group's set-up (a false "rank 0 lost").
        with _peer_watch(cfg, env):
            yield dev, out
            fault_point("finished", env.rank, out)


def _train(cfg: RunConfig, env: Env, pre: Preflight, *, out: Path, device: torch.device, startup: Startup,
           wall_t0: float, comm: RunComm | None = None, eval_cache: EvalCache | None = None,
           host_exporter: RankExporter | None = None, tensors: DeviceData | None = None) -> dict | None:
    """Build one partition's parts, train, finish (closes what it opened); the summary on rank 0."""
    with ExitStack() as stack:
        try:
            parts = build_parts(cfg, env, pre, out=out, device=device, stack=stack, startup=startup, comm=comm,
                                eval_cache=eval_cache, host_exporter=host_exporter, tensors=tensors)
        except ValueError as exc:  # set-up reads only inputs: a ValueError here is a bad input, not a bug
            raise InputError(str(exc)) from None
        startup.lap("model_s")
        startup.done()
        result = parts.trainer.run()
        parts.sink.close()
        return _finish(cfg, env, parts, result, wall_t0=wall_t0, startup=startup)


def run(cfg: RunConfig, env: Env, pre: Preflight | None = None) -> dict | None:
    """Train this process's partitions; returns the summary on rank 0 (None elsewhere)."""
    pre = pre or preflight(cfg, env)
    hosted = len(pre.partitions) > env.world_size  # (a flag-only preflight has none: it never runs)
    if hosted and hosting_device(cfg, len(pre.partitions), env.world_size) == "cuda":
        _small_cublas_workspaces()  # before --deterministic's default, which this value also satisfies
    if cfg.deterministic:
        _deterministic()
    if engine(cfg, len(pre.partitions), env.world_size) == "pool":
        from geodml.pool import run_pool
        return run_pool(cfg, env, pre)
    if hosted:
        return _run_hosted(cfg, env, pre)
    wall_t0 = time.monotonic()
    startup = Startup()  # per-rank start-up breakdown -> rank<k>/startup.json (docs/launch.md)
    torch.set_num_threads(cfg.threads)
    with _joined(cfg, env, pre.backend, cfg.device) as (device, out):
        startup.lap("process_group_s")
        summary = _train(cfg, env, pre, out=out, device=device, startup=startup, wall_t0=wall_t0)
    return summary


def _run_hosted(cfg: RunConfig, env: Env, pre: Preflight) -> dict | None:
    """This process hosts its block of the P partitions (all of them when it is the only
    process), one thread each, over an in-process Comm (geodml.comm.inprocess) linked to the other
    processes' blocks (geodml.comm.crossproc): the same parts, trainer and run directory as P
    processes, and the same bytes, messages and emulated seconds charged. Partition p's thread is
    "rank p" of the run; partition 0 (in process 0) writes the run directory. On a GPU
    (``--device cuda``) the process's partitions share its GPU and one copy of the dataset there."""
    from geodml.comm import build_hosted_group
    from geodml.comm.crossproc import blocks
    from geodml.metrics.prometheus import MetricsError
    from geodml.runtime import collective_device
    from geodml.trainer import EvalCache

    torch.set_num_threads(cfg.threads)
    _limit_malloc_arenas()
    P, R = len(pre.partitions), env.world_size
    block = blocks(P, R)[env.rank]
    wall_t0 = time.monotonic()
    summaries: dict[int, dict | None] = {}
    errors: list[BaseException] = []
    with _joined(cfg, env, pre.backend, hosting_device(cfg, P, R)) as (device, out), ExitStack() as stack:
        # The hosted partitions share this process's cores, so a wait on a peer may last as long as
        # the others' work in turn: the bound on any wait (--comm-timeout) is scaled by the block's size.
        group = build_hosted_group(dataclasses.replace(cfg.comm, timeout_s=cfg.comm.timeout_s * len(block)),
                                   partitions=P, process=env.rank, processes=R, topology=pre.topology,
                                   device=collective_device(pre.backend))
        stack.callback(group.close)  # also when a step below fails (closing twice is a no-op)
        eval_cache = EvalCache()  # partitions holding the same model are evaluated once
        assert pre.dataset is not None
        tensors = DeviceData.of(pre.dataset, device)  # one copy on the device for every hosted partition
        try:
            exporter = start_process_exporter(cfg, env, out, stack, partitions=P, device=device, wire_rejected=(
                group.cross.wire_rejected if group.cross is not None else None))
        except MetricsError as exc:
            raise InputError(str(exc)) from None

        def partition(p: int) -> None:
            penv = Env(rank=p, world_size=P, local_rank=p - block.start, local_world_size=len(block),
                       under_torchrun=False)
            try:
                if device.type == "cuda":  # the current device is per thread (NCCL and cuDNN use it)
                    torch.cuda.set_device(device)
                summaries[p] = _train(cfg, penv, pre, out=out, device=device, startup=Startup(), wall_t0=wall_t0,
                                      comm=group.comm(p), eval_cache=eval_cache, host_exporter=exporter,
                                      tensors=tensors)
            except BaseException as exc:  # noqa: BLE001 -- re-raised in the main thread
                errors.append(exc)
                group.abort(f"partition {p} failed: {type(exc).__name__}: {exc}")

        try:
            threads = [threading.Thread(target=partition, args=(p,), name=f"geodml-partition-{p}") for p in block]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            group.close()
        if errors:
            first = next((e for e in errors if not isinstance(e, CommError)), errors[0])
            if isinstance(first, ValueError):
                raise InputError(str(first)) from None
            raise first
    return summaries.get(0)


def _deterministic() -> None:
    """``--deterministic``: kernels that give the same bits on every call. cuBLAS needs a fixed
    workspace for that, set before its first handle (so before any CUDA work; a value the user
    exported wins); cuDNN's autotuner stays off. An op with no deterministic CUDA kernel warns
    (torch's warning names it) instead of failing the run: LocalResponseNorm's backward (lenet,
    cifar-cnn) is one, and such runs may still differ in the last bits."""
    import os
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


HOSTED_GPU_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "128"}  # the latter in KiB
"""What :func:`_small_cublas_workspaces` sets for partitions hosted on a GPU (where not exported)."""


def _small_cublas_workspaces() -> None:
    """Partitions hosted on a GPU: each partition's thread gets its own cuBLAS handle, and torch
    keeps a workspace per (handle, stream) from the caching allocator for the whole run, 32 MiB
    each on Hopper by default, so 100 hosted partitions held over 3 GiB of workspaces against
    64 MiB of their own state (measured on an H200, docs/performance.md "GPU"). A 128 KiB
    cuBLAS workspace (``:16:8``, one of the two settings cuBLAS documents as deterministic, so
    ``--deterministic`` keeps it) and a 128 KiB cuBLASLt one. Set before the first handle (before
    any CUDA work); values the user exported win."""
    import os
    for name, value in HOSTED_GPU_ENV.items():
        os.environ.setdefault(name, value)


def _limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives every thread that allocates under contention its own malloc arena and keeps what
    is freed there: with one thread per hosted partition, each evaluation's activations (hundreds
    of MB for 1,000 test images) stay resident once per thread. Measured (16 partitions, LeNet on
    Fashion-MNIST): peak RSS 3.37 GiB with glibc's default, 1.57 GiB with 2 arenas (the process's
    fixed cost is 1.04 GiB). Set before the partition threads start; ``MALLOC_ARENA_MAX`` in the
    environment wins; a no-op without glibc."""
    import ctypes
    import os
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def _finish(cfg: RunConfig, env: Env, parts: Parts, result: dict, *, wall_t0: float, startup: Startup) -> dict | None:
    """Totals (uncharged bookkeeping) and the run directory; the summary on rank 0."""
    from geodml.comm.collectives import ring_allreduce_wan_bytes
    from geodml.comm.ledger import Ledger

    comm, out, trainer = parts.comm, parts.out, parts.trainer
    global_sd = trainer.global_state_dict()
    rows = [r for rank_rows in comm.meta_all_gather_object(comm.ledger.rows()) for r in rank_rows]
    emulated_s = max(comm.meta_all_gather_object(float(comm.emulated_s)))
    own = rundir.rank_dir(out, env.rank)
    rundir.save_torch(own / rundir.MODEL, {k: v.detach().cpu() for k, v in parts.model.state_dict().items()})
    rundir.write_json(own / rundir.STARTUP, startup.report(rank=env.rank, local_rank=env.local_rank))
    if env.rank != 0:
        return None
    flat = parts.flat
    bsp_bytes = trainer.state.step * ring_allreduce_wan_bytes(flat.numel, flat.data.element_size(),
                                                              comm.region_of_rank)
    summary = rundir.make_summary(cfg, world_size=env.world_size, result=result, totals=Ledger.summarize(rows),
                                  # a resumed run: the wall time before its checkpoint, then this process's
                                  emulated_s=emulated_s, wall_s=trainer.resumed_wall_s + time.monotonic() - wall_t0,
                                  steps=trainer.state.step,
                                  steps_per_epoch=parts.steps_per_epoch, bsp_bytes=bsp_bytes, algo=parts.algo,
                                  skewscout=parts.skewscout.summary() if parts.skewscout is not None else {})
    rundir.save_torch(out / rundir.MODEL, global_sd)
    rundir.write_json(out / rundir.SUMMARY, summary)
    print(rundir.done_text(summary, out), flush=True)
    return summary
