"""The multi-process harness itself: results come back, failures and hangs are reported."""

import pytest

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
