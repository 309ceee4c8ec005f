"""The environment checks: everything a run needs that can be checked before a process group
exists, resolved once and handed on (the second of the two validation stages: geodml.config checks
each value on its own, this module checks them against the machine, the files and each other).

    preflight(cfg, env)  backend, topology and placement, --out, checkpoint files, metrics ports,
                         --tensorboard, the decoded dataset and every partition -> parts.Preflight

A failure is a ``ValueError`` naming the flag: the CLI prints one ``geodml: error:`` line and every
rank exits 2 (docs/reliability.md, "Bad input").
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from geodml import rundir
from geodml.config import RunConfig
from geodml.parts import Preflight
from geodml.runtime import Env

if TYPE_CHECKING:
    from geodml.data.datasets import Dataset

__all__ = ["check_partitions", "hosting_device", "load_and_partition", "preflight"]


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
        rundir.check_not_crashed(cfg.out, resume=resume_requested(cfg) or cfg.reliability.restart)
        return Preflight(backend=backend, topology=topology, region_of_rank=regions, dataset=None, partitions=[])
    t0 = time.monotonic()
    dataset, parts = load_and_partition(cfg, partitions)
    own_eval = partition_eval_indices(len(dataset.test_y), cfg.partition_eval_examples, cfg.seed)
    rundir.check_not_crashed(cfg.out, resume=resume_requested(cfg) or cfg.reliability.restart)
    return Preflight(backend=backend, topology=topology, region_of_rank=regions, dataset=dataset, partitions=parts,
                     data_s=time.monotonic() - t0, own_eval_indices=own_eval,
                     advice=tuple(_advice(cfg, parts, len(dataset.train_y), list(topology.regions), regions)))


def _advice(cfg: RunConfig, parts: list[np.ndarray], num_train: int, topology_regions: list[str],
            placed: list[str]) -> list[str]:
    """geodml.advice's warning lines for this run, from what the preflight resolved."""
    from geodml.advice import run_advice
    from geodml.checkpoint import find_resume_step, fingerprint, resume_requested
    from geodml.parts import training_length
    from geodml.trainer import steps_per_epoch
    sizes = np.asarray([len(p) for p in parts], dtype=np.int64)
    total, _ = training_length(cfg, sizes, steps_per_epoch(num_train, len(parts), cfg.optim.batch_size))
    found = None
    if resume_requested(cfg) and cfg.out is not None:
        found = find_resume_step(cfg.out, len(parts), fingerprint(cfg, len(parts))) is not None
    return run_advice(cfg, total_steps=total, sizes=sizes, topology_regions=topology_regions, placed_regions=placed,
                      resume_found=found)


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
