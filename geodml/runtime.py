"""Process runtime: torchrun environment, process group, device, seeding, run directory.

Works under ``torchrun`` (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT in the
environment) and as a plain ``python -m geodml`` (a one-process world with an in-memory
store). ``--backend auto`` picks NCCL when CUDA is available (one GPU per local rank) and
gloo otherwise.
"""

from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Env:
    """What torchrun told this process (a one-process world outside torchrun)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    under_torchrun: bool

    @classmethod
    def from_environ(cls) -> "Env":
        e = os.environ
        if "RANK" not in e or "WORLD_SIZE" not in e:
            return cls(0, 1, 0, 1, False)
        try:
            rank, world = int(e["RANK"]), int(e["WORLD_SIZE"])
            local_rank = int(e.get("LOCAL_RANK", rank))
            local_world = int(e.get("LOCAL_WORLD_SIZE", world))
        except ValueError as exc:
            raise ValueError(f"malformed torchrun environment (RANK/WORLD_SIZE/LOCAL_RANK must be integers): {exc}") from None
        if not (0 <= rank < world):
            raise ValueError(f"malformed torchrun environment: RANK={rank} not in [0, WORLD_SIZE={world})")
        return cls(rank, world, local_rank, local_world, True)


def resolve_backend(requested: str, local_world_size: int = 1, device: str = "auto") -> str:
    """The torch.distributed backend for ``--backend requested --device device`` on a node running
    ``local_world_size`` ranks.

    * ``auto`` -> nccl when CUDA is available with one GPU per local rank (rank i uses
      cuda:LOCAL_RANK) and ``--device`` is not cpu, else gloo (on a GPU host with more ranks than
      GPUs, ranks then train on the CPU, or share the GPUs with ``--device cuda``).
    * nccl without CUDA, with ``--device cpu``, or with fewer visible GPUs than ranks on this
      node is a user error (ValueError): NCCL refuses two ranks on one GPU.
    * ``--device cuda`` without CUDA is a user error.
    """
    cuda = torch.cuda.is_available()
    gpus = torch.cuda.device_count() if cuda else 0
    if device == "cuda" and not cuda:
        raise ValueError("--device cuda needs CUDA, but torch.cuda.is_available() is False; use --device cpu or auto "
                         "(or install a CUDA build of torch: README, GPUs)")
    if requested == "auto":
        return "nccl" if device != "cpu" and cuda and gpus >= local_world_size else "gloo"
    if requested == "nccl" and device == "cpu":
        raise ValueError("--backend nccl runs collectives on GPUs; it cannot be combined with --device cpu (use --backend gloo)")
    if requested == "nccl" and not cuda:
        raise ValueError("--backend nccl needs CUDA, but torch.cuda.is_available() is False; use --backend gloo or auto")
    if requested == "nccl" and gpus < local_world_size:
        raise ValueError(f"--backend nccl uses one GPU per rank, but this node runs {local_world_size} ranks and sees "
                         f"{gpus} GPU(s) (CUDA_VISIBLE_DEVICES); start at most {gpus} ranks per node, or use "
                         f"--backend gloo --device cuda to let ranks share the GPUs")
    return requested


def resolve_device(backend: str, device: str, local_rank: int) -> torch.device:
    """Where this rank's model, data and algorithm buffers live.

    nccl: cuda:LOCAL_RANK. gloo: the CPU, unless ``--device cuda``: then cuda:(LOCAL_RANK mod
    number of GPUs), so several ranks share a GPU (their collectives go through gloo on host
    copies; geodml.comm.Comm stages them).
    """
    if backend == "nccl":
        return torch.device("cuda", local_rank)
    if device == "cuda":
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_process_group(env: Env, backend: str, timeout_s: float, device: str = "auto") -> torch.device:
    """Create the default process group; return this rank's device (:func:`resolve_device`)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    dev = resolve_device(backend, device, env.local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if env.under_torchrun and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and restart not in ("", "0"):
        # After a torchrun --max-restarts restart the agent's store still holds the previous attempt's
        # gloo addresses (torch 2.x: connectFullMesh then dials dead ranks); a per-attempt prefix avoids them.
        base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=dist.PrefixStore(f"geodml/attempt_{restart}", base), rank=env.rank,
                                world_size=env.world_size, timeout=timeout)
    elif env.under_torchrun:
        dist.init_process_group(backend, rank=env.rank, world_size=env.world_size, timeout=timeout)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return dev


def collective_device(backend: str) -> torch.device:
    """The device torch.distributed's collectives take tensors on: this rank's GPU for nccl, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def default_out_dir(algo: str) -> str:
    return str(Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{algo}")


def agree_on_out_dir(env: Env, out: str | None, algo: str) -> Path:
    """Rank 0 picks the run directory (its clock names the default); every rank gets it."""
    obj = [out or default_out_dir(algo)]
    if env.world_size > 1:
        dist.broadcast_object_list(obj, src=0)
    return Path(obj[0])


def seed_everything(seed: int, rank: int) -> None:
    """Seed torch's global generator per rank for anything we don't own (cuDNN picks etc.).

    geodml's own randomness (partitioning, init, minibatch order) uses explicit generators.
    """
    torch.manual_seed(seed * 1_000_003 + rank)


def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
