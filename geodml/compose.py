"""One run, end to end: the composition root (docs/design.md "How a run flows").

    preflight(cfg, env)  every check that needs no process group; resolves backend, topology and
                         placement once and hands them on (a bad input stops here, exit 2)
    run(cfg, env, pre)   the engine (geodml.engine.host): join the job, host this process's
                         partitions, finish, teardown in reverse order

The run-directory files and their writers are geodml.rundir's; the wiring of one partition's parts
is geodml.parts'; how a process trains its partitions is geodml.engine's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from geodml import rundir
from geodml.config import RunConfig
from geodml.engine.job import InputError
from geodml.parts import Preflight
from geodml.runtime import Env

if TYPE_CHECKING:
    from geodml.data.datasets import Dataset

__all__ = ["HOSTED_GPU_ENV", "InputError", "hosting_device", "load_and_partition", "preflight", "run"]


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
    if cfg.tensorboard:
        from geodml.metrics.tensorboard import require_tensorboard
        require_tensorboard()
    if not data:
        rundir.check_not_crashed(cfg.out, resume=resume_requested(cfg))
        return Preflight(backend=backend, topology=topology, region_of_rank=regions, dataset=None, partitions=[])
    t0 = time.monotonic()
    dataset, parts = load_and_partition(cfg, partitions)
    own_eval = partition_eval_indices(len(dataset.test_y), cfg.partition_eval_examples, cfg.seed)
    rundir.check_not_crashed(cfg.out, resume=resume_requested(cfg))
    return Preflight(backend=backend, topology=topology, region_of_rank=regions, dataset=dataset, partitions=parts,
                     data_s=time.monotonic() - t0, own_eval_indices=own_eval)


def check_partitions(cfg: RunConfig, env: Env) -> int:
    """The number of partitions P (``--partitions``, default the number of processes R). P = R: one
    partition per process. P > R: each process hosts a contiguous block of partitions as tasks
    of its engine (geodml.engine) over an in-process Comm linked to the other processes
    (geodml.comm.crossproc), with one Prometheus exporter per process; on the device :func:`hosting_device` names."""
    partitions = cfg.partitions or env.world_size
    if partitions < env.world_size:
        raise ValueError(f"--partitions {partitions} is fewer than the {env.world_size} processes; every process "
                         "hosts at least one partition: use --partitions >= the number of processes")
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


def load_and_partition(cfg: RunConfig, world_size: int) -> tuple[Dataset, list[np.ndarray]]:
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


def run(cfg: RunConfig, env: Env, pre: Preflight | None = None) -> dict | None:
    """Train this process's partitions on the engine (geodml.engine); returns the summary on rank 0
    (None elsewhere)."""
    from geodml.engine import host
    pre = pre or preflight(cfg, env)
    device = hosting_device(cfg, len(pre.partitions), env.world_size)
    if len(pre.partitions) > env.world_size and device == "cuda":
        _small_cublas_workspaces()  # before --deterministic's default, which this value also satisfies
    if cfg.deterministic:
        _deterministic()
    return host(cfg, env, pre, device_name=device)


def _deterministic() -> None:
    """``--deterministic``: kernels that give the same bits on every call. cuBLAS needs a fixed
    workspace for that, set before its first handle (so before any CUDA work; a value the user
    exported wins); cuDNN's autotuner stays off. An op with no deterministic CUDA kernel warns
    (torch's warning names it) instead of failing the run: LocalResponseNorm's backward (lenet,
    cifar-cnn) is one, and such runs may still differ in the last bits."""
    import os

    import torch
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
