"""The paper's studies (geodml.study.paper, geodml.study.skewscout): planning, per-algorithm lr, reports, one real quick study."""

from __future__ import annotations

import csv
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from geodml.study import STUDIES, paper, runner, skewscout
from tests.support.procs import DoneProc


def no_launch(spec, stdout, stderr):
    raise AssertionError(f"launched {spec.run_id}")


def planned(name, argv, tmp_path):
    args, budget, cells = paper.prepare(name, [*argv, "--out", str(tmp_path / "s")])
    return args, budget, {c.spec.run_id: c for c in cells}


def flag(argv, name):
    """The last value of a flag (argparse semantics)."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == name][-1]


# ---- budgets, learning rates, planning -----------------------------------------------------------

def test_learning_rate_per_algorithm():
    """The paper's rule: one eta; its BSP sums K gradients, geodml's averages, so BSP runs at K x eta."""
    assert paper.lr_for("bsp", 0.002, 5, "paper") == 0.01 and paper.lr_for("bsp", 0.005, 2, "paper") == 0.01
    for algo in ("gaia", "dgc", "fedavg"):
        assert paper.lr_for(algo, 0.002, 5, "paper") == 0.002
    # the rule of the studies before issue 21, kept for their reports
    assert paper.lr_for("bsp", 0.01, 5, "divide") == 0.01 and paper.lr_for("fedavg", 0.01, 5, "divide") == 0.01
    assert paper.lr_for("gaia", 0.01, 5, "divide") == pytest.approx(0.002)
    assert paper.lr_for("dgc", 0.02, 4, "divide") == pytest.approx(0.005)
    assert paper.lr_for("gaia", 0.01, 5, "same") == 0.01


def test_full_budget_scales_schedule_and_dgc_warmup(tmp_path):
    args, budget, cells = planned("noniid", ["--epochs", "4", "--lr", "0.01", "--dataset", "digits"], tmp_path)
    assert budget.flags() == ["--epochs", "4", "--lr-milestones", "2,3", "--eval-every", "500", "--batch-size", "20"]
    assert len(cells) == 8 * 3  # seeds 0, 1, 2 by default
    dgc = cells["dgc-e_warm-8-iid-s0"].spec.argv
    assert flag(dgc, "--e-warm") == "0.25"  # 8 paper epochs x 4/128
    assert flag(dgc, "--dgc-scope") == "layer" and "--dgc-scope" not in cells["gaia-t0-0.1-iid-s0"].spec.argv
    # eta = 0.01: Gaia, DGC and FedAvg at eta, BSP at K x eta
    assert flag(dgc, "--lr") == "0.01" and flag(cells["gaia-t0-0.1-noniid-100-s1"].spec.argv, "--lr") == "0.01"
    assert flag(cells["bsp-iid-s0"].spec.argv, "--lr") == "0.05"
    assert flag(cells["fedavg-iter_local-20-iid-s2"].spec.argv, "--lr") == "0.01"
    assert flag(cells["gaia-t0-0.1-iid-s0"].spec.argv, "--t0") == "0.1"
    assert flag(cells["fedavg-iter_local-20-iid-s0"].spec.argv, "--iter-local") == "20"
    non = cells["bsp-noniid-100-s2"].spec.argv
    assert flag(non, "--partition") == "label" and flag(non, "--skew") == "1" and flag(non, "--seed") == "2"
    assert cells["bsp-noniid-100-s2"].seed == 2 and flag(non, "--model") == "lenet"  # the paper's network by default
    # the paper's own schedule and eta by default: BSP at 5 x 0.002
    _, b, cells = planned("noniid", [], tmp_path)
    assert b.flags()[:4] == ["--epochs", "128", "--lr-milestones", "64,96"] and b.lr == 0.002
    assert flag(cells["bsp-iid-s0"].spec.argv, "--lr") == "0.01"
    assert flag(cells["gaia-t0-0.1-iid-s0"].spec.argv, "--lr") == "0.002"
    # the earlier rule on request (--sum-lr is its old name)
    _, _, cells = planned("noniid", ["--sum-lr", "divide", "--lr", "0.01", "--seeds", "4"], tmp_path)
    assert flag(cells["bsp-iid-s4"].spec.argv, "--lr") == "0.01"
    assert flag(cells["gaia-t0-0.1-iid-s4"].spec.argv, "--lr") == "0.002"
    assert flag(cells["fedavg-iter_local-20-iid-s4"].spec.argv, "--lr") == "0.01" and len(cells) == 8


@pytest.mark.parametrize("name, argv, count, some", [
    ("noniid", [], 8, "dgc-e_warm-8-noniid-100-s0"),
    ("noniid", ["--model", "resnet20"], 8, "gaia-t0-0.1-noniid-100-s0"),  # BN-ResNet-20, Figure 1's
    ("norm", [], 24, "gaia-t0-0.1-gn-lenet-noniid-100-s0"),       # (BN, GN, GN 2 groups) x 4 algos x 2
    ("norm", [], 24, "bsp-gn2g-lenet-iid-s0"),
    ("skew", [], 12, "fedavg-iter_local-20-gn-lenet-noniid-80-s0"),   # 4 algos x (iid, 20%, 80%)
    ("skew", ["--budget", "full", "--seeds", "0"], 20, "bsp-gn-lenet-noniid-40-s0"),  # 4 algos x (iid, 20..80%)
    ("skew", ["--budget", "full"], 60, "bsp-gn-lenet-noniid-40-s2"),  # x 3 seeds
    ("hparams", [], 14, "dgc-e_warm-1-noniid-100-s0"),               # BSP x2 + 3 algos x 2 grid ends x 2
    ("hparams", ["--budget", "full", "--seeds", "0"], 40, "fedavg-iter_local-500-iid-s0"),  # 2 + (7 + 7 + 5) x 2
    ("dirichlet", [], 4, "fedavgm-iter_local-20-dirichlet-0.1-s0"),
    ("noniid", ["--algos", "fedavg"], 4, "bsp-iid-s0"),               # BSP is always added
    ("brn", [], 4, "bsp-brn-lenet-noniid-100-s0"),                    # Table 9: BN, BRN x IID, non-IID
    ("brn", ["--budget", "full"], 12, "bsp-bn-lenet-iid-s2"),  # the 2-partition solver: eta 0.005, batch 50
])
def test_study_plans(name, argv, count, some, tmp_path):
    budget = [] if "--budget" in argv else ["--budget", "quick"]
    _, _, cells = planned(name, [*budget, *argv], tmp_path)
    assert len(cells) == count and some in cells
    if name == "brn":  # Table 9 is K = 2, BSP only
        assert all(c.spec.nproc == 2 and c.algo == "bsp" for c in cells.values())
        if "full" in argv:  # BSP at K x eta = 2 x 0.005, 50 per partition (global batch 100, as at K = 5)
            assert flag(cells[some].spec.argv, "--lr") == "0.01" and flag(cells[some].spec.argv, "--batch-size") == "50"
        assert flag(cells["bsp-brn-lenet-iid-s0"].spec.argv, "--norm") == "batchrenorm"


def test_study_model_choice(tmp_path):
    """--model lenet (the default: the authors' network), cnn (what the studies ran before issue 21) or resnet20."""
    _, _, cells = planned("norm", ["--budget", "quick", "--model", "cnn"], tmp_path)
    assert flag(cells["bsp-bn-cnn-iid-s0"].spec.argv, "--model") == "cnn" and cells["bsp-bn-cnn-iid-s0"].model == "BN-CNN"
    _, _, cells = planned("norm", ["--budget", "quick"], tmp_path)
    assert flag(cells["bsp-gn-lenet-iid-s0"].spec.argv, "--model") == "lenet"
    assert cells["bsp-gn-lenet-iid-s0"].model == "GN-LeNet" and cells["bsp-gn-lenet-iid-s0"].spec.argv.count("--model") == 1
    assert paper.model_label("lenet", "batchrenorm") == "BRN-LeNet"
    # Figure 1's ResNet-20 has BatchNorm: the un-normalized figures run it as BN-ResNet-20, untagged
    _, _, cells = planned("noniid", ["--budget", "quick", "--model", "resnet20"], tmp_path)
    assert flag(cells["bsp-iid-s0"].spec.argv, "--norm") == "batch" and cells["bsp-iid-s0"].model == "BN-ResNet-20"
    # the authors' networks train with their prototxts' lr / decay multipliers; McMahan's CNN has none
    assert flag(cells["bsp-iid-s0"].spec.argv, "--param-mults") == "prototxt"
    _, _, cells = planned("noniid", ["--budget", "quick"], tmp_path)
    assert flag(cells["gaia-t0-0.1-noniid-100-s0"].spec.argv, "--param-mults") == "prototxt"
    _, _, plan = paper.prepare("noniid", ["--budget", "quick", "--out", str(tmp_path / "s"), "--", "--param-mults", "none"])
    assert flag({c.spec.run_id: c for c in plan}["gaia-t0-0.1-noniid-100-s0"].spec.argv, "--param-mults") == "none"
    _, _, cells = planned("noniid", ["--budget", "quick", "--model", "cnn"], tmp_path)
    assert "--param-mults" not in cells["bsp-iid-s0"].spec.argv


def test_norm_and_dirichlet_flags(tmp_path):
    _, _, cells = planned("norm", ["--budget", "quick"], tmp_path)
    assert flag(cells["bsp-bn-lenet-iid-s0"].spec.argv, "--norm") == "batch"
    gn = cells["bsp-gn-lenet-iid-s0"].spec.argv
    assert flag(gn, "--norm") == "group" and "--gn-groups" not in gn  # the text's reading: group size 2
    gn2 = cells["bsp-gn2g-lenet-iid-s0"].spec.argv  # the released prototxt's: 2 groups
    assert flag(gn2, "--norm") == "group" and flag(gn2, "--gn-groups") == "2"
    _, _, cells = planned("dirichlet", ["--budget", "quick", "--server-momentum", "0.8"], tmp_path)
    m = cells["fedavgm-iter_local-20-dirichlet-0.1-s0"].spec.argv
    assert flag(m, "--alpha") == "0.1" and flag(m, "--server-momentum") == "0.8" and flag(m, "--server-lr") == "0.2"
    assert "--server-momentum" not in cells["fedavg-iter_local-20-dirichlet-0.1-s0"].spec.argv


def _fig8(tmp_path, *extra):
    args, budget = skewscout.parse(["--budget", "quick", "--steps", "8", "--algos", "gaia", "--grid", "0.05,0.5",
                                    "--seeds", "0,1", "--levels", "1", "--out", str(tmp_path / "s"), *extra])
    return args, budget, {r.spec.run_id: r for r in skewscout.plan(args, budget)}


def test_skewscout_plan_seeds_grid_and_cadence(tmp_path):
    """Figure 8: per seed BSP-IID and BSP, the Oracle's every theta and SkewScout over the same grid, same seeds."""
    _, _, runs = _fig8(tmp_path)
    assert list(runs) == ["bsp-iid-s0", "bsp-iid-s1", "bsp-label-1-s0", "bsp-label-1-s1",
                          "gaia-t0-0.05-label-1-s0", "gaia-t0-0.5-label-1-s0", "gaia-skewscout-label-1-s0",
                          "gaia-t0-0.05-label-1-s1", "gaia-t0-0.5-label-1-s1", "gaia-skewscout-label-1-s1"]
    sc = runs["gaia-skewscout-label-1-s1"].spec.argv
    assert flag(sc, "--seed") == "1" and flag(sc, "--lr") == "0.004" and flag(sc, "--norm") == "group"  # eta, GN-LeNet
    assert flag(sc, "--travel-decisions") == "128" and flag(sc, "--skewscout-grid") == "0.05,0.5"
    assert flag(sc, "--t0") == "0.1" and "--travel-every" not in sc  # starts at the paper's Figure 1 T0
    theta = runs["gaia-t0-0.5-label-1-s0"].spec.argv
    assert flag(theta, "--t0") == "0.5" and "--skewscout" not in theta and flag(theta, "--seed") == "0"
    assert flag(runs["bsp-iid-s0"].spec.argv, "--partition") == "iid"
    _, _, runs = _fig8(tmp_path, "--travel-every", "3")
    assert flag(runs["gaia-skewscout-label-1-s0"].spec.argv, "--travel-every") == "3"
    assert runs["gaia-t0-0.05-label-1-s0"].spec.argv == _fig8(tmp_path)[2]["gaia-t0-0.05-label-1-s0"].spec.argv


def test_skewscout_full_plan_uses_the_extended_grids(tmp_path):
    args, budget = skewscout.parse(["--budget", "full", "--epochs", "2", "--out", str(tmp_path / "s")])
    runs = skewscout.plan(args, budget)
    # 3 seeds x (BSP-IID + 5 levels x (BSP + Gaia 11 + 1 + FedAvg 9 + 1 + DGC 5 + 1))
    assert len(runs) == 3 * (1 + 5 * (1 + 12 + 10 + 6))
    assert skewscout.fig8_grid("gaia")[-3:] == (0.5, 0.75, 1.0)
    assert skewscout.fig8_grid("gaia")[:3] == (0.005, 0.01, 0.02) and skewscout.fig8_grid("fedavg")[:3] == (1, 2, 5)
    dgc = next(r for r in runs if r.role == "skewscout" and r.algo == "dgc").spec.argv
    # E_warm in paper epochs x 2/128, as every DGC run of the studies
    assert flag(dgc, "--skewscout-grid") == "0.125,0.0625,0.046875,0.03125,0.015625" and flag(dgc, "--e-warm") == "0.125"
    assert flag(dgc, "--dgc-scope") == "layer"  # the paper's (Lin et al., the released code): per layer


@pytest.mark.parametrize("extra, message", [
    (["--travel-every", "5", "--travel-decisions", "4"], "give one"),
    (["--travel-decisions", "0"], "--travel-decisions must be >= 1"),
    (["--algos", "gaia,fedavg"], "--grid replaces one algorithm's grid"),
    (["--levels", "0"], "--levels are non-IID fractions"),
    (["--", "--seed", "3"], "--seed are set by the study"),
    (["--", "--skewscout-grid", "0.1,0.2"], "--skewscout-grid are set by the study"),
    (["--", "--t0=0.3"], "--t0 are set by the study"),  # paper's study flags too, in the '=' form
])
def test_skewscout_bad_arguments(tmp_path, capsys, extra, message):
    base = ["--budget", "quick", "--steps", "8", "--grid", "0.05,0.5", "--out", str(tmp_path / "s")]
    algos = [] if "--algos" in extra else ["--algos", "gaia"]
    assert skewscout.main([*base, *algos, *extra], launcher=no_launch) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--nproc", "1"], "--nproc must be >= 2"),
    (["--algos", "bsp,foo"], "subset of"),
    (["--budget", "quick", "--epochs", "3"], "--epochs is for --budget full"),
    (["--steps", "3"], "--steps is for --budget quick"),
    (["--lr", "-1"], "--lr must be > 0"),
    (["--", "--lr", "0.1"], "--lr are set by the study"),
    (["--", "--lr=0.1"], "--lr are set by the study"),
    (["--", "--no-such-flag"], "unrecognized arguments"),
    (["--", "--batch-size", "0"], "batch"),
])
def test_bad_arguments_exit_2_before_launching(argv, message, tmp_path, capsys):
    cut = argv.index("--") if "--" in argv else len(argv)
    try:
        rc = paper.noniid([*argv[:cut], "--out", str(tmp_path / "o"), *argv[cut:]], launcher=no_launch)
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# ---- report from finished runs (no launch) ---------------------------------------------------------

def fake_runs(tmp_path, name, argv, summaries):
    args, _, cells = paper.prepare(name, [*argv, "--out", str(tmp_path / "s")])
    for c in cells:
        c.spec.out.mkdir(parents=True)
        (c.spec.out / "launch.json").write_text(json.dumps(runner.launch_record(c.spec)))
        if summaries.get(c.spec.run_id) is not None:
            (c.spec.out / "summary.json").write_text(json.dumps(summaries[c.spec.run_id]))
    return tmp_path / "s"


def summ(acc, wan):
    return {"final_val_accuracy": acc, "wan_bytes_total": wan, "final_val_loss": 0.5, "final_train_loss": 0.4,
            "emulated_seconds": 10.0, "wall_seconds": 2.0}


QUICK = ["--budget", "quick", "--algos", "gaia,fedavg", "--nproc", "3"]
DONE = {"bsp-iid-s0": summ(0.90, 1_000_000), "bsp-noniid-100-s0": summ(0.88, 1_000_000),
        "gaia-t0-0.1-iid-s0": summ(0.89, 50_000), "gaia-t0-0.1-noniid-100-s0": summ(0.10, 40_000),
        "fedavg-iter_local-20-iid-s0": summ(0.905, 50_000), "fedavg-iter_local-20-noniid-100-s0": summ(0.60, 50_000)}


def test_report_numbers_from_reused_runs(tmp_path, capsys):
    out = fake_runs(tmp_path, "noniid", QUICK, DONE)
    assert paper.noniid([*QUICK, "--out", str(out)], launcher=no_launch) == 0
    text = capsys.readouterr().out
    assert text.count("] reused ") == 6
    rep = json.loads((out / "noniid.json").read_text())
    by = {r["run_id"]: r for r in rep["rows"]}
    assert by["gaia-t0-0.1-noniid-100-s0"]["vs_bsp_iid_pp"] == pytest.approx(-80.0)  # 10% - 90%
    assert by["gaia-t0-0.1-noniid-100-s0"]["savings_vs_bsp"] == pytest.approx(25.0)  # 1e6 / 4e4 (BSP in the same setting)
    assert by["fedavg-iter_local-20-iid-s0"]["vs_bsp_iid_pp"] == pytest.approx(0.5)
    assert by["bsp-noniid-100-s0"]["vs_bsp_iid_pp"] == pytest.approx(-2.0) and by["bsp-iid-s0"]["savings_vs_bsp"] == 1.0
    md = (out / "noniid.md").read_text()
    assert "| Gaia T0=10% | 89.0% (-1.0 pp) | 10.0% (-80.0 pp) |" in md
    assert "| FedAvg Iter_Local=20 | 90.5% (+0.5 pp) | 60.0% (-30.0 pp) |" in md
    # the paper's CIFAR-10 LeNet numbers beside ours (Table 6: 76.7% / 10.0%; 77.4% is its BSP-IID)
    assert "| Gaia T0=10% | 89.0% (-1.0 pp) | 10.0% (-80.0 pp) | 76.7% (-0.7 pp) | 10.0% (-67.4 pp) |" in md
    assert "| BSP | 90.0% (+0.0 pp) | 88.0% (-2.0 pp) | 77.4% (+0.0 pp) | 76.6% (-0.8 pp) |" in md
    with open(out / "noniid.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and rows[0]["run_id"] == "bsp-iid-s0" and float(rows[3]["savings_vs_bsp"]) == pytest.approx(25.0)
    for png in ("accuracy.png", "accuracy_vs_wan_bytes.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hparams_report_pairs_each_knob_with_the_paper(tmp_path, capsys):
    """Tables 6-8 from reused runs: savings beside accuracy, the paper's LeNet value of the same knob, knobs.png."""
    argv = ["--budget", "quick", "--nproc", "3"]
    done = {"bsp-iid-s0": summ(0.90, 1_000_000), "bsp-noniid-100-s0": summ(0.89, 1_000_000),
            "gaia-t0-0.02-iid-s0": summ(0.89, 100_000), "gaia-t0-0.02-noniid-100-s0": summ(0.80, 400_000),
            "gaia-t0-0.5-iid-s0": summ(0.88, 20_000), "gaia-t0-0.5-noniid-100-s0": summ(0.50, 250_000),
            "fedavg-iter_local-5-iid-s0": summ(0.9, 200_000), "fedavg-iter_local-5-noniid-100-s0": summ(0.7, 200_000),
            "fedavg-iter_local-1000-iid-s0": summ(0.8, 1_000), "fedavg-iter_local-1000-noniid-100-s0": summ(0.3, 1_000),
            "dgc-e_warm-8-iid-s0": summ(0.85, 125_000), "dgc-e_warm-8-noniid-100-s0": summ(0.6, 125_000),
            "dgc-e_warm-1-iid-s0": summ(0.84, 50_000), "dgc-e_warm-1-noniid-100-s0": summ(0.5, 50_000)}
    out = fake_runs(tmp_path, "hparams", argv, done)
    assert paper.hparams([*argv, "--out", str(out)], launcher=no_launch) == 0
    md = (out / "hparams.md").read_text()
    # ours: 89% - 90% = -1.0 pp, 1e6/1e5 = x10; paper Table 6 LeNet T0=2%: 76.9% (77.4 - 0.5), 52.6% (-24.8)
    assert "| Gaia T0=2% | 89.0% (-1.0 pp, x10.0) | 80.0% (-10.0 pp, x2.5) | 76.9% (-0.5 pp) | 52.6% (-24.8 pp) |" in md
    # Table 7 Iter_Local=1000: 78.3% / 19.0%; Table 8 E_warm=1: 10.0% / 39.9%
    assert ("| FedAvg Iter_Local=1000 | 80.0% (-10.0 pp, x1000.0) | 30.0% (-60.0 pp, x1000.0) | 78.3% (+0.9 pp) "
            "| 19.0% (-58.4 pp) |") in md
    assert "| 84.0% (-6.0 pp, x20.0) | 50.0% (-40.0 pp, x20.0) | 10.0% (-67.4 pp) | 39.9% (-37.5 pp) |" in md
    with open(out / "hparams.csv") as f:
        rows = {r["run_id"]: r for r in csv.DictReader(f)}
    assert float(rows["dgc-e_warm-1-iid-s0"]["theta"]) == 1.0
    assert float(rows["dgc-e_warm-1-iid-s0"]["paper_accuracy"]) == pytest.approx(0.1)
    assert rows["bsp-iid-s0"]["theta"] == "" and float(rows["bsp-noniid-100-s0"]["paper_accuracy"]) == pytest.approx(0.766)
    assert (out / "knobs.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # no paper number exists for other models, other skews or FedAvgM
    assert paper.paper_accuracy("gaia", 0.1, "GN-LeNet", "iid") is None
    assert paper.paper_accuracy("gaia", 0.1, "LeNet", "noniid-80%") is None
    assert paper.paper_accuracy("fedavgm", 20.0, "LeNet", "iid") is None


def test_seeds_mean_sd_and_the_partitions_own_accuracy(tmp_path, capsys):
    """Two seeds: cells are mean +- sample sd; accuracy is the partitions' own models' mean (the
    released code's measure), the global model's beside it; per-run rows pair with BSP-IID of their seed."""
    argv = ["--budget", "quick", "--algos", "gaia", "--nproc", "2", "--seeds", "0,1"]

    def run(per, final, wan):
        return {**summ(final, wan), "per_rank_val_accuracy": per}
    done = {"bsp-iid-s0": run([0.90, 0.90], 0.90, 1_000_000), "bsp-iid-s1": run([0.92, 0.92], 0.92, 1_000_000),
            "bsp-noniid-100-s0": run([0.88, 0.88], 0.88, 1_000_000), "bsp-noniid-100-s1": run([0.86, 0.86], 0.86, 1_000_000),
            "gaia-t0-0.1-iid-s0": run([0.88, 0.88], 0.88, 50_000), "gaia-t0-0.1-iid-s1": run([0.90, 0.90], 0.90, 50_000),
            "gaia-t0-0.1-noniid-100-s0": run([0.10, 0.30], 0.60, 40_000),   # own models 20%, global model 60%
            "gaia-t0-0.1-noniid-100-s1": run([0.20, 0.40], 0.70, 60_000)}   # 30%, 70%
    out = fake_runs(tmp_path, "noniid", argv, done)
    assert paper.noniid([*argv, "--out", str(out)], launcher=no_launch) == 0
    md = (out / "noniid.md").read_text()
    # BSP-IID 91 +- 1.414 (sd of 0.90, 0.92); Gaia non-IID own 25 +- 7.07 (-66 pp), averaged 65 +- 7.07
    assert "| BSP | 91.0 ± 1.4% (+0.0 pp) | 87.0 ± 1.4% (-4.0 pp) |" in md
    assert ("| Gaia T0=10% | 89.0 ± 1.4% (-2.0 pp) | 25.0 ± 7.1% (-66.0 pp, global model 65.0 ± 7.1%) "
            "| 76.7% (-0.7 pp) | 10.0% (-67.4 pp) |") in md
    rep = json.loads((out / "noniid.json").read_text())
    by = {r["run_id"]: r for r in rep["rows"]}
    assert by["gaia-t0-0.1-noniid-100-s1"]["accuracy"] == pytest.approx(0.30)
    assert by["gaia-t0-0.1-noniid-100-s1"]["vs_bsp_iid_pp"] == pytest.approx(30 - 92)  # its own seed's BSP-IID
    assert by["gaia-t0-0.1-noniid-100-s1"]["savings_vs_bsp"] == pytest.approx(1e6 / 6e4)
    cell = next(c for c in rep["cells"] if c["algo"] == "gaia" and c["setting"] == "noniid-100%")
    assert cell["accuracy"] == pytest.approx(0.25) and cell["accuracy_sd"] == pytest.approx(0.05 * 2 ** 0.5)
    assert cell["global_accuracy"] == pytest.approx(0.65) and cell["savings_vs_bsp"] == pytest.approx(20.0)  # 1e6 / 5e4
    assert cell["seeds"] == "0,1" and cell["status"] == "ok" and rep["seeds"] == [0, 1] and rep["lr_rule"] == "paper"
    with open(out / "noniid_cells.csv") as f:
        cells = list(csv.DictReader(f))
    assert len(cells) == 4 and float(cells[0]["accuracy_sd"]) == pytest.approx(0.01 * 2 ** 0.5)


def python_launcher(code):
    def launch(spec, stdout, stderr):
        return subprocess.Popen([sys.executable, "-c", code, str(spec.out)], stdout=stdout, stderr=stderr,
                                start_new_session=True)
    return launch


@pytest.mark.integration
def test_failed_run_is_reported_and_excluded(tmp_path, capsys):
    out = fake_runs(tmp_path, "noniid", QUICK, {**DONE, "bsp-iid-s0": None})
    failing = python_launcher("import sys; sys.stderr.write('boom: no data\\n'); sys.exit(3)")
    assert paper.noniid([*QUICK, "--out", str(out)], launcher=failing) == 1
    captured = capsys.readouterr()
    assert "FAILED bsp-iid" in captured.out and "boom: no data" in captured.out and "bsp-iid-s0" in captured.err
    rep = json.loads((out / "noniid.json").read_text())
    assert rep["failed"] == ["bsp-iid-s0"]
    assert all(r["vs_bsp_iid_pp"] is None for r in rep["rows"])  # no reference, no relative numbers
    md = (out / "noniid.md").read_text()
    assert "| BSP | FAILED (exit 3) | 88.0% |" in md and "Failed (excluded from comparisons): bsp-iid-s0: exit code 3" in md


# ---- one real quick study (machinery, not science) --------------------------------------------------

@pytest.mark.integration
def test_quick_noniid_study_runs_and_resumes(tmp_path, capsys):
    """BSP and Gaia, IID vs 100% non-IID, K=2, 4 steps each: 4 torchrun runs, then all reused."""
    out = tmp_path / "quick"
    argv = ["--budget", "quick", "--nproc", "2", "--algos", "gaia", "--steps", "4", "--out", str(out),
            "--run-timeout", "240", "--", "--no-progress", "--comm-timeout", "120"]
    assert paper.noniid(argv) == 0, capsys.readouterr()
    rep = json.loads((out / "noniid.json").read_text())
    assert [r["run_id"] for r in rep["rows"]] == ["bsp-iid-s0", "bsp-noniid-100-s0", "gaia-t0-0.1-iid-s0",
                                                  "gaia-t0-0.1-noniid-100-s0"]
    for r in rep["rows"]:
        s = json.loads((Path(r["dir"]) / "summary.json").read_text())
        cfg = json.loads((Path(r["dir"]) / "config.json").read_text())["config"]
        assert r["status"] == "ok" and s["steps"] == 4 and s["world_size"] == 2
        # the partitions' own models' mean (the released code's measure) beside the averaged/global model's
        # (BSP's partitions hold the global model: --partition-scores auto leaves its per-partition scores null)
        per = s["per_rank_val_accuracy"] or [s["final_val_accuracy"]] * 2
        assert r["accuracy"] == pytest.approx(sum(per) / 2) and len(per) == 2
        assert r["global_accuracy"] == s["final_val_accuracy"]
        assert cfg["optim"]["lr"] == pytest.approx(0.004 if r["algo"] == "gaia" else 0.008)  # eta 0.004, BSP K x eta
        assert cfg["data"]["partition"] == ("iid" if r["setting"] == "iid" else "label")
        host = json.loads((Path(r["dir"]) / "config.json").read_text())["host"]  # what the float results depend on
        assert host["torch"] == torch.__version__ and host["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert rep["rows"][0]["vs_bsp_iid_pp"] == 0.0 and rep["rows"][0]["savings_vs_bsp"] == 1.0
    assert (out / "accuracy.png").stat().st_size > 1000 and (out / "noniid.csv").exists()
    capsys.readouterr()
    assert paper.noniid(argv, launcher=no_launch) == 0
    assert capsys.readouterr().out.count("] reused ") == 4


def test_progress_eta():
    assert runner.eta_text([60.0, 120.0], [], 4, 1) == ", 4 left, ~6 min to go"  # mean 90 s x 4 runs
    assert runner.eta_text([60.0, 120.0], [], 3, 2) == ", 3 left, ~3 min to go"  # 2 at a time: 90 + 90 s
    assert runner.eta_text([60.0], [], 0, 1) == "" and runner.eta_text([], [30.0], 2, 2) == ""
    # the case that misled: 3 runs of ~3,440 s started together; when the first ends the other two are as
    # far in (it said "~57 min to go" with 33 s left)
    assert runner.eta_text([3440.0], [3440.0, 3440.0], 0, 3) == ", 2 left, under a minute to go"
    # running runs count what they have done: mean 600 s; slots free after 600-540 = 60 s and 600-120 = 480 s;
    # 2 pending take the slot free at 60 s (-> 660 s) and then the one free at 480 s (-> 1,080 s = 18 min)
    assert runner.eta_text([600.0], [540.0, 120.0], 2, 2) == ", 4 left, ~18 min to go"
    # a free slot beside a running run: the pending run starts at once (600 s), the running one ends at 300 s
    assert runner.eta_text([600.0], [300.0], 1, 2) == ", 2 left, ~10 min to go"


def test_skewscout_report_from_reused_runs(tmp_path, capsys):
    """Figure 8 rows from finished runs: target = mean BSP-IID over seeds; Oracle = fewest mean bytes meeting it."""
    args, budget, runs = _fig8(tmp_path)
    acc = {  # (accuracy, WAN bytes) per seed 0, 1
        "bsp-iid": ((0.90, 1), (0.92, 1)),             # target 0.91, sd 0.014142; tolerance 0.01 -> 0.90
        "bsp-label-1": ((0.90, 1000), (0.90, 1200)),   # BSP bytes: mean 1100
        "gaia-t0-0.05-label-1": ((0.905, 100), (0.915, 120)),  # mean 0.91 meets, 110 B: the Oracle, 10x
        "gaia-t0-0.5-label-1": ((0.95, 10), (0.80, 10)),       # mean 0.875 misses (though seed 0 alone would meet)
        "gaia-skewscout-label-1": ((0.90, 200), (0.92, 240)),  # mean 0.91 meets; 220 B: 5x, 2x the Oracle
    }
    for rid, r in runs.items():
        a, b = acc[rid.rsplit("-s", 1)[0]][r.seed]
        r.spec.out.mkdir(parents=True)
        (r.spec.out / "launch.json").write_text(json.dumps(runner.launch_record(r.spec)))
        (r.spec.out / "summary.json").write_text(json.dumps(
            {"final_val_accuracy": a, "wan_bytes_total": b, "theta_final": 0.05 if r.role == "skewscout" else None}))
    argv = ["--budget", "quick", "--steps", "8", "--algos", "gaia", "--grid", "0.05,0.5", "--seeds", "0,1",
            "--levels", "1", "--out", str(tmp_path / "s")]
    assert skewscout.main(argv, launcher=no_launch) == 0
    assert capsys.readouterr().out.count("] reused ") == 10
    rep = json.loads((tmp_path / "s" / "skewscout.json").read_text())
    assert rep["target"]["accuracy"] == pytest.approx(0.91) and rep["target"]["threshold"] == pytest.approx(0.90)
    rows = {r["algorithm"]: r for r in rep["figure8"]}
    assert list(rows) == ["BSP", "Gaia Oracle", "Gaia + SkewScout"]
    o, s, b = rows["Gaia Oracle"], rows["Gaia + SkewScout"], rows["BSP"]
    assert o["theta"] == 0.05 and o["savings_over_bsp"] == pytest.approx(10.0) and o["bytes_vs_oracle"] == 1.0
    assert s["savings_over_bsp"] == pytest.approx(5.0) and s["bytes_vs_oracle"] == pytest.approx(2.0)
    assert s["meets_target"] is True and s["seeds_meeting"] == "2/2" and s["theta"] == "0.05/0.05"
    assert b["savings_over_bsp"] == 1.0 and b["bytes_vs_oracle"] == pytest.approx(10.0) and b["meets_target"] is True
    with open(tmp_path / "s" / "skewscout.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert list(csv_rows[0])[:6] == ["skew", "algorithm", "savings_over_bsp", "accuracy", "meets_target",
                                     "bytes_vs_oracle"]
    assert csv_rows[2]["algorithm"] == "Gaia + SkewScout" and float(csv_rows[2]["bytes_vs_oracle"]) == pytest.approx(2.0)
    md = (tmp_path / "s" / "skewscout.md").read_text()
    assert "BSP-IID's seed standard deviation is 0.0141: the tolerance is below twice that" in md
    assert "| 100% | Gaia + SkewScout | t0=0.05/0.05 | 0.9100 (0.0141) | yes (2/2) | 5.0x | 2.00x |" in md
    assert (tmp_path / "s" / "savings.png").exists()
    # a target no theta meets: no Oracle, SkewScout's bytes_vs_oracle unknown
    for r in runs.values():
        if r.role == "theta":
            s_path = r.spec.out / "summary.json"
            s_path.write_text(json.dumps({**json.loads(s_path.read_text()), "final_val_accuracy": 0.5}))
    assert skewscout.main(argv, launcher=no_launch) == 0
    rows = {r["algorithm"]: r for r in json.loads((tmp_path / "s" / "skewscout.json").read_text())["figure8"]}
    assert rows["Gaia Oracle"]["theta"] is None and "no theta meets the target" in rows["Gaia Oracle"]["note"]
    assert rows["Gaia + SkewScout"]["bytes_vs_oracle"] is None and rows["Gaia + SkewScout"]["meets_target"] is True


def _probes(accs, byts=None):
    byts = byts or {i: 100.0 - i for i in accs}
    return {i: skewscout.Probe(a, byts[i]) for i, a in accs.items()}


def _bisect(truth, n=9, byts=None, threshold=0.90, tol=0.01):
    """Drive oracle_next against a table of mean accuracies per index; the probes in order and the last answer."""
    probed, order = {}, []
    while True:
        action, idx, why = skewscout.oracle_next(_probes(probed, byts), n, threshold, tol)
        if action == "done":
            return order, why
        order.append((action, idx))
        for i in idx:
            probed[i] = truth[i]


def test_oracle_bisection_by_hand():
    """9 grid points, index 0 sends most; the target is met up to index 5: probes 4 (meets), (4+9)//2 = 6
    (misses), 5 (meets): bracket (5, 6) closed after 3 of 9 runs, answer 5 (build_report picks it)."""
    meets_to_5 = {i: 0.96 - 0.01 * i if i <= 5 else 0.80 - 0.01 * i for i in range(9)}  # 0.96 ... 0.91, then < 0.9
    assert _bisect(meets_to_5) == ([("probe", [4]), ("probe", [6]), ("probe", [5])], "")
    none = {i: 0.5 for i in range(9)}  # 4 misses, (-1 + 4) // 2 = 1 misses, 0 misses: no theta meets
    assert _bisect(none)[0] == [("probe", [4]), ("probe", [1]), ("probe", [0])]
    every = {i: 0.99 - 0.001 * i for i in range(9)}  # 4, 6, 7, 8 all meet: the loosest point
    assert _bisect(every)[0] == [("probe", [4]), ("probe", [6]), ("probe", [7]), ("probe", [8])]


def test_oracle_falls_back_to_the_full_grid_where_not_monotone():
    # the same bracket, but index 5 (0.93) is 0.025 above the tighter index 4 (0.905): more than the tolerance
    truth = {0: 0.95, 1: 0.94, 2: 0.93, 3: 0.92, 4: 0.905, 5: 0.93, 6: 0.80, 7: 0.70, 8: 0.60}
    order, why = _bisect(truth)
    assert order == [("probe", [4]), ("probe", [6]), ("probe", [5]), ("full", [0, 1, 2, 3, 7, 8])]
    assert why == "not monotone: point 5 is 0.0250 more accurate than the tighter 4"
    # within the tolerance (0.905 -> 0.91): monotone enough, no fallback
    assert _bisect({**truth, 5: 0.91})[0] == [("probe", [4]), ("probe", [6]), ("probe", [5])]
    # bytes that rise with a looser theta break it too
    byts = {i: 100.0 - i for i in range(9)} | {6: 200.0}
    order, why = _bisect({i: 0.96 - 0.01 * i if i <= 5 else 0.80 for i in range(9)}, byts=byts)
    assert order[-1] == ("full", [0, 1, 2, 3, 7, 8]) and why == "not monotone: point 6 sends more bytes than the tighter 0"
    # a failed seed (accuracy None) misses the target
    assert skewscout.oracle_next({4: skewscout.Probe(None, None)}, 9, 0.9, 0.01) == ("probe", [1], "")


def test_skewscout_bisect_runs_only_the_probed_thetas(tmp_path, capsys):
    """Grid 0.05, 0.2, 0.5 at 100%: the Oracle probes 0.2 (meets), then 0.5 (misses): 0.05 is never launched."""
    argv = ["--budget", "quick", "--steps", "8", "--algos", "gaia", "--grid", "0.05,0.2,0.5", "--seeds", "0,1",
            "--levels", "1", "--out", str(tmp_path / "s")]
    args, budget = skewscout.parse(argv)
    acc = {"bsp-iid": 0.91, "bsp-label-1": 0.9, "gaia-t0-0.2-label-1": 0.905, "gaia-t0-0.5-label-1": 0.85,
           "gaia-skewscout-label-1": 0.90}
    byts = {"bsp-iid": 1, "bsp-label-1": 1000, "gaia-t0-0.2-label-1": 100, "gaia-t0-0.5-label-1": 50,
            "gaia-skewscout-label-1": 150}
    for r in skewscout.plan(args, budget):
        key = r.spec.run_id.rsplit("-s", 1)[0]
        if key not in acc:
            continue
        r.spec.out.mkdir(parents=True)
        (r.spec.out / "launch.json").write_text(json.dumps(runner.launch_record(r.spec)))
        (r.spec.out / "summary.json").write_text(json.dumps({"final_val_accuracy": acc[key],
                                                             "wan_bytes_total": byts[key]}))
    assert skewscout.main(argv, launcher=no_launch) == 0  # 0.05 would be launched, and no_launch would fail
    rep = json.loads((tmp_path / "s" / "skewscout.json").read_text())
    assert rep["oracle_search"]["by_level"]["1"]["gaia"] == {"mode": "bisect", "probed": [0.2, 0.5], "why": ""}
    rows = {r["algorithm"]: r for r in rep["figure8"]}
    assert rows["Gaia Oracle"]["theta"] == 0.2 and rows["Gaia Oracle"]["savings_over_bsp"] == pytest.approx(10.0)
    assert "bisect: 2 of 3 thetas run" in rows["Gaia Oracle"]["note"]
    assert rows["Gaia + SkewScout"]["bytes_vs_oracle"] == pytest.approx(1.5)
    assert not (tmp_path / "s" / "gaia-t0-0.05-label-1-s0").exists()
    sc = next(r for r in skewscout.plan(args, budget) if r.role == "skewscout").spec.argv
    assert sc[sc.index("--travel-backoff") + 1] == "16"


@pytest.mark.integration
def test_processes_host_blocks_of_partitions_and_do_not_change_a_runs_identity(tmp_path):
    spec = runner.RunSpec("gaia-iid", tmp_path / "gaia-iid", ("--algo", "gaia"), 6)
    assert runner.torchrun_command(spec)[4:7] == ["--nproc_per_node=6", "-m", "geodml"]
    assert "--partitions" not in runner.torchrun_command(spec)
    hosted = runner.RunSpec("gaia-iid", tmp_path / "gaia-iid", ("--algo", "gaia"), 6, processes=2)
    cmd = runner.torchrun_command(hosted)
    assert cmd[4] == "--nproc_per_node=2" and cmd[cmd.index("--partitions") + 1] == "6"
    assert runner.launch_record(hosted) == runner.launch_record(spec) == {"argv": ["--algo", "gaia"], "nproc": 6}
    assert hosted == spec  # R is not part of the run's identity (results are bit-identical over R)
    seen = []

    def launch(s, stdout, stderr):
        seen.append((s.procs, s.launch_argv))
        return subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"], stdout=stdout, stderr=stderr,
                                start_new_session=True)
    small = runner.RunSpec("bsp-iid", tmp_path / "bsp-iid", ("--algo", "bsp"), 2)
    runner.run_all([spec, small], processes=3, launcher=launch, log=lambda m: None)
    assert seen == [(3, ("--algo", "gaia", "--partitions", "6")), (2, ("--algo", "bsp"))]
    with pytest.raises(ValueError, match="processes must be >= 1"):
        runner.run_all([spec], processes=0, launcher=launch)


# ---- --dry-run: every study prints its plan and launches nothing ------------------------------------

@pytest.mark.parametrize("name", sorted(STUDIES))
def test_dry_run_prints_the_plan_and_launches_nothing(name, tmp_path, capsys):
    """Every study takes --dry-run: its arguments are checked, the plan is listed (one line per run, each
    "to run" here) and nothing is launched or written."""
    module, func = STUDIES[name].split(":")
    main = getattr(importlib.import_module(module), func)
    budget = [] if name == "oracle" else ["--budget", "quick"]
    assert main([*budget, "--dry-run", "--out", str(tmp_path / "s")], launcher=no_launch) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    head = [x for x in lines if x.startswith("plan: ")]
    runs = [x for x in lines if x.startswith("  to run ")]
    assert len(head) == 1 and runs, out
    assert head[0].startswith(f"plan: {len(runs)} runs, 0 finished (reused), 0 running (another study process), "
                              f"0 to resume from their checkpoints, {len(runs)} to run;"), head[0]
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_only_runs_the_named_run_and_writes_no_report(name, tmp_path, capsys):
    """Every study takes --only: the named run of the plan (ids as --dry-run lists them) runs, nothing else launches
    and no report is written; an id the plan lacks is one error line and exit 2, with nothing launched or written."""
    module, func = STUDIES[name].split(":")
    main = getattr(importlib.import_module(module), func)
    out = tmp_path / "s"
    argv = [*([] if name == "oracle" else ["--budget", "quick"]), "--out", str(out)]
    assert main([*argv, "--dry-run"], launcher=no_launch) == 0
    ids = [x.split()[2].rstrip(":") for x in capsys.readouterr().out.splitlines() if x.startswith("  to run ")]
    pick = ids[-1]
    assert main([*argv, "--only", f"{pick},bogus"], launcher=no_launch) == 2
    assert capsys.readouterr().err == (f"geodml.study {name}: error: --only: not in this plan: bogus (--dry-run lists "
                                       f"its {len(ids)} run ids)\n")
    assert not out.exists()
    launched = []

    def launch(spec, stdout, stderr):
        launched.append(spec.run_id)
        (spec.out / "summary.json").write_text(json.dumps({"final_val_accuracy": 0.5}))
        return DoneProc()

    assert main([*argv, "--only", pick], launcher=launch) == 0
    assert launched == [pick]
    assert f"--only: 1 of the plan's {len(ids)} runs; no report written" in capsys.readouterr().out
    assert [p.name for p in out.iterdir() if not p.name.startswith(".")] == [pick]  # the run's directory, no report
    assert main([*argv, "--only", pick, "--dry-run"], launcher=no_launch) == 0  # finished now: listed, reused
    assert ("plan: 1 runs, 1 finished (reused), 0 running (another study process), 0 to resume from their checkpoints, "
            "0 to run") in capsys.readouterr().out


def test_dry_run_marks_finished_and_running_runs(tmp_path, capsys):
    """A run whose directory holds summary.json (launched with the same flags) is listed as finished; one whose
    lock another process holds, as running; the rest as to run."""
    out = tmp_path / "s"
    args = ["--budget", "quick", "--dry-run", "--out", str(out)]
    _, _, cells = paper.prepare("noniid", args)
    done, busy = cells[1].spec, cells[2].spec
    done.out.mkdir(parents=True)
    (done.out / "launch.json").write_text(json.dumps(runner.launch_record(done)))
    (done.out / "summary.json").write_text(json.dumps({"final_val_accuracy": 0.5}))
    assert not runner.is_running(busy) and not runner.lock_path(busy).exists()  # probing wrote nothing
    lock = runner.try_lock(busy)
    try:
        assert runner.is_running(busy)
        assert paper.noniid(args, launcher=no_launch) == 0
    finally:
        lock.close()
    assert not runner.is_running(busy)  # released with its holder
    lines = capsys.readouterr().out.splitlines()
    n = len(cells)
    assert (f"plan: {n} runs, 1 finished (reused), 1 running (another study process), 0 to resume from their "
            f"checkpoints, {n - 2} to run; "
            "nothing launched (--dry-run)") in lines
    assert f"  finished {done.run_id}: {' '.join(done.argv)}" in lines
    assert f"  running  {busy.run_id}: {' '.join(busy.argv)}" in lines
    assert sum(x.startswith("  to run ") for x in lines) == n - 2


def test_progress_line_names_its_accuracy_the_last_evaluation(tmp_path):
    spec = runner.RunSpec("r", tmp_path / "r", ("--steps", "1"), 1)
    ok = runner.RunResult(spec, "ok", summary={"final_val_accuracy": 0.87019, "wan_bytes_total": 1234567})
    assert runner.describe(ok) == "last-eval accuracy 0.8702, WAN bytes 1,234,567"
    assert runner.describe(runner.RunResult(spec, "reused", summary={})) == "last-eval accuracy ?"
