"""The paper's studies (geodml.study.paper, geodml.study.skewscout): planning, per-algorithm lr, reports, one real quick study."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from geodml.study import paper, runner, skewscout


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
    assert paper.lr_for("bsp", 0.01, 5, "divide") == 0.01 and paper.lr_for("fedavg", 0.01, 5, "divide") == 0.01
    assert paper.lr_for("gaia", 0.01, 5, "divide") == pytest.approx(0.002)
    assert paper.lr_for("dgc", 0.02, 4, "divide") == pytest.approx(0.005)
    assert paper.lr_for("gaia", 0.01, 5, "same") == 0.01


def test_full_budget_scales_schedule_and_dgc_warmup(tmp_path):
    args, budget, cells = planned("noniid", ["--epochs", "4", "--lr", "0.01", "--dataset", "digits"], tmp_path)
    assert budget.flags() == ["--epochs", "4", "--lr-milestones", "2,3", "--eval-every", "500"]  # 64,96 of 128
    dgc = cells["dgc-e_warm-8-iid"].spec.argv
    assert flag(dgc, "--e-warm") == "0.25"  # 8 paper epochs x 4/128
    assert flag(dgc, "--lr") == "0.002" and flag(cells["gaia-t0-0.1-noniid-100"].spec.argv, "--lr") == "0.002"
    assert flag(cells["bsp-iid"].spec.argv, "--lr") == "0.01"
    assert flag(cells["fedavg-iter_local-20-iid"].spec.argv, "--lr") == "0.01"
    assert flag(cells["gaia-t0-0.1-iid"].spec.argv, "--t0") == "0.1"
    assert flag(cells["fedavg-iter_local-20-iid"].spec.argv, "--iter-local") == "20"
    non = cells["bsp-noniid-100"].spec.argv
    assert flag(non, "--partition") == "label" and flag(non, "--skew") == "1"
    # the paper's own schedule by default
    _, b, _ = planned("noniid", [], tmp_path)
    assert b.flags()[:4] == ["--epochs", "128", "--lr-milestones", "64,96"] and b.lr == 0.002


@pytest.mark.parametrize("name, argv, count, some", [
    ("noniid", [], 8, "dgc-e_warm-8-noniid-100"),
    ("norm", [], 16, "gaia-t0-0.1-gn-cnn-noniid-100"),
    ("skew", [], 12, "fedavg-iter_local-20-gn-cnn-noniid-80"),   # 4 algos x (iid, 20%, 80%)
    ("skew", ["--budget", "full"], 20, "bsp-gn-cnn-noniid-40"),  # 4 algos x (iid, 20, 40, 60, 80%)
    ("hparams", [], 14, "dgc-e_warm-1-noniid-100"),               # BSP x2 + 3 algos x 2 grid ends x 2
    ("hparams", ["--budget", "full"], 40, "fedavg-iter_local-500-iid"),  # 2 + (7 + 7 + 5) x 2
    ("dirichlet", [], 4, "fedavgm-iter_local-20-dirichlet-0.1"),
    ("noniid", ["--algos", "fedavg"], 4, "bsp-iid"),               # BSP is always added
])
def test_study_plans(name, argv, count, some, tmp_path):
    budget = [] if "--budget" in argv else ["--budget", "quick"]
    _, _, cells = planned(name, [*budget, *argv], tmp_path)
    assert len(cells) == count and some in cells


def test_study_model_choice(tmp_path):
    """--model cnn (the default: what the studies ran before issue 21) or lenet (the authors' network)."""
    _, _, cells = planned("norm", ["--budget", "quick"], tmp_path)
    assert flag(cells["bsp-bn-cnn-iid"].spec.argv, "--model") == "cnn" and cells["bsp-bn-cnn-iid"].model == "BN-CNN"
    _, _, cells = planned("norm", ["--budget", "quick", "--model", "lenet"], tmp_path)
    assert flag(cells["bsp-gn-lenet-iid"].spec.argv, "--model") == "lenet"
    assert cells["bsp-gn-lenet-iid"].model == "GN-LeNet" and cells["bsp-gn-lenet-iid"].spec.argv.count("--model") == 1
    assert paper.model_label("lenet", "batchrenorm") == "BRN-LeNet"


def test_norm_and_dirichlet_flags(tmp_path):
    _, _, cells = planned("norm", ["--budget", "quick"], tmp_path)
    assert flag(cells["bsp-bn-cnn-iid"].spec.argv, "--norm") == "batch"
    assert flag(cells["bsp-gn-cnn-iid"].spec.argv, "--norm") == "group"
    _, _, cells = planned("dirichlet", ["--budget", "quick", "--server-momentum", "0.8"], tmp_path)
    m = cells["fedavgm-iter_local-20-dirichlet-0.1"].spec.argv
    assert flag(m, "--alpha") == "0.1" and flag(m, "--server-momentum") == "0.8" and flag(m, "--server-lr") == "0.2"
    assert "--server-momentum" not in cells["fedavg-iter_local-20-dirichlet-0.1"].spec.argv


def test_skewscout_plan_shares_the_target_and_separates_levels(tmp_path):
    args = paper.parse_args("skewscout", ["--budget", "quick", "--steps", "8", "--out", str(tmp_path / "s")])
    per_level, (theta_name, grid) = skewscout.plan(args, paper.make_budget(args))
    ids = {lvl: [p.spec.run_id for p in ps] for lvl, ps in per_level.items()}
    assert ids[0.2] == ["bsp-iid", "bsp-label-0.2", "label-0.2-gaia-t0-0.05", "label-0.2-gaia-t0-0.5",
                        "label-0.2-gaia-skewscout-t0-0.2"]
    assert ids[1.0][0] == "bsp-iid" and ids[1.0][2] == "label-1-gaia-t0-0.05"
    sc = per_level[1.0][-1].spec.argv
    assert flag(sc, "--lr") == "0.004" and flag(per_level[1.0][1].spec.argv, "--lr") == "0.02"  # Gaia lr/K, BSP lr
    assert "--skewscout" in sc and flag(sc, "--travel-every") == "4" and flag(sc, "--skew") == "1"


def test_skewscout_travel_interval_reaches_only_the_skewscout_runs(tmp_path, capsys):
    """--travel-every: SkewScout runs only (BSP/Oracle launch records unchanged, so they are reused), named by it."""
    base = ["--budget", "full", "--epochs", "2", "--lr", "0.01", "--grid", "0.05,0.5", "--out", str(tmp_path / "s")]
    def specs(extra):
        args = paper.parse_args("skewscout", [*base, *extra])
        per_level, _ = skewscout.plan(args, paper.make_budget(args))
        return {p.spec.run_id: p.spec for ps in per_level.values() for p in ps}
    default, every = specs([]), specs(["--travel-every", "100"])
    assert "--travel-every" not in default["label-1-gaia-skewscout-t0-0.2"].argv  # geodml's default, the paper's 500
    scout = every["label-1-gaia-skewscout-t0-0.2-travel-100"].argv
    assert flag(scout, "--travel-every") == "100" and flag(scout, "--lr") == "0.002"
    for rid in ("bsp-iid", "bsp-label-0.4", "label-0.4-gaia-t0-0.05"):  # the same runs, the same flags
        assert every[rid].argv == default[rid].argv and "--travel-every" not in every[rid].argv
    assert len(every) == len(default) == 21  # BSP-IID + 5 levels x (BSP, 2 Oracle runs, SkewScout)
    for bad, message in ((["--travel-every", "0"], "--travel-every must be >= 1"),
                         (["--", "--travel-every", "100"], "use the study's own --travel-every")):
        assert skewscout.main([*base, *bad], launcher=no_launch) == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--nproc", "1"], "--nproc must be >= 2"),
    (["--algos", "bsp,foo"], "subset of"),
    (["--budget", "quick", "--epochs", "3"], "--epochs is for --budget full"),
    (["--steps", "3"], "--steps is for --budget quick"),
    (["--lr", "-1"], "--lr must be > 0"),
    (["--", "--lr", "0.1"], "--lr are set by the study"),
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
DONE = {"bsp-iid": summ(0.90, 1_000_000), "bsp-noniid-100": summ(0.88, 1_000_000),
        "gaia-t0-0.1-iid": summ(0.89, 50_000), "gaia-t0-0.1-noniid-100": summ(0.10, 40_000),
        "fedavg-iter_local-20-iid": summ(0.905, 50_000), "fedavg-iter_local-20-noniid-100": summ(0.60, 50_000)}


def test_report_numbers_from_reused_runs(tmp_path, capsys):
    out = fake_runs(tmp_path, "noniid", QUICK, DONE)
    assert paper.noniid([*QUICK, "--out", str(out)], launcher=no_launch) == 0
    text = capsys.readouterr().out
    assert text.count("] reused ") == 6
    rep = json.loads((out / "noniid.json").read_text())
    by = {r["run_id"]: r for r in rep["rows"]}
    assert by["gaia-t0-0.1-noniid-100"]["vs_bsp_iid_pp"] == pytest.approx(-80.0)  # 10% - 90%
    assert by["gaia-t0-0.1-noniid-100"]["savings_vs_bsp"] == pytest.approx(25.0)  # 1e6 / 4e4 (BSP in the same setting)
    assert by["fedavg-iter_local-20-iid"]["vs_bsp_iid_pp"] == pytest.approx(0.5)
    assert by["bsp-noniid-100"]["vs_bsp_iid_pp"] == pytest.approx(-2.0) and by["bsp-iid"]["savings_vs_bsp"] == 1.0
    md = (out / "noniid.md").read_text()
    assert "| Gaia T0=10% | 89.0% (-1.0 pp) | 10.0% (-80.0 pp) |" in md
    assert "| FedAvg Iter_Local=20 | 90.5% (+0.5 pp) | 60.0% (-30.0 pp) |" in md
    # the paper's CIFAR-10 LeNet numbers beside ours (Table 6: 76.7% / 10.0%; 77.4% is its BSP-IID)
    assert "| Gaia T0=10% | 89.0% (-1.0 pp) | 10.0% (-80.0 pp) | 76.7% (-0.7 pp) | 10.0% (-67.4 pp) |" in md
    assert "| BSP | 90.0% (+0.0 pp) | 88.0% (-2.0 pp) | 77.4% (+0.0 pp) | 76.6% (-0.8 pp) |" in md
    with open(out / "noniid.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and rows[0]["run_id"] == "bsp-iid" and float(rows[3]["savings_vs_bsp"]) == pytest.approx(25.0)
    for png in ("accuracy.png", "accuracy_vs_wan_bytes.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hparams_report_pairs_each_knob_with_the_paper(tmp_path, capsys):
    """Tables 6-8 from reused runs: savings beside accuracy, the paper's LeNet value of the same knob, knobs.png."""
    argv = ["--budget", "quick", "--nproc", "3"]
    done = {"bsp-iid": summ(0.90, 1_000_000), "bsp-noniid-100": summ(0.89, 1_000_000),
            "gaia-t0-0.02-iid": summ(0.89, 100_000), "gaia-t0-0.02-noniid-100": summ(0.80, 400_000),
            "gaia-t0-0.5-iid": summ(0.88, 20_000), "gaia-t0-0.5-noniid-100": summ(0.50, 250_000),
            "fedavg-iter_local-5-iid": summ(0.9, 200_000), "fedavg-iter_local-5-noniid-100": summ(0.7, 200_000),
            "fedavg-iter_local-1000-iid": summ(0.8, 1_000), "fedavg-iter_local-1000-noniid-100": summ(0.3, 1_000),
            "dgc-e_warm-8-iid": summ(0.85, 125_000), "dgc-e_warm-8-noniid-100": summ(0.6, 125_000),
            "dgc-e_warm-1-iid": summ(0.84, 50_000), "dgc-e_warm-1-noniid-100": summ(0.5, 50_000)}
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
    assert float(rows["dgc-e_warm-1-iid"]["theta"]) == 1.0
    assert float(rows["dgc-e_warm-1-iid"]["paper_accuracy"]) == pytest.approx(0.1)
    assert rows["bsp-iid"]["theta"] == "" and float(rows["bsp-noniid-100"]["paper_accuracy"]) == pytest.approx(0.766)
    assert (out / "knobs.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # no paper number exists for other models, other skews or FedAvgM
    assert paper.paper_accuracy("gaia", 0.1, "GN-LeNet", "iid") is None
    assert paper.paper_accuracy("gaia", 0.1, "LeNet", "noniid-80%") is None
    assert paper.paper_accuracy("fedavgm", 20.0, "LeNet", "iid") is None


def python_launcher(code):
    def launch(spec, stdout, stderr):
        return subprocess.Popen([sys.executable, "-c", code, str(spec.out)], stdout=stdout, stderr=stderr,
                                start_new_session=True)
    return launch


@pytest.mark.integration
def test_failed_run_is_reported_and_excluded(tmp_path, capsys):
    out = fake_runs(tmp_path, "noniid", QUICK, {**DONE, "bsp-iid": None})
    failing = python_launcher("import sys; sys.stderr.write('boom: no data\\n'); sys.exit(3)")
    assert paper.noniid([*QUICK, "--out", str(out)], launcher=failing) == 1
    captured = capsys.readouterr()
    assert "FAILED bsp-iid" in captured.out and "boom: no data" in captured.out and "bsp-iid" in captured.err
    rep = json.loads((out / "noniid.json").read_text())
    assert rep["failed"] == ["bsp-iid"]
    assert all(r["vs_bsp_iid_pp"] is None for r in rep["rows"])  # no reference, no relative numbers
    md = (out / "noniid.md").read_text()
    assert "| BSP | FAILED (exit 3) | 88.0% |" in md and "Failed (excluded from comparisons): bsp-iid: exit code 3" in md


# ---- one real quick study (machinery, not science) --------------------------------------------------

@pytest.mark.integration
def test_quick_noniid_study_runs_and_resumes(tmp_path, capsys):
    """BSP and Gaia, IID vs 100% non-IID, K=2, 4 steps each: 4 torchrun runs, then all reused."""
    out = tmp_path / "quick"
    argv = ["--budget", "quick", "--nproc", "2", "--algos", "gaia", "--steps", "4", "--out", str(out),
            "--run-timeout", "240", "--", "--no-progress", "--comm-timeout", "120"]
    assert paper.noniid(argv) == 0, capsys.readouterr()
    rep = json.loads((out / "noniid.json").read_text())
    assert [r["run_id"] for r in rep["rows"]] == ["bsp-iid", "bsp-noniid-100", "gaia-t0-0.1-iid", "gaia-t0-0.1-noniid-100"]
    for r in rep["rows"]:
        s = json.loads((Path(r["dir"]) / "summary.json").read_text())
        cfg = json.loads((Path(r["dir"]) / "config.json").read_text())["config"]
        assert r["status"] == "ok" and s["steps"] == 4 and s["world_size"] == 2 and r["accuracy"] == s["final_val_accuracy"]
        assert cfg["optim"]["lr"] == pytest.approx(0.01 if r["algo"] == "gaia" else 0.02)  # Gaia: 0.02 / K
        assert cfg["data"]["partition"] == ("iid" if r["setting"] == "iid" else "label")
        host = json.loads((Path(r["dir"]) / "config.json").read_text())["host"]  # what the float results depend on
        assert host["torch"] == torch.__version__ and host["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert rep["rows"][0]["vs_bsp_iid_pp"] == 0.0 and rep["rows"][0]["savings_vs_bsp"] == 1.0
    assert (out / "accuracy.png").stat().st_size > 1000 and (out / "noniid.csv").exists()
    capsys.readouterr()
    assert paper.noniid(argv, launcher=no_launch) == 0
    assert capsys.readouterr().out.count("] reused ") == 4


def test_progress_eta():
    assert runner.eta_text([60.0, 120.0], 4, 1) == ", 4 left, ~6 min to go"  # mean 90 s x 4 runs
    assert runner.eta_text([60.0, 120.0], 3, 2) == ", 3 left, ~3 min to go"  # 2 at a time: ceil(3/2) = 2 rounds
    assert runner.eta_text([60.0], 0, 1) == "" and runner.eta_text([], 2, 1) == ""


def test_skewscout_report_from_reused_runs(tmp_path, capsys):
    """Figure 8 table: per level the Oracle (cheapest T0 within tolerance) and SkewScout savings over BSP."""
    argv = ["--budget", "quick", "--steps", "8", "--out", str(tmp_path / "s")]
    args = paper.parse_args("skewscout", argv)
    per_level, _ = skewscout.plan(args, paper.make_budget(args))
    acc = {"bsp-iid": (0.90, 1000), "bsp-label-0.2": (0.90, 1000), "label-0.2-gaia-t0-0.05": (0.895, 100),
           "label-0.2-gaia-t0-0.5": (0.89, 20), "label-0.2-gaia-skewscout-t0-0.2": (0.891, 40),
           "bsp-label-1": (0.88, 1000), "label-1-gaia-t0-0.05": (0.895, 250), "label-1-gaia-t0-0.5": (0.30, 10),
           "label-1-gaia-skewscout-t0-0.2": (0.70, 50)}
    for ps in per_level.values():
        for p in ps:
            if not p.spec.out.exists():
                p.spec.out.mkdir(parents=True)
                (p.spec.out / "launch.json").write_text(json.dumps(runner.launch_record(p.spec)))
                a, b = acc[p.spec.run_id]
                (p.spec.out / "summary.json").write_text(json.dumps(
                    {"final_val_accuracy": a, "wan_bytes_total": b, "theta_final": 0.1, "theta_trajectory": []}))
    assert skewscout.main(argv, launcher=no_launch) == 0
    assert capsys.readouterr().out.count("] reused ") == 9
    rep = json.loads((tmp_path / "s" / "skewscout.json").read_text())
    lv = {r["skew"]: r for r in rep["levels"]}
    assert lv[0.2]["oracle_t0"] == 0.5 and lv[0.2]["oracle_savings"] == 50.0  # 0.89 >= 0.90 - 0.01; 1000 / 20
    assert lv[0.2]["skewscout_savings"] == 25.0 and lv[0.2]["skewscout_meets_target"] is True
    assert lv[1.0]["oracle_t0"] == 0.05 and lv[1.0]["oracle_savings"] == 4.0  # T0=0.5 misses the target
    assert lv[1.0]["skewscout_savings"] == 20.0 and lv[1.0]["skewscout_meets_target"] is False
    md = (tmp_path / "s" / "skewscout.md").read_text()
    assert "| 100% | 0.9000 | 0.8800 | 0.05 | 0.8950 | 4.0x | 0.2 -> 0.1 | 0.7000 | 20.0x | no |" in md
    assert (tmp_path / "s" / "levels" / "label-1.md").exists() and (tmp_path / "s" / "savings.png").exists()
