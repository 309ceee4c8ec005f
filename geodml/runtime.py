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
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used, so that `python -m geodml --help` does not load it
    import torch
    import torch.distributed as dist

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


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
        if "RANK" not in e and "WORLD_SIZE" not in e:
            return cls(0, 1, 0, 1, False)
        shown = " ".join(f"{k}={e[k]}" for k in _TORCHRUN_VARS if k in e)
        fix = (f"launch with torchrun (it sets them all), or clear the leftovers for a single process: "
               f"unset {' '.join(k for k in _TORCHRUN_VARS if k in e)}")
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in e]
        if missing:
            raise ValueError(f"incomplete torchrun environment: {shown} is set but {' and '.join(missing)} "
                             f"{'is' if len(missing) == 1 else 'are'} not; {fix}")
        try:
            rank, world = int(e["RANK"]), int(e["WORLD_SIZE"])
            local_rank = int(e.get("LOCAL_RANK", rank))
            local_world = int(e.get("LOCAL_WORLD_SIZE", world))
            int(e["MASTER_PORT"])
        except ValueError as exc:
            raise ValueError(f"malformed torchrun environment ({shown}): RANK, WORLD_SIZE, LOCAL_RANK and MASTER_PORT "
                             f"must be integers ({exc}); {fix}") from None
        if not (0 <= rank < world):
            raise ValueError(f"malformed torchrun environment: RANK={rank} is not in [0, WORLD_SIZE={world}); {fix}")
        if not (0 <= local_rank < local_world):
            raise ValueError(f"malformed torchrun environment: LOCAL_RANK={local_rank} is not in "
                             f"[0, LOCAL_WORLD_SIZE={local_world}); {fix}")
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
    import torch
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
    copies; geodml.comm.DistComm stages them).
    """
    import torch
    if backend == "nccl":
        return torch.device("cuda", local_rank)
    if device == "cuda":
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


class StartupError(RuntimeError):
    """The ranks did not all join within the start-up bound, or the store went away while they joined;
    every rank that joined prints the message (its own line) and exits 3."""


def _restart() -> str:
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0"


def _agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"


def rendezvous(env: Env, timeout_s: float, *, poll_s: float = 0.05) -> dist.Store | None:
    """Connect to the job's store and wait, at most ``timeout_s`` (``--comm-timeout``), until every
    rank has joined; None for a one-process world.

    torch's own rendezvous inside ``init_process_group`` waits its whole timeout for a rank that
    died during start-up and then fails with a traceback; this join names the missing ranks
    instead (:class:`StartupError`). The store is the torchrun agent's (``TORCHELASTIC_USE_AGENT_STORE``)
    or, without an agent, one that rank 0 hosts, as env:// initialisation would. Every rank
    counts itself in under a per-attempt key (a torchrun restart starts a new count)."""
    import torch.distributed as dist
    if not env.under_torchrun:
        return None
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    hosted = not _agent_store() and env.rank == 0
    try:
        store = dist.TCPStore(host, port, env.world_size, is_master=hosted,
                              timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    except (RuntimeError, OSError) as exc:  # DistNetworkError/DistStoreError are RuntimeErrors
        who = "the torchrun agent's store" if _agent_store() else "the store rank 0 hosts (no torchrun agent)"
        raise StartupError(f"start-up: rank {env.rank} cannot reach {who} at {host}:{port} within {timeout_s:g} s "
                           f"(--comm-timeout): {'rank 0 is missing or ' if not _agent_store() else ''}MASTER_ADDR/"
                           f"MASTER_PORT are wrong ({type(exc).__name__})") from None
    ns = f"geodml/join/{_restart()}"
    try:
        _join(store, ns, env, timeout_s, hosted=hosted, poll_s=poll_s)
    except StartupError:
        raise
    except (RuntimeError, OSError) as exc:  # the store went away mid-join
        gone = "the torchrun agent is gone" if _agent_store() else "its host, rank 0, is gone"
        raise StartupError(f"start-up: the store at {host}:{port} stopped answering while rank {env.rank} waited for "
                           f"the others to join ({gone}; {type(exc).__name__})") from None
    return store


LEAVE_WAIT_S = 30.0
"""The longest the store's host waits at the end of a run for the other ranks to leave (:func:`leave_together`)."""


def leave_together(store: dist.Store | None, env: Env, *, wait_s: float = LEAVE_WAIT_S, poll_s: float = 0.01) -> None:
    """At the end of a run, count this rank out; the rank that hosts the store (rank 0 without a torchrun
    agent) waits, at most ``wait_s``, until every rank has, so that no rank's last store call (its peer
    watch's) meets a closed store: torch then logs a 40-line C++ "recvValue failed" stack on that rank although
    the run succeeded. Call it after the peer watch has stopped; a store error here is ignored (the run
    is over)."""
    if store is None or env.world_size < 2:
        return
    key = f"geodml/leave/{_restart()}"
    try:
        store.add(key, 1)
        if env.rank != 0 or _agent_store():
            return
        deadline = time.monotonic() + wait_s
        while store.add(key, 0) < env.world_size and time.monotonic() < deadline:
            time.sleep(poll_s)
    except (RuntimeError, OSError):
        pass


def _join(store: dist.Store, ns: str, env: Env, timeout_s: float, *, hosted: bool, poll_s: float) -> None:
    """Count in and wait for everyone. The first rank whose deadline passes writes the verdict for all
    (which ranks are missing); the others read it and acknowledge; the store's host waits for their
    acknowledgements before it leaves (its store goes with it). A verdict that another rank declared
    (:func:`declare_startup_verdict`: its torchrun agent stopped it after a sibling died) ends the join too."""
    store.set(f"{ns}/{env.rank}", "1")
    store.add(f"{ns}/count", 1)
    deadline = time.monotonic() + timeout_s
    while store.add(f"{ns}/count", 0) < env.world_size:
        if store.add(f"{ns}/gave_up", 0):
            store.add(f"{ns}/acks", 1)
            raise StartupError(store.get(f"{ns}/verdict").decode())
        if time.monotonic() > deadline:
            joined = [r for r in range(env.world_size) if store.check([f"{ns}/{r}"])]
            missing = [r for r in range(env.world_size) if r not in joined]
            shown = ", ".join(map(str, missing[:10])) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
            verdict = (f"start-up: {len(joined)} of {env.world_size} ranks joined within {timeout_s:g} s "
                       f"(--comm-timeout); missing: rank{'s' if len(missing) > 1 else ''} {shown} (died or never "
                       "started; see that rank's output)")
            if store.add(f"{ns}/gave_up", 0) == 0:
                store.set(f"{ns}/verdict", verdict)
            first = store.add(f"{ns}/gave_up", 1) == 1
            if hosted:  # let the others read the verdict before the store goes
                until = time.monotonic() + 5.0
                while store.add(f"{ns}/acks", 0) < len(joined) - 1 and time.monotonic() < until:
                    time.sleep(poll_s)
            raise StartupError(verdict if first else store.get(f"{ns}/verdict").decode())
        time.sleep(poll_s)


def startup_verdict(store: dist.Store) -> str | None:
    """The start-up verdict in ``store`` for this attempt (missing ranks, or a declared loss), if any."""
    ns = f"geodml/join/{_restart()}"
    return store.get(f"{ns}/verdict").decode() if store.add(f"{ns}/gave_up", 0) else None


def declare_startup_verdict(verdict: str, *, others: int, wait_s: float = 3.0) -> None:
    """Write ``verdict`` as this attempt's start-up verdict into the job's store (MASTER_ADDR/MASTER_PORT),
    for the ranks still joining to repeat, and wait at most ``wait_s`` until ``others`` of them have read it
    (this node's agent takes the store away once its ranks are gone). Best effort: a store error is ignored."""
    import torch.distributed as dist
    ns = f"geodml/join/{_restart()}"
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=datetime.timedelta(seconds=1.0), wait_for_workers=False)
        if store.add(f"{ns}/gave_up", 0) == 0:
            store.set(f"{ns}/verdict", verdict)
            store.add(f"{ns}/gave_up", 1)
        deadline = time.monotonic() + wait_s
        while store.add(f"{ns}/acks", 0) < others and time.monotonic() < deadline:
            time.sleep(0.05)
    except (RuntimeError, OSError, KeyError, ValueError):
        pass


def init_process_group(env: Env, backend: str, timeout_s: float, device: str = "auto",
                       store: dist.Store | None = None) -> torch.device:
    """Create the default process group over ``store`` (:func:`rendezvous`; None: a one-process
    world); return this rank's device (:func:`resolve_device`)."""
    import torch
    import torch.distributed as dist
    timeout = datetime.timedelta(seconds=timeout_s)
    dev = resolve_device(backend, device, env.local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if store is None:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return dev
    # Every attempt under its own prefix: after a torchrun --max-restarts restart the agent's store
    # still holds the previous attempt's gloo addresses (torch 2.x: connectFullMesh then dials dead ranks).
    dist.init_process_group(backend, store=dist.PrefixStore(f"geodml/attempt_{_restart()}", store), rank=env.rank,
                            world_size=env.world_size, timeout=timeout)
    return dev


def collective_device(backend: str) -> torch.device:
    """The device torch.distributed's collectives take tensors on: this rank's GPU for nccl, else the CPU."""
    import torch
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def default_out_dir(algo: str) -> str:
    """``runs/<timestamp>-<algo>``; a plugin's ``MODULE:CLASS`` is named by its class."""
    name = algo.rpartition(":")[2].replace(".", "-") if ":" in algo else algo
    return str(Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}")


def agree_on_out_dir(env: Env, out: str | None, algo: str) -> Path:
    """Rank 0 picks the run directory (its clock names the default); every rank gets it."""
    import torch.distributed as dist
    obj = [out or default_out_dir(algo)]
    if env.world_size > 1:
        dist.broadcast_object_list(obj, src=0)
    return Path(obj[0])


def seed_everything(seed: int, rank: int) -> None:
    """Seed torch's global generator per rank for anything we don't own (cuDNN picks etc.).

    geodml's own randomness (partitioning, init, minibatch order) uses explicit generators.
    """
    import torch
    torch.manual_seed(seed * 1_000_003 + rank)


def exit_now(code: int) -> None:
    """End the process with ``code`` as interpreter exit would, minus the teardown of modules: run the exit
    handlers, flush the standard streams, then ``os._exit`` (for callers that know nothing else needs the
    teardown: geodml.__main__.leave, and a forked rank of geodml.engine.launcher, which must never return
    into the launcher's frames)."""
    import atexit
    import sys
    try:
        atexit._run_exitfuncs()  # noqa: SLF001 -- what interpreter exit would run (os._exit skips it)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def destroy_process_group() -> None:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
