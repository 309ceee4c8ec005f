"""This process in the job: the start-up join, the process group, seeds, the run directory and the
peer watch, for the body of a run (geodml.engine.host), torn down in reverse."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

from geodml.config import RunConfig
from geodml.errors import InputError
from geodml.interrupt import Interrupted
from geodml.peerwatch import AgentStop
from geodml.runtime import Env


@contextmanager
def _peer_watch(cfg: RunConfig, env: Env, agent_stop: AgentStop | None) -> Iterator[None]:
    """Heartbeats between ranks (geodml.peerwatch) for the body; a peer's death surfaces in the
    body as a comm error, which the watch then names (exits non-zero itself when it does)."""
    if env.world_size < 2 or not env.under_torchrun:
        yield
        return
    from geodml.peerwatch import PeerWatch, looks_like_peer_loss
    watch = PeerWatch(rank=env.rank, world_size=env.world_size, timeout_s=cfg.reliability.peer_timeout_s).start()
    if agent_stop is not None:
        agent_stop.enter("during the run", watch)
    try:
        yield
    except Interrupted:   # every rank stops at the same step: an ordinary end for the peers
        watch.stop(done=True)
        raise
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
    if agent_stop is not None:
        agent_stop.enter("at the end of the run")
    watch.stop(done=True)


@contextmanager
def joined(cfg: RunConfig, env: Env, backend: str, device: str) -> Iterator[tuple[torch.device, Path]]:
    """This process in the job for the body: every rank joined (or a StartupError naming the
    missing), the process group, seeds and the run directory, then the peer watch; torn down in
    reverse. Yields this rank's device and the run directory."""
    from geodml.peerwatch import fault_point
    from geodml.runtime import (
        agree_on_out_dir,
        destroy_process_group,
        init_process_group,
        leave_together,
        rendezvous,
        seed_everything,
    )

    with ExitStack() as stack:
        stack.callback(destroy_process_group)
        agent_stop = AgentStop.current()   # installed by the CLI under a torchrun agent, now "at start-up"
        fault_point("startup", env.rank)
        store = rendezvous(env, cfg.comm.timeout_s)
        dev = init_process_group(env, backend, cfg.comm.timeout_s, device, store=store)
        seed_everything(cfg.seed, env.rank)
        out = agree_on_out_dir(env, cfg.out, cfg.algo.algo)
        # The watch starts once the process group exists: started before it, 16 ranks on 2 cores
        # showed a heartbeat silent for 30 s during the group's set-up (a false "rank 0 lost").
        try:
            with _peer_watch(cfg, env, agent_stop):
                yield dev, out
                fault_point("finished", env.rank, out)
        except Interrupted:
            leave_together(store, env)
            raise
        leave_together(store, env)   # the peer watch has stopped: rank 0 keeps the store until everyone is out
