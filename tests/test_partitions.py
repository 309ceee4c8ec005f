"""Many partitions per process (issue "many partitions per process"): P partitions on R processes.

Each process hosts a contiguous block of partitions as threads over an in-process Comm linked to
the other processes (geodml.comm.inprocess, geodml.comm.crossproc); every byte, message and
emulated second is charged as DistComm charges it, and floating sums accumulate in float64 and
round once in every Comm, so their result does not depend on how the partitions are grouped.
So P = 6 partitions on R = 1, 2, 3 and 6 processes must give bit-identical final weights (every
partition's and the global model), the identical ledger (totals, per link, per kind, messages),
the same emulated time, SkewScout trajectory and accuracies -- for every algorithm and variant.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from geodml.cli import main
from geodml.comm.crossproc import blocks, process_of
from geodml.trainer import EvalCache, evaluate

BASE = ["--dataset", "digits", "--partition", "label", "--skew", "0.8", "--steps", "30", "--eval-every", "15",
        "--log-every", "10", "--no-progress", "--wan", "virtual", "--partitions", "6"]
# Everything but wall-clock measures (emulated_seconds adds measured compute time; the link time
# alone, wan_emulated_seconds_by_*, is deterministic and compared).
SAME = ("wan_bytes_total", "lan_bytes_total", "wan_bytes_by_kind", "wan_bytes_by_link", "bytes_by_link",
        "wan_messages_total", "messages_total", "wan_emulated_seconds_by_link", "wan_emulated_seconds_by_kind", "steps",
        "final_val_accuracy", "final_val_loss", "per_rank_val_accuracy", "per_rank_train_accuracy", "final_model",
        "theta_final", "theta_trajectory")
# Every algorithm, and every FedAvg variant in one of two compatible combinations.
ALGOS = {
    "bsp": ["--algo", "bsp"],
    "gaia-skewscout": ["--algo", "gaia", "--t0", "0.05", "--skewscout", "--travel-every", "10"],
    "dgc": ["--algo", "dgc", "--e-warm", "0.3"],
    "local": ["--algo", "local"],
    "fedavgm-fedir-fedvc-sampled": ["--algo", "fedavg", "--iter-local", "5", "--client-fraction", "0.5",
                                    "--server-momentum", "0.9", "--server-nesterov", "--fedir",
                                    "--virtual-client-size", "200"],
    "fedprox-iwds-reset": ["--algo", "fedavg", "--iter-local", "5", "--prox-mu", "0.1", "--iwds", "0.9,0.5,0.99",
                           "--reset-momentum", "--server-momentum", "0.9"],
}


def _load(out):
    return json.loads((out / "summary.json").read_text())


def test_blocks_are_contiguous_and_differ_by_at_most_one():
    assert [list(b) for b in blocks(6, 4)] == [[0], [1, 2], [3], [4, 5]]
    assert [len(b) for b in blocks(100, 3)] == [33, 33, 34]
    assert process_of(7, 3) == [0, 0, 1, 1, 2, 2, 2]
    assert [list(b) for b in blocks(5, 5)] == [[0], [1], [2], [3], [4]]


def test_hosted_partitions_go_to_a_gpu_only_with_device_cuda(monkeypatch, tmp_path):
    """Which device and backend a run's processes get (torch.cuda stubbed with one GPU: this
    checks the rule, not CUDA; tests/test_cuda.py runs it on a GPU). One partition per process:
    auto takes the GPU, as before. P > R: only --device cuda does (NCCL when each process has its
    own GPU, gloo when processes share one); auto keeps hosted partitions on the CPU."""
    from geodml.cli import parse_config
    from geodml.preflight import hosting_device, preflight
    from geodml.runtime import Env

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    one, two = Env(0, 1, 0, 1, False), Env(0, 2, 0, 2, True)
    for flags, env, device, backend in ((["--partitions", "5"], one, "cpu", "gloo"),
                                        (["--partitions", "5", "--device", "cuda"], one, "cuda", "nccl"),
                                        (["--partitions", "6", "--device", "cuda"], two, "cuda", "gloo"),
                                        (["--partitions", "6", "--device", "cpu"], two, "cpu", "gloo"),
                                        ([], one, "auto", "nccl")):
        cfg = parse_config(["--dataset", "digits", "--out", str(tmp_path / "run"), *flags])
        assert hosting_device(cfg, cfg.partitions or env.world_size, env.world_size) == device, flags
        assert preflight(cfg, env, data=False).backend == backend, flags


IN_GOLDEN_SUITE = tuple(ALGOS)
"""Settings whose process-count checks the golden suite covers (tests/test_golden.py compares every suite cell's
runs on its first and last process counts with records written before the one-engine change: bsp, gaia-skewscout,
dgc and fedavg-sampled-fedavgm-fedprox at R = 1 and 6; local, fedir-fedvc-fedavgm, iwds-reweight and
fedavg-reset-partial at R = 1 and 2). This test, which compares R = 1, 2, 3 and 6 with each other, runs in the
whole matrix (``-m golden_full``) only, to keep the suite within CI's time."""


@pytest.mark.integration
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.golden_full] if n in IN_GOLDEN_SUITE else [])
                                  for n in ALGOS])
def test_six_partitions_on_one_two_three_and_six_processes_are_bit_identical(name, tmp_path, monkeypatch):
    from tests.support.procs import run_torchrun
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    argv = [*BASE, *ALGOS[name]]
    ref = tmp_path / "r1"
    assert main([*argv, "--out", str(ref)]) == 0
    a = _load(ref)
    assert a["world_size"] == 6 and (a["wan_bytes_total"] > 0) == (name != "local")
    models = ["model.pt", *(f"rank{k}/model.pt" for k in range(6))]
    want = {f: torch.load(ref / f) for f in models}
    for procs in (2, 3, 6):
        out = tmp_path / f"r{procs}"
        r = run_torchrun(procs, [*argv, "--out", str(out)], timeout_s=240)
        assert r.returncode == 0, r.stderr[-3000:]
        b = _load(out)
        for key in SAME:
            assert a.get(key) == b.get(key), (procs, key)
        assert (json.loads((ref / "config.json").read_text())["region_of_rank"]
                == json.loads((out / "config.json").read_text())["region_of_rank"])
        for f in models:
            got = torch.load(out / f)
            assert list(got) == list(want[f])
            for key in got:
                assert torch.equal(got[key], want[f][key]), (procs, f, key)


@pytest.mark.parametrize("name", ["gaia-skewscout", "dgc", "fedavgm-fedir-fedvc-sampled"])
def test_deterministic_kernels_change_nothing_on_the_cpu(name, tmp_path, monkeypatch):
    """--deterministic allows only deterministic kernels (for GPU runs that repeat to the bit).
    The CPU's kernels are deterministic already, so every op these runs use is allowed (none
    raises) and the results are the same bits as without the flag."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # the flag sets it; restored after the test
    argv = [*BASE, *ALGOS[name], "--steps", "20"]
    try:
        assert main([*argv, "--out", str(tmp_path / "free")]) == 0
        assert not torch.are_deterministic_algorithms_enabled()
        assert main([*argv, "--deterministic", "--out", str(tmp_path / "det")]) == 0
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
    a, b = _load(tmp_path / "free"), _load(tmp_path / "det")
    assert {k: a.get(k) for k in SAME} == {k: b.get(k) for k in SAME}
    for f in ("model.pt", "rank3/model.pt"):
        want, got = torch.load(tmp_path / "free" / f), torch.load(tmp_path / "det" / f)
        assert all(torch.equal(got[k], want[k]) for k in want), f


def test_hosted_gpu_partitions_get_small_cublas_workspaces_unless_exported(monkeypatch):
    """Hosted partitions on a GPU: 128 KiB cuBLAS / cuBLASLt workspaces per partition thread
    instead of Hopper's default 32 MiB (docs/performance.md, "GPU: hosted partitions"); ':16:8' is
    one of the two settings cuBLAS documents as deterministic, so --deterministic keeps it; a
    value the user exported wins."""
    from geodml import compose as run_mod
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    run_mod._small_cublas_workspaces()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # 8 chunks of 16 KiB
    assert os.environ["CUBLASLT_WORKSPACE_SIZE"] == "128"  # KiB
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "1024")
    run_mod._small_cublas_workspaces()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and os.environ["CUBLASLT_WORKSPACE_SIZE"] == "1024"


def test_eval_cache_evaluates_each_distinct_model_once(monkeypatch):
    """Partitions holding byte-identical models share one evaluation; a different model (or a
    changed buffer) is evaluated again; the numbers are evaluate()'s."""
    import geodml.trainer as trainer
    calls = []

    def counting(model, x, y, batch=1000, indices=None):
        calls.append(id(model))
        return evaluate(model, x, y, batch, indices=indices)

    monkeypatch.setattr(trainer, "evaluate", counting)
    torch.manual_seed(0)
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))
    a, b, c = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    cache = EvalCache()
    ra, rb, rc = cache.evaluate(a, x, y), cache.evaluate(b, x, y), cache.evaluate(c, x, y)
    assert len(calls) == 2 and ra == rb == evaluate(a, x, y) and rc == evaluate(c, x, y)
    with torch.no_grad():
        b.bias[0] += 1.0
    cache.evaluate(b, x, y)
    assert len(calls) == 3
    rows = torch.tensor([1, 4, 9, 16, 25, 36, 49])  # --partition-eval-examples: the rows are passed through
    assert EvalCache().evaluate(a, x, y, rows) == evaluate(a, x[rows], y[rows]) != evaluate(a, x, y)


def test_evaluate_on_indices_equals_evaluate_on_the_copied_subset():
    """The final per-partition evaluation gathers its rows one batch at a time: the same batches,
    the same bits as evaluating a copy of the partition's rows."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x, y = torch.randn(300, 6), torch.randint(0, 4, (300,))
    idx = torch.randperm(300)[:123]
    assert evaluate(model, x, y, batch=50, indices=idx) == evaluate(model, x[idx], y[idx], batch=50)
    assert evaluate(model, x, y, batch=50, indices=idx)[0] > 0


def test_partition_eval_rows_are_a_seeded_sample_of_the_test_set():
    """--partition-eval-examples N: N distinct test rows in ascending order, the same for the same
    seed, others for another seed; all of them is allowed, more is an input error naming the size."""
    from geodml.trainer import partition_eval_indices
    assert partition_eval_indices(359, None, 0) is None
    rows = partition_eval_indices(359, 100, 0)
    assert rows is not None and len(rows) == 100 and len(set(rows.tolist())) == 100
    assert rows.tolist() == sorted(rows.tolist()) and 0 <= int(rows[0]) and int(rows[-1]) < 359
    assert torch.equal(rows, partition_eval_indices(359, 100, 0))
    assert not torch.equal(rows, partition_eval_indices(359, 100, 1))
    whole = partition_eval_indices(359, 359, 3)
    assert whole is not None and whole.tolist() == list(range(359))
    with pytest.raises(ValueError, match="the test set has 359 examples; choose 1 to 359"):
        partition_eval_indices(359, 360, 0)


def test_partition_eval_examples_score_each_own_model_on_those_rows_and_the_global_on_all(tmp_path):
    """Gaia's six partitions hold six different models. With --partition-eval-examples 100 each
    partition's summary accuracy is its saved model's accuracy on the 100 seeded rows, recomputed
    here with a plain forward pass; the global model is still scored on all 359 test examples."""
    from geodml.data.datasets import load_dataset
    from geodml.models import build_model
    from geodml.trainer import partition_eval_indices
    out = tmp_path / "run"
    argv = [*BASE, *ALGOS["gaia-skewscout"][:4], "--steps", "12", "--seed", "3",
            "--partition-eval-examples", "100", "--out", str(out)]
    assert main(argv) == 0
    s = _load(out)
    assert s["per_rank_val_examples"] == 100
    ds = load_dataset("digits", None, seed=3)
    rows = partition_eval_indices(len(ds.test_y), 100, 3)
    model = build_model("cnn", "none", ds.input_shape, ds.num_classes, generator_seed=3)

    def accuracy(path, x, y):
        model.load_state_dict(torch.load(path))
        with torch.no_grad():
            return float((model.eval()(x).argmax(1) == y).double().mean())

    want = [accuracy(out / f"rank{k}" / "model.pt", ds.test_x[rows], ds.test_y[rows]) for k in range(6)]
    assert len(set(want)) > 1  # the partitions' models differ, so this checks which model got which score
    assert s["per_rank_val_accuracy"] == pytest.approx(want, abs=1e-12)
    assert s["final_val_accuracy"] == pytest.approx(accuracy(out / "model.pt", ds.test_x, ds.test_y), abs=1e-12)


EVAL_AT_FLAGS = {"fedavg": ["--algo", "fedavg", "--iter-local", "5"], "gaia": ["--algo", "gaia", "--t0", "0.05"],
                 "fedavg-bn": ["--algo", "fedavg", "--iter-local", "5", "--norm", "batch"]}


@pytest.mark.parametrize("algo", ["fedavg", "gaia", "fedavg-bn"])
def test_eval_at_adds_validations_at_those_steps_and_changes_no_weight(algo, tmp_path):
    """--eval-at 5,25 with --eval-every 15 over 30 steps validates the global model after steps
    5, 15, 25 and 30 (the end), where the run without it validates after 15 and 30; both runs
    end with the same bits in every model (Gaia's six differ; BatchNorm's buffers included) and
    the same accuracies at the steps they share. FedAvg takes rounds of 5 steps, so 5 and 25 are
    round ends there."""
    from geodml.report import load_run
    argv = [*BASE, *EVAL_AT_FLAGS[algo]]
    plain, extra = tmp_path / "plain", tmp_path / "extra"
    assert main([*argv, "--out", str(plain)]) == 0
    assert main([*argv, "--eval-at", "25,5", "--out", str(extra)]) == 0
    a, b = load_run(plain).evals, load_run(extra).evals
    assert [int(e["step"]) for e in a] == [15, 30]
    assert [int(e["step"]) for e in b] == [5, 15, 25, 30]
    assert [e["val_accuracy"] for e in a] == [e["val_accuracy"] for e in b if int(e["step"]) in (15, 30)]
    assert b[0]["val_accuracy"] != b[-1]["val_accuracy"]  # step 5 scored its own model, not the final one
    assert json.loads((extra / "config.json").read_text())["config"]["eval_at"] == [5, 25]
    for f in ["model.pt", *(f"rank{k}/model.pt" for k in range(6))]:
        want, got = torch.load(plain / f), torch.load(extra / f)
        assert all(torch.equal(got[k], want[k]) for k in want), f


@pytest.mark.integration
def test_hosted_partitions_sigkill_restart_and_resume_equal_one_uninterrupted_process(tmp_path, monkeypatch):
    """P = 6 on R = 2: SIGKILL the process hosting partition 4 after step 23 (checkpoints every 10)
    under torchrun --max-restarts 1. The restarted processes restore every hosted partition's state
    from step 20 and finish bit-identical to an uninterrupted run of the 6 partitions in one process."""
    from tests.support.procs import run_torchrun
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    argv = [*BASE, *ALGOS["gaia-skewscout"], "--checkpoint-every", "10", "--peer-timeout-s", "10"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main([*argv, "--out", str(full)]) == 0
    r = run_torchrun(2, [*argv, "--out", str(cut)], timeout_s=300, extra_torchrun=["--max-restarts", "1"],
                     env={"GEODML_FAULT": "rank=4,step=23,how=kill"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "GEODML_FAULT: rank 4 dies after step 23" in r.stderr and "resumed from step 20" in r.stdout
    for f in ["model.pt", *(f"rank{k}/model.pt" for k in range(6))]:
        a, b = torch.load(full / f), torch.load(cut / f)
        assert all(torch.equal(a[n], b[n]) for n in a), f
    sa, sb = _load(full), _load(cut)
    for key in SAME:
        assert sa.get(key) == sb.get(key), key


@pytest.mark.integration
def test_a_lost_process_of_hosted_partitions_stops_the_run(tmp_path, monkeypatch):
    """P = 6 on R = 3: the process hosting partitions 2-3 (process 1) dies after partition 3's step 5;
    the run ends at once (torchrun stops the other processes; without torchrun's agent the peer watch
    does, as for one partition per process: tests/test_peer_failure.py), not after the 200 steps or a
    timeout, and the failure names process 1."""
    import time

    from tests.support.procs import run_torchrun
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    argv = [*BASE, "--algo", "bsp", "--steps", "200", "--peer-timeout-s", "5", "--out", str(tmp_path / "run")]
    t0 = time.monotonic()
    r = run_torchrun(3, argv, timeout_s=120, env={"GEODML_FAULT": "rank=3,step=5,how=kill"})
    assert r.returncode != 0 and time.monotonic() - t0 < 60
    assert "GEODML_FAULT: rank 3 dies after step 5" in r.stderr
    root = r.stderr[r.stderr.index("Root Cause"):]
    assert "rank      : 1 (local_rank: 1)" in root and "SIGKILL" in root, r.stderr[-3000:]
    assert not (tmp_path / "run" / "summary.json").exists()
