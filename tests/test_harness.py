"""The multi-process harness itself: results come back, failures and hangs are reported."""

import socket

import pytest

from geodml.bench.ports import base_spans, ephemeral_range, free_base, free_port
from tests.support.procs import WorkerError, run_workers


def _sum_ranks(rank, world, scale=1):
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item() * scale


def _hang(rank, world):
    import time
    if rank == 1:
        time.sleep(600)
    return rank


@pytest.mark.integration
def test_results_come_back():
    # 0 + 1 + 2 = 3, scaled by 2
    assert run_workers("tests.test_harness:_sum_ranks", 3, scale=2) == [6.0, 6.0, 6.0]


@pytest.mark.integration
def test_hang_is_killed_and_reported():
    with pytest.raises(WorkerError, match="timed out"):
        run_workers("tests.test_harness:_hang", 2, timeout_s=5)


def test_ports_are_drawn_outside_the_ephemeral_range_and_avoid_what_they_are_told():
    """free_port and free_base stay out of the kernel's ephemeral range, where an outgoing
    connection could take a port between the test's check and the server's bind (a CI failure
    once), and out of ``avoid``; the ports they return can be bound."""
    low, high = ephemeral_range()
    room = bool(base_spans(4))  # else the harness falls back to any free port
    for _ in range(50):
        base = free_base(4)
        assert not room or not any(low <= p <= high for p in range(base, base + 4)), (base, low, high)
        avoid = tuple(range(base, base + 4))
        port = free_port(avoid=avoid)
        assert port not in avoid and (not room or not low <= port <= high), (port, avoid, low, high)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
