"""One run, end to end: the composition root (docs/design.md "How a run flows").

    preflight(cfg, env)  geodml.preflight: every check that needs no process group; resolves
                         backend, topology and placement once and hands them on (exit 2 on bad input)
    run(cfg, env, pre)   the engine (geodml.engine.host): join the job, host this process's
                         partitions, finish, teardown in reverse order

The run-directory files and their writers are geodml.rundir's; the wiring of one partition's parts
is geodml.parts'; how a process trains its partitions is geodml.engine's.
"""

from __future__ import annotations

from geodml.config import RunConfig
from geodml.engine.job import InputError
from geodml.parts import Preflight
from geodml.preflight import hosting_device, load_and_partition, preflight
from geodml.runtime import Env

__all__ = ["HOSTED_GPU_ENV", "InputError", "hosting_device", "load_and_partition", "preflight", "run"]


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
