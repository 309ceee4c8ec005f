"""Shared test harness (not a test module).

* :func:`run_threads`: K partitions as K threads of this process, each with its InProcessComm
  (geodml.comm.inprocess): the real Comm contract and the real charges (envelope + tensor bytes
  for messages, the cost models for collectives), without sockets or OS processes. Every rank
  sums the same contributions in rank order, so results are bit-identical across ranks, as with
  gloo's ring.
* :func:`scripted_exchange` on :data:`TWO_REGIONS`: the exchange whose charges and clocks are
  worked out by hand, run by DistComm (tests/test_comm_wan.py) and InProcessComm
  (tests/test_comm_inprocess.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from geodml.comm import InProcessComm, InProcessGroup

T = TypeVar("T")


def run_threads(k: int, fn: Callable[[int, InProcessComm], T], *, join_timeout_s: float = 120.0,
                **group_kw: Any) -> list[T]:
    """``fn(rank, comm)`` on K threads of one :class:`InProcessGroup` (``group_kw``: its options,
    default ``--wan off`` on the default topology); returns the results in rank order.

    A rank that raises aborts the group, so the others stop waiting at once; its exception is
    re-raised here. A thread still running after ``join_timeout_s`` fails the call.
    """
    group = InProcessGroup(k, **group_kw)
    results: list[Any] = [None] * k
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            results[rank] = fn(rank, group.comm(rank))
        except BaseException as e:  # noqa: BLE001 -- re-raised in the caller
            errors.append(e)
            group.abort(f"rank {rank} failed: {e!r}")

    threads = [threading.Thread(target=target, args=(r,), name=f"geodml-test-rank{r}") for r in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_timeout_s)
    group.close()
    assert not any(t.is_alive() for t in threads), "a rank thread hung"
    if errors:
        raise errors[0]
    return results


def kind_bytes(comm: InProcessComm, kind: str) -> int:
    """Bytes ``comm``'s rank has been charged for traffic of ``kind`` (WAN and LAN)."""
    return sum(r["bytes"] for r in comm.ledger.rows() if r["kind"] == kind)


def record_calls(comm: InProcessComm) -> list[tuple]:
    """From now on, log ``comm``'s charged calls: ``("all_reduce", kind, numel)``,
    ``("all_gather", kind, numel)``, ``("send", kind, dst, step)``; returns the (growing) log."""
    calls: list[tuple] = []
    all_reduce, all_gather, send = comm.all_reduce, comm.all_gather, comm.send

    def logged_all_reduce(tensor, kind, **kw):
        calls.append(("all_reduce", kind, tensor.numel()))
        return all_reduce(tensor, kind, **kw)

    def logged_all_gather(tensor, kind):
        calls.append(("all_gather", kind, tensor.numel()))
        return all_gather(tensor, kind)

    def logged_send(dst, kind, tensors, **kw):
        calls.append(("send", kind, dst, kw.get("step")))
        return send(dst, kind, tensors, **kw)

    comm.all_reduce, comm.all_gather, comm.send = logged_all_reduce, logged_all_gather, logged_send  # type: ignore
    return calls


# ---- a scripted exchange that both Comms run against numbers worked out by hand ----------------
# (tests/test_comm_wan.py: DistComm in real processes; tests/test_comm_inprocess.py: InProcessComm)
# Ranks 0 and 2 in region a, rank 1 in region b; a->b 8 Mbit/s = 1e6 B/s, 10 ms;
# b->a 16 Mbit/s = 2e6 B/s, 20 ms; LAN 800 Mbit/s = 1e8 B/s, 1 ms.

TWO_REGIONS = """
    source = "illustrative (test)"
    regions = ["a", "b"]
    placement = ["a", "b", "a"]
    [lan]
    bandwidth_mbps = 800
    latency_ms = 1
    [[links]]
    from = "a"
    to = "b"
    bandwidth_mbps = 8
    latency_ms = 10
    [[links]]
    from = "b"
    to = "a"
    bandwidth_mbps = 16
    latency_ms = 20
"""


def scripted_exchange(comm: Any, rank: int) -> list[float]:
    """The scripted exchange of three ranks on :data:`TWO_REGIONS` (every Comm call an algorithm
    may make, charged); returns this rank's clock after each phase."""
    import numpy as np
    import torch

    clocks = []
    comm.advance_compute([0.5, 0.2, 0.1][rank])
    if rank == 0:  # two messages on the same link at once: they share it (FIFO)
        comm.send(1, "update", [np.zeros(10_000, np.uint8)], step=0)
        comm.send(1, "update", [np.ones(20_000, np.uint8)], step=0)
        assert comm.recv(2, "control", step=0)[0].tolist() == [1]
    if rank == 1:
        first, second = comm.recv(0, "update", step=0), comm.recv(0, "update", step=0)
        assert first[0].size == 10_000 and second[0].size == 20_000 and second[0].all()
    if rank == 2:
        comm.send(0, "control", [np.array([1], np.int64)], step=0)
    clocks.append(comm.emulated_s)
    t = torch.arange(30, dtype=torch.float32) + rank
    comm.all_reduce(t, "gradient")
    assert torch.equal(t, 3 * torch.arange(30, dtype=torch.float32) + 3)
    clocks.append(comm.emulated_s)
    m = torch.full((250,), float(rank))
    comm.broadcast(m, 1, "model")
    assert bool((m == 1).all())
    clocks.append(comm.emulated_s)
    g = comm.all_gather(torch.tensor([rank, 2 * rank], dtype=torch.float32), "travel")
    assert [x.tolist() for x in g] == [[0, 0], [1, 2], [2, 4]]
    clocks.append(comm.emulated_s)
    return clocks


def transport_group(monkeypatch: Any, kw: list[dict[str, Any]]) -> list[Any]:
    """One ZeroMQ PeerTransport per entry of ``kw`` in this process, built concurrently (threads),
    sharing a HashStore and one wire secret (as build_comm shares it over the process group)."""
    import itertools
    import secrets

    import torch.distributed as dist

    import geodml.comm.transport as T

    monkeypatch.setattr(T, "_namespace_counter", itertools.repeat(0))
    store = dist.HashStore()
    secret = secrets.token_bytes(32)
    n = len(kw)
    out: list[Any] = [None] * n

    def build(r: int) -> None:
        args = {"secret": secret, **kw[r]}
        out[r] = T.PeerTransport(rank=r, world_size=n, store=store, timeout_s=10, region_of_rank=["x", "y", "z"][:n],
                                 **args)

    threads = [threading.Thread(target=build, args=(r,)) for r in range(n)]
    [t.start() for t in threads]
    [t.join(timeout=30) for t in threads]
    return out


def paced_exchange(comm: Any, rank: int) -> tuple[float, float, float | None, float]:
    """The ``--wan real`` scenario of two ranks: rank 0 streams five 50,000-byte updates to rank 1,
    which answers with one control message, then both all-reduce 100,000 floats. Returns (wall
    seconds from this rank's start, emulated seconds, rank 1's first arrival as a
    ``time.monotonic()`` instant or None, this rank's start instant). Callers start the ranks
    together first (a barrier); the instants let them measure rank 1's first arrival from rank 0's
    start, which is what the pacing is anchored to (CLOCK_MONOTONIC is one clock for every process
    of a host, while a rank that leaves the barrier late would see the arrival too early)."""
    import time

    import numpy as np
    import torch

    t0 = time.monotonic()
    first = None
    if rank == 0:
        for i in range(5):
            comm.send(1, "update", [np.zeros(50_000, np.uint8)], step=i)
        comm.recv(1, "control", step=0)
    else:
        for i in range(5):
            comm.recv(0, "update", step=i)
            first = first or time.monotonic()
        comm.send(0, "control", [np.zeros(1, np.int64)], step=0)
    comm.all_reduce(torch.zeros(100_000), "gradient")
    return time.monotonic() - t0, comm.emulated_s, first, t0
