"""The CUDA path, where there is a GPU (CI has none: these skip there, and say so).

Run on a lent H100 on 2026-11-23 (docs/launch.md, "GPUs"); all of them, the hosted ones
included, passed on a lent H200 on 2026-11-26 (docs/performance.md, "GPU: hosted partitions"). NCCL refuses two ranks on one GPU,
so multi-rank runs on a one-GPU host use ``--device cuda`` with gloo (ranks share the GPU);
NCCL itself runs at K=1 here and at K = number of GPUs elsewhere.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.procs import run_torchrun

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")]

COMMON = ["--dataset", "digits", "--model", "cnn", "--steps", "20", "--eval-every", "10", "--no-progress"]


def _sd(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def _run(tmp_path, name, nproc, *flags):
    out = tmp_path / name
    r = run_torchrun(nproc, [*COMMON, "--out", str(out), *flags], timeout_s=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, json.loads((out / "config.json").read_text()), json.loads((out / "summary.json").read_text())


def test_nccl_one_rank_per_gpu_runs_every_algorithm(tmp_path):
    gpus = torch.cuda.device_count()
    for algo, extra in (("bsp", ()), ("gaia", ("--t0", "0.1")), ("dgc", ("--e-warm", "1")),
                        ("fedavg", ("--iter-local", "5", "--server-momentum", "0.9"))):
        out, cfg, s = _run(tmp_path, f"nccl-{algo}", gpus, "--backend", "nccl", "--algo", algo, *extra)
        assert cfg["backend"] == "nccl" and cfg["device"] == "cuda:0"
        assert s["steps"] == 20 and 0.0 < s["final_val_accuracy"] <= 1.0


def test_ranks_sharing_a_gpu_match_the_cpu_run(tmp_path):
    """K=3 BSP on one GPU (gloo, staged collectives) vs the same run on the CPU: the same bytes
    to the byte, identical weights on every rank, and weights within float tolerance of the CPU's."""
    gpu_out, gpu_cfg, gpu = _run(tmp_path, "gpu", 3, "--device", "cuda", "--backend", "gloo", "--algo", "bsp")
    cpu_out, _, cpu = _run(tmp_path, "cpu", 3, "--device", "cpu", "--algo", "bsp")
    assert gpu_cfg["backend"] == "gloo" and gpu_cfg["device"].startswith("cuda")
    assert gpu["wan_bytes_total"] == cpu["wan_bytes_total"] > 0
    ranks = [_sd(gpu_out / f"rank{r}" / "model.pt") for r in range(3)]
    for sd in ranks[1:]:
        assert all(torch.equal(ranks[0][k], sd[k]) for k in sd)
    ref = _sd(cpu_out / "model.pt")
    for k, v in _sd(gpu_out / "model.pt").items():
        torch.testing.assert_close(v, ref[k], rtol=1e-3, atol=1e-4)


def test_shared_gpu_gaia_skewscout_and_resume(tmp_path):
    out, _, s = _run(tmp_path, "ss", 3, "--device", "cuda", "--algo", "gaia", "--skewscout", "--travel-every", "10",
                     "--checkpoint-every", "10")
    assert s["skewscout_rounds"] == 2 and s["wan_bytes_by_kind"]["travel"] > 0
    (out / "summary.json").unlink()
    r = run_torchrun(3, [*COMMON, "--out", str(out), "--device", "cuda", "--algo", "gaia", "--skewscout",
                         "--travel-every", "10", "--checkpoint-every", "10", "--resume"], timeout_s=240)
    assert r.returncode == 0 and "resumed from step 10" in r.stdout, r.stderr[-3000:]
    s2 = json.loads((out / "summary.json").read_text())
    assert s2["wan_bytes_total"] == s["wan_bytes_total"] and s2["theta_trajectory"] == s["theta_trajectory"]


# Hosted partitions on a GPU (issue 19).
LEDGER = ("wan_bytes_total", "lan_bytes_total", "wan_bytes_by_kind", "bytes_by_link", "messages_total")


@pytest.mark.parametrize("algo, extra, tol", [
    ("bsp", (), (1e-3, 1e-4)),
    # exact top-k (a sample ratio of 1/4 skips the sampled threshold, whose CUDA and CPU generators
    # draw different samples and so send different counts); an entry tied at the k-th magnitude
    # can swap between the devices, hence the looser weight tolerance
    ("dgc", ("--e-warm", "1", "--dgc-sample-ratio", "0.25"), (1e-2, 1e-3)),
    ("fedavg", ("--iter-local", "5", "--server-momentum", "0.9"), (1e-3, 1e-4))])
def test_five_partitions_on_one_gpu_match_five_cpu_processes(tmp_path, algo, extra, tol):
    """The paper's five data centers on one GPU (P = 5, R = 1, NCCL) against five CPU processes:
    the same ledger to the byte (BSP and FedAvg send dense tensors, DGC exactly k entries per
    layer), and final weights within float tolerance of the CPU's (GPU and CPU kernels round
    differently; BSP's and FedAvg's tolerance is the shared-GPU BSP test's)."""
    gpu_out, gpu_cfg, gpu = _run(tmp_path, "gpu", 1, "--partitions", "5", "--device", "cuda", "--algo", algo, *extra)
    cpu_out, _, cpu = _run(tmp_path, "cpu", 5, "--device", "cpu", "--algo", algo, *extra)
    assert gpu_cfg["backend"] == "nccl" and gpu_cfg["device"] == "cuda:0"
    assert {k: gpu.get(k) for k in LEDGER} == {k: cpu.get(k) for k in LEDGER} and gpu["wan_bytes_total"] > 0
    ref = _sd(cpu_out / "model.pt")
    for k, v in _sd(gpu_out / "model.pt").items():
        torch.testing.assert_close(v, ref[k], rtol=tol[0], atol=tol[1])


def test_hosted_gaia_on_a_shared_gpu_equals_one_process(tmp_path):
    """Six Gaia partitions on one GPU with --deterministic: one process (NCCL) against two
    processes sharing it (gloo, collectives staged through the host). The same device's
    deterministic kernels and float64 partial sums that round once: the same significant entries,
    so the same ledger to the byte and the same weights (to the last bits a staged copy cannot
    change; on the CPU the pair is bit-identical: tests/test_partitions.py)."""
    flags = ("--partitions", "6", "--device", "cuda", "--deterministic", "--algo", "gaia", "--t0", "0.1")
    one_out, _, one = _run(tmp_path, "one", 1, *flags)
    two_out, two_cfg, two = _run(tmp_path, "two", 2, *flags)
    assert two_cfg["backend"] == ("nccl" if torch.cuda.device_count() >= 2 else "gloo")
    assert {k: one[k] for k in LEDGER} == {k: two[k] for k in LEDGER} and one["wan_bytes_total"] > 0
    ref = _sd(one_out / "model.pt")
    for k, v in _sd(two_out / "model.pt").items():
        torch.testing.assert_close(v, ref[k], rtol=1e-6, atol=1e-7)
