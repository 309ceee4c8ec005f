"""The pool engine (geodml.pool, geodml.pool_gaia): a process's FedAvg or Gaia partitions as state
on one worker model.

It must report exactly what the threads engine reports for the same run: every partition's and
the global model, the whole ledger, the accuracies and losses, and every metrics.jsonl line
(wall-clock and measured-compute fields aside) -- bit for bit, on one process and on two.
"""

from __future__ import annotations

import json

import pytest
import torch

from geodml.cli import main
from geodml.config import RunConfig
from geodml.pool import pool_refusal
from tests.test_partitions import SAME

BASE = ["--dataset", "digits", "--partition", "label", "--skew", "0.8", "--steps", "30", "--no-progress",
        "--wan", "virtual", "--partitions", "6", "--algo", "fedavg", "--iter-local", "5"]
CONFIGS = {
    # a star per round, downloads, FedAvgM and FedProx; evaluations mid-round average every
    # partition's weights (snapshots for those that sat out)
    "sampled-fedavgm-fedprox": ["--client-fraction", "0.5", "--server-momentum", "0.9", "--server-nesterov",
                                "--prox-mu", "0.1", "--eval-every", "7", "--log-every", "3"],
    # every partition every round: one charged all-reduce; momentum reset each round; a partial last round
    "all-reset": ["--reset-momentum", "--steps", "28", "--eval-every", "10", "--log-every", "5",
                  "--weight-decay", "0.001"],
    # the released LeNet's per-parameter lr and decay multipliers (geodml.algorithms.base.regularize)
    "lenet-prototxt-mults": ["--model", "lenet", "--param-mults", "prototxt", "--weight-decay", "0.004",
                             "--client-fraction", "0.5"],
}
EVERY_STEP_BASE = BASE[:BASE.index("--algo")]
EVERY_STEP_CONFIGS = {  # geodml.pool_gaia and geodml.pool_dgc
    # Gaia, mostly sparse updates; evaluations average the partitions' weights
    "gaia-sparse": ["--algo", "gaia", "--t0", "0.05", "--eval-every", "7", "--log-every", "3", "--weight-decay", "0.001"],
    # T0 = 0: nearly every entry significant, so dense messages
    "gaia-dense": ["--algo", "gaia", "--t0", "0", "--eval-every", "10", "--log-every", "5"],
    # the threshold follows a decaying lr (update_threshold); the released LeNet's multipliers
    "gaia-lenet-poly-mults": ["--algo", "gaia", "--t0", "0.1", "--lr-schedule", "poly", "--model", "lenet",
                              "--param-mults", "prototxt", "--weight-decay", "0.004"],
    # DGC through its warm-up stages (sampled thresholds from every partition's own generator)
    "dgc-warmup": ["--algo", "dgc", "--e-warm", "0.3", "--eval-every", "7", "--log-every", "3"],
    # per-layer selection, clipping of the update, a dense wire (sparsity below 50%)
    "dgc-layer-clip-dense": ["--algo", "dgc", "--e-warm", "0", "--sparsity", "0.3", "--dgc-scope", "layer",
                             "--clip-norm", "0.5", "--dgc-clip-at", "update", "--log-every", "4"],
    # per-layer at the final sparsity, local gradient clipping, LeNet with the released multipliers
    "dgc-layer-lenet": ["--algo", "dgc", "--e-warm", "0", "--dgc-scope", "layer", "--clip-norm", "1",
                        "--model", "lenet", "--param-mults", "prototxt", "--weight-decay", "0.004"],
}
NOT_COMPARED = {"wall_s", "emulated_s",  # measured
                # FedAvgM's norm: the pool logs the server's v; the threads engine rank 0's copy, stale
                # when rank 0 sat the round out
                "fedavgm_server_momentum_norm"}


def _metrics(out):
    return [{k: v for k, v in json.loads(line).items() if k not in NOT_COMPARED}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def _same_run(a, b):
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    for key in SAME:
        assert sa.get(key) == sb.get(key), key
    assert _metrics(a) == _metrics(b)
    for f in ["model.pt", *(f"rank{k}/model.pt" for k in range(sa["world_size"]))]:
        x, y = torch.load(a / f), torch.load(b / f)
        assert list(x) == list(y) and all(torch.equal(x[n], y[n]) for n in x), f


def _cfg(*argv):
    from geodml.cli import parse_config
    return parse_config(list(argv))


def test_what_the_pool_engine_runs_and_refuses():
    assert pool_refusal(RunConfig()) is not None                       # bsp
    assert pool_refusal(_cfg("--algo", "fedavg", "--server-momentum", "0.9", "--prox-mu", "0.1",
                             "--reset-momentum", "--client-fraction", "0.1")) is None
    assert pool_refusal(_cfg("--algo", "gaia", "--t0", "0.05")) is None
    assert pool_refusal(_cfg("--algo", "dgc", "--dgc-scope", "layer")) is None
    for argv, why in ((["--algo", "local"], "--algo local"), (["--algo", "bsp"], "--algo bsp"),
                      (["--algo", "gaia", "--skewscout"], "--skewscout"), (["--algo", "fedavg", "--fedir"], "FedIR"),
                      (["--algo", "fedavg", "--skewscout"], "--skewscout"),
                      (["--algo", "fedavg", "--checkpoint-every", "5"], "checkpoints"),
                      (["--algo", "fedavg", "--wan", "real"], "--wan real"),
                      (["--algo", "fedavg", "--model", "lenet", "--norm", "batch"], "--norm batch")):
        assert why in (pool_refusal(_cfg(*argv)) or ""), argv


def test_engine_pool_with_what_it_does_not_run_is_an_input_error(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["--algo", "bsp", "--engine", "pool", "--partitions", "3", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == ("geodml: error: --engine pool does not run --algo bsp (the pool engine runs the FedAvg "
                      "family, Gaia and DGC; other algorithms use threads); use --engine threads (or auto)")
    assert not out.exists()


def _pool_equals_threads(argv, tmp_path):
    assert main([*argv, "--engine", "threads", "--out", str(tmp_path / "threads")]) == 0
    assert main([*argv, "--engine", "pool", "--out", str(tmp_path / "pool")]) == 0
    assert json.loads((tmp_path / "pool" / "config.json").read_text())["engine"] == "pool"
    _same_run(tmp_path / "threads", tmp_path / "pool")
    return {e: json.loads((tmp_path / e / "summary.json").read_text()) for e in ("threads", "pool")}


def _two_processes_equal_one(argv, tmp_path, monkeypatch):
    from tests.support.procs import run_torchrun
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    assert main([*argv, "--out", str(tmp_path / "r1")]) == 0
    r = run_torchrun(2, [*argv, "--out", str(tmp_path / "r2")], timeout_s=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "pool engine" in r.stdout
    _same_run(tmp_path / "r1", tmp_path / "r2")


@pytest.mark.integration
@pytest.mark.parametrize("name", list(CONFIGS))
def test_pool_equals_threads_bit_for_bit(name, tmp_path):
    summaries = _pool_equals_threads([*BASE, *CONFIGS[name]], tmp_path)
    # summary.json names the variants the flags built, in both engines (algo stays --algo's value)
    variant = {"sampled-fedavgm-fedprox": "fedprox+fedavgm"}.get(name, "fedavg")
    assert [(s["algo"], s["algo_variant"]) for s in summaries.values()] == [("fedavg", variant)] * 2


@pytest.mark.integration
@pytest.mark.parametrize("name", list(EVERY_STEP_CONFIGS))
def test_gaia_and_dgc_pools_equal_threads_bit_for_bit(name, tmp_path):
    _pool_equals_threads([*EVERY_STEP_BASE, *EVERY_STEP_CONFIGS[name]], tmp_path)
    s = json.loads((tmp_path / "pool" / "summary.json").read_text())
    gaia = name.startswith("gaia")
    assert s["algo_variant"] == s["algo"] == ("gaia" if gaia else "dgc")
    assert s["final_model"] == ("average_of_weights" if gaia else "global")
    assert s["per_rank_val_examples"] is None  # no --partition-eval-examples: the whole test set
    assert s["wan_bytes_by_kind"]["update" if gaia else "gradient"] > 0 and s["wan_messages_total"] == 30 * 6 * 5
    models = [torch.load(tmp_path / "pool" / f"rank{k}/model.pt") for k in range(6)]
    # Gaia's partitions keep models of their own; DGC's all hold the one model
    assert gaia != all(torch.equal(models[0][n], models[1][n]) for n in models[0])
    if name.endswith("dense"):  # every message on each of the 30 links a dense float32 vector and an envelope
        n = sum(v.numel() for v in models[0].values())
        per_message = {b / 30 - 4 * n for b in s["bytes_by_link"].values()}
        assert len(s["bytes_by_link"]) == 30 and len(per_message) == 1 and 0 < per_message.pop() < 100


@pytest.mark.integration
def test_gaia_pool_without_the_c_kernels_equals_with_them(tmp_path, monkeypatch):
    """GEODML_NO_KERNELS's path (NumPy selection, received updates added sender by sender with
    torch) against the compiled one (fused selection, gaia_add_rows row by row): the same run."""
    from geodml import kernels
    if kernels.compiled is None:
        pytest.fail(f"geodml._kernels is not built: {kernels.UNAVAILABLE_REASON}")
    argv = [*EVERY_STEP_BASE, *EVERY_STEP_CONFIGS["gaia-sparse"], "--engine", "pool"]
    assert main([*argv, "--out", str(tmp_path / "c")]) == 0
    monkeypatch.setattr(kernels, "compiled", None)
    assert main([*argv, "--out", str(tmp_path / "torch")]) == 0
    _same_run(tmp_path / "c", tmp_path / "torch")


@pytest.mark.integration
def test_pool_on_two_processes_equals_one(tmp_path, monkeypatch):
    _two_processes_equal_one([*BASE, *CONFIGS["sampled-fedavgm-fedprox"], "--engine", "auto"], tmp_path, monkeypatch)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["gaia-sparse", "dgc-warmup"])
def test_gaia_and_dgc_pools_on_two_processes_equal_one(name, tmp_path, monkeypatch):
    """Every partition sends to every other each step: across the two processes through ZeroMQ.
    Three partitions: the first process hosts two (one hosted partner holds each one's update),
    the second hosts one, which receives no hosted partner's copy of its own update (Gaia skips
    it; DGC keeps its own block for the sum)."""
    argv = [*EVERY_STEP_BASE, *EVERY_STEP_CONFIGS[name], "--engine", "auto", "--partitions", "3"]
    _two_processes_equal_one(argv, tmp_path, monkeypatch)


@pytest.mark.integration
@pytest.mark.parametrize("algo", [["fedavg", "--iter-local", "5"], ["gaia", "--t0", "0.05"], ["dgc", "--e-warm", "0.3"]])
def test_pool_with_one_partition_equals_the_classic_run(algo, tmp_path):
    """P = R = 1 on the pool engine (the bench's fixed-cost run): no all-reduce is charged, as
    Comm.all_reduce charges none with one rank; the result is the one-process run's."""
    argv = ["--dataset", "digits", "--steps", "12", "--no-progress", "--algo", *algo]
    assert main([*argv, "--out", str(tmp_path / "classic")]) == 0
    assert main([*argv, "--engine", "pool", "--out", str(tmp_path / "pool")]) == 0
    sa, sb = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("classic", "pool"))
    for key in SAME:
        assert sa.get(key) == sb.get(key), key
    assert sb["wan_bytes_total"] == 0 and sb["messages_total"] == 0
    x, y = (torch.load(tmp_path / d / "model.pt") for d in ("classic", "pool"))
    assert all(torch.equal(x[n], y[n]) for n in x)
