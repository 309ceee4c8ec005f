"""The iwds and vanlier studies (geodml.study.iwds, geodml.study.vanlier): plans checked against the papers'
settings, reports from fake finished runs with numbers computed by hand, bad arguments. No processes."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from geodml.data.datasets import Dataset
from geodml.study import STUDIES, common, iwds, runner, vanlier
from geodml.study.common import StudyError
from geodml.study.runner import RunResult


def no_launch(spec, stdout, stderr):
    raise AssertionError(f"launched {spec.run_id}")


def flag(argv, name):
    """The last value of a flag (argparse semantics)."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == name][-1]


PNG = b"\x89PNG\r\n\x1a\n"


def test_registered():
    assert STUDIES["iwds"] == "geodml.study.iwds:main" and STUDIES["vanlier"] == "geodml.study.vanlier:main"
    import geodml.study as pkg
    assert "``iwds``" in pkg.__doc__ and "``vanlier``" in pkg.__doc__


@pytest.mark.parametrize("name", ["iwds", "vanlier"])
def test_help(name, capsys):
    import importlib
    module, func = STUDIES[name].split(":")
    with pytest.raises(SystemExit) as exc:
        getattr(importlib.import_module(module), func)(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--budget {quick,full}" in out and "--seeds" in out and "--jobs" in out and "--processes" in out


# ---- iwds: the plan -------------------------------------------------------------------------------

def test_iwds_full_plan_is_the_papers_protocol(tmp_path):
    args, runs = iwds.prepare(["--out", str(tmp_path / "s")])
    by = {r.spec.run_id: r for r in runs}
    # 3 algorithms x 4 partitions x 2 samplers x 3 seeds
    assert len(runs) == 72 and args.seeds == (0, 1, 2) and args.dataset == "fashion-mnist"
    assert [r.spec.run_id for r in runs[:3]] == ["fedavg-uniform-lda-0.5-s0", "fedavg-iwds-lda-0.5-s0",
                                                 "fedavg-uniform-lda-0.1-s0"]
    a = by["fedavg-iwds-llt-0.99-s1"].spec
    assert a.nproc == 10  # "10 clients"
    assert flag(a.argv, "--client-fraction") == "0.5"  # "5 clients will be chosen in every communication round"
    assert flag(a.argv, "--partition") == "longtail" and flag(a.argv, "--tail") == "0.99"  # LLT alpha_l = 0.99
    assert flag(a.argv, "--iwds") == "0.9999,0.8,0.992" and flag(a.argv, "--iwds-mode") == "resample"
    assert flag(a.argv, "--model") == "cnn" and flag(a.argv, "--dataset") == "fashion-mnist"
    # one local epoch of a 6,000-example client at batch 32 = 188 steps; 100 rounds; a test evaluation per round
    assert flag(a.argv, "--iter-local") == "188" and flag(a.argv, "--steps") == "18800"
    assert flag(a.argv, "--eval-every") == "188" and flag(a.argv, "--batch-size") == "32" and flag(a.argv, "--seed") == "1"
    assert "--reset-momentum" in a.argv and "--fednova" not in a.argv and "--prox-mu" not in a.argv
    u = by["fedavg-uniform-llt-0.99-s1"].spec.argv
    assert "--iwds" not in u and "--iwds-mode" not in u
    # LDA alpha_d 0.1 -> geodml (Hsu) alpha 10 x 0.1 = 1: the authors' per-class Dir(0.1) over 10 clients
    lda = by["fedprox-uniform-lda-0.1-s0"].spec.argv
    assert flag(lda, "--partition") == "dirichlet" and flag(lda, "--alpha") == "1" and flag(lda, "--prox-mu") == "0.1"
    nova = by["fednova-iwds-lda-0.5-s2"].spec.argv
    assert flag(nova, "--alpha") == "5" and "--fednova" in nova and "--reset-momentum" not in nova  # FedNova resets itself
    assert flag(nova, "--momentum") == "0.9"  # FedNova "with momentum acceleration" (Figure 7)


def test_iwds_quick_plan_and_options(tmp_path):
    args, runs = iwds.prepare(["--budget", "quick", "--out", str(tmp_path / "s")])
    assert len(runs) == 24 and args.dataset == "digits" and args.seeds == (0,)
    assert flag(runs[0].spec.argv, "--steps") == "6" and flag(runs[0].spec.argv, "--iter-local") == "2"
    args, runs = iwds.prepare(["--budget", "quick", "--algos", "fednova", "--settings", "llt-0.9", "--lda-scale", "1",
                               "--seeds", "3,4", "--rounds", "5", "--local-steps", "7", "--out", str(tmp_path / "t")])
    assert [r.spec.run_id for r in runs] == ["fednova-uniform-llt-0.9-s3", "fednova-iwds-llt-0.9-s3",
                                             "fednova-uniform-llt-0.9-s4", "fednova-iwds-llt-0.9-s4"]
    assert flag(runs[0].spec.argv, "--steps") == "35" and flag(runs[0].spec.argv, "--eval-every") == "7"
    _, runs = iwds.prepare(["--budget", "quick", "--settings", "lda-0.5", "--lda-scale", "1", "--algos", "fedavg",
                            "--out", str(tmp_path / "u")])
    assert flag(runs[0].spec.argv, "--alpha") == "0.5"


def test_iwds_authors_lda_and_local_epochs_plan(tmp_path):
    """hetero-ALPHA_D: the authors' LDA (--partition lda --alpha alpha_d, no --lda-scale); --local-epochs E:
    R rounds of E epochs (--rounds, --local-epochs), validated at every round's end, ids ending in -eE."""
    _, runs = iwds.prepare(["--algos", "fedavg,fednova", "--settings", "hetero-0.1,llt-0.99", "--local-epochs", "1",
                            "--seeds", "0", "--out", str(tmp_path / "s")])
    by = {r.spec.run_id: r for r in runs}
    assert list(by)[:4] == ["fedavg-uniform-hetero-0.1-e1-s0", "fedavg-iwds-hetero-0.1-e1-s0",
                            "fedavg-uniform-llt-0.99-e1-s0", "fedavg-iwds-llt-0.99-e1-s0"]
    nova = by["fednova-iwds-hetero-0.1-e1-s0"]
    a = nova.spec.argv
    assert flag(a, "--partition") == "lda" and flag(a, "--alpha") == "0.1" and "--fednova" in a
    assert flag(a, "--rounds") == "100" and flag(a, "--local-epochs") == "1" and flag(a, "--eval-every-rounds") == "1"
    assert "--steps" not in a and "--iter-local" not in a and int(flag(a, "--eval-every")) >= 10 ** 9
    assert nova.setting == "LDA (authors') 0.1"
    # the default protocol's flags, in the order finished runs were launched with (launch.json)
    _, runs = iwds.prepare(["--algos", "fedprox", "--settings", "lda-0.1", "--seeds", "0", "--out", str(tmp_path / "t")])
    assert list(runs[1].spec.argv[20:38]) == [
        "--steps", "18800", "--iter-local", "188", "--client-fraction", "0.5", "--reset-momentum", "--prox-mu", "0.1",
        "--iwds", "0.9999,0.8,0.992", "--iwds-mode", "resample", "--eval-every", "188", "--log-every", "188", "--wan"]


def test_iwds_local_epochs_curve_counts_validations_as_rounds(tmp_path):
    """With --local-epochs the rounds differ in length: round r is the r-th validation, not step / L."""
    argv = ["--budget", "quick", "--algos", "fednova", "--settings", "hetero-0.5", "--seeds", "0", "--rounds", "3",
            "--local-epochs", "0.5", "--out", str(tmp_path / "s")]
    args, runs = iwds.prepare(argv)
    for r in runs:
        accs = [0.3, 0.5, 0.6] if r.sampler == "uniform" else [0.5, 0.6, 0.62]
        write_run(r.spec, [(3, None), (5, accs[0]), (9, accs[1]), (12, accs[2])],
                  {"final_val_accuracy": accs[-1], "final_val_loss": 0.5, "wall_seconds": 1.0})
    rep = iwds.build_report(args, runs, [RunResult(r.spec, "reused", summary=runner.read_summary(r.spec.out),
                                                   returncode=0) for r in runs])
    (cell,) = rep["cells"]
    assert cell["uniform"]["curve"] == [(1.0, 0.3), (2.0, 0.5), (3.0, 0.6)]
    # T = 0.9 x 0.62 = 0.558: IWDS at round 2 (0.6), uniform at round 3 (0.6); finals within 1 pp? 2 pp: partly
    assert cell["iwds"]["rounds_to_target"] == 2 and cell["uniform"]["rounds_to_target"] == 3
    assert cell["claim"]["paper"] == "IWDS converges faster, similar final accuracy"
    assert cell["claim"]["verdict"] == "partly: faster, final differs by more than 1 pp"
    assert "3 rounds of 0.5 local epoch(s)" in iwds.format_markdown(rep)


# ---- vanlier: the plan ----------------------------------------------------------------------------

def test_vanlier_full_plan_is_the_thesis_protocol(tmp_path):
    args, runs = vanlier.prepare(["--out", str(tmp_path / "s")])
    by = {r.spec.run_id: r for r in runs}
    # (d_0, d_5, d_10, d_25, d_50, d_75, d_100, d_iid, centralized) x 3 seeds
    assert len(runs) == 27 and [r.label for r in runs[:9]] == ["d_0", "d_5", "d_10", "d_25", "d_50", "d_75", "d_100",
                                                               "d_iid", "central"]
    d = by["fedavg-d75-s2"].spec
    assert d.nproc == 1984  # the thesis's K
    assert flag(d.argv, "--partition") == "entropy" and flag(d.argv, "--entropy-steps") == "75"
    assert flag(d.argv, "--client-fraction") == "0.1" and flag(d.argv, "--batch-size") == "64"  # C = 0.1, B = 64
    assert flag(d.argv, "--model") == "logreg" and flag(d.argv, "--weight-decay") == "0" and "--reset-momentum" in d.argv
    # 250 rounds of 5 local steps (E = 5 epochs of the average client's ceil(30.2 / 64) = 1 minibatch)
    assert flag(d.argv, "--iter-local") == "5" and flag(d.argv, "--steps") == "1250" and flag(d.argv, "--eval-every") == "5"
    assert vanlier.participants(args) == 198  # floor(0.1 x 1984) = the thesis code's round(C K)
    iid = by["fedavg-iid-s0"].spec
    assert flag(iid.argv, "--partition") == "iid" and iid.nproc == 1984
    c = by["central-s1"]
    assert c.spec.nproc == 1 and flag(c.spec.argv, "--algo") == "bsp" and flag(c.spec.argv, "--partition") == "iid"
    # one round-equivalent = 198 participants x 5 minibatches
    assert c.steps_per_round == 990 and flag(c.spec.argv, "--steps") == str(250 * 990)
    assert flag(c.spec.argv, "--eval-every") == "990" and flag(c.spec.argv, "--lr") == "0.01"
    assert "--client-fraction" not in c.spec.argv and flag(c.spec.argv, "--seed") == "1"


def test_vanlier_processes_host_the_clients(tmp_path):
    """FedAvg's 1,984 partitions run in --processes (default 1) processes: the pool engine; centralized on one."""
    args, runs = vanlier.prepare(["--out", str(tmp_path / "s")])
    assert args.processes == 1
    seen = []

    def launch(spec, stdout, stderr):
        seen.append((spec.run_id, spec.procs, spec.launch_argv[-2:]))
        raise OSError("not started in a unit test")
    runner.run_all([r.spec for r in runs[7:9]], processes=args.processes, launcher=launch, log=lambda m: None)
    assert seen == [("fedavg-iid-s0", 1, ("--partitions", "1984")), ("central-s0", 1, ("--seed", "0"))]


def test_vanlier_quick_plan(tmp_path):
    args, runs = vanlier.prepare(["--budget", "quick", "--out", str(tmp_path / "s")])
    assert [r.spec.run_id for r in runs] == ["fedavg-d0-s0", "fedavg-d5-s0", "fedavg-iid-s0", "central-s0"]
    assert runs[0].spec.nproc == 20 and vanlier.participants(args) == 2
    assert flag(runs[3].spec.argv, "--steps") == "6" and runs[3].steps_per_round == 2  # 3 rounds x 2 x 1


# ---- bad arguments --------------------------------------------------------------------------------

@pytest.mark.parametrize("study, argv, message", [
    (iwds, ["--algos", "fedavg,scaffold"], "subset of fedavg,fedprox,fednova"),
    (iwds, ["--settings", "lda-x"], "settings such as lda-0.5"),
    (iwds, ["--settings", "llt-1.5"], "LLT alpha_l is a share in [0, 1]"),
    (iwds, ["--iwds", "1,0.8,0.992"], "need 0 <= beta0, beta_m < 1"),
    (iwds, ["--iwds", "0.9,0.8"], "three numbers"),
    (iwds, ["--rounds", "0"], "--rounds must be >= 1"),
    (iwds, ["--jobs", "0"], "--jobs must be >= 1"),
    (iwds, ["--seeds", "1,1"], "distinct seeds"),
    (iwds, ["--target-frac", "1.5"], "--target-frac must be in (0, 1]"),
    (iwds, ["--", "--iwds-mode", "reweight"], "--iwds-mode are set by the study"),
    (iwds, ["--", "--lr", "0.1"], "--lr are set by the study"),
    (iwds, ["--", "--no-such-flag"], "unrecognized arguments"),
    (vanlier, ["--clients", "5"], "--clients must be >= 10"),
    (iwds, ["--settings", "hetero-0"], "an LDA alpha_d must be > 0"),
    (iwds, ["--local-epochs", "-1"], "--local-epochs must be >= 0"),
    (vanlier, ["--clients", "70000"], "exceeds the 60000 training examples"),
    (vanlier, ["--client-fraction", "0"], "--client-fraction must be in (0, 1]"),
    (vanlier, ["--entropy-steps", "5,-1"], "distinct integers >= 0"),
    (vanlier, ["--model", "resnet20"], "invalid choice"),
    (vanlier, ["--local-steps", "0"], "--local-steps must be >= 1"),
    (vanlier, ["--", "--partition", "iid"], "--partition are set by the study"),
    (vanlier, ["--", "--rounds", "3"], "--rounds are set by the study"),
    (iwds, ["--", "--eval-every-rounds", "1"], "--eval-every-rounds are set by the study"),
    (iwds, ["--", "--divergence-loss", "100"], "--divergence-loss is not supported in a study"),
    (vanlier, ["--", "--batch-size", "0"], "batch"),  # geodml's own preflight, per run
])
def test_bad_arguments_one_line_exit_2_nothing_launched(study, argv, message, tmp_path, capsys):
    cut = argv.index("--") if "--" in argv else len(argv)
    try:
        rc = study.main([*argv[:cut], "--out", str(tmp_path / "o"), *argv[cut:]], launcher=no_launch)
    except SystemExit as exc:  # argparse's own type errors
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"geodml.study {study.NAME}: error: ") and message in lines[0], err
    assert not (tmp_path / "o").exists()


# ---- helpers computed by hand ---------------------------------------------------------------------

# A hand-made 3-class test set: the probability rows of six examples (labels 0, 0, 1, 1, 2, 2).
PROBS = np.array([[0.70, 0.20, 0.10], [0.50, 0.15, 0.35], [0.25, 0.60, 0.15],
                  [0.30, 0.12, 0.58], [0.05, 0.35, 0.60], [0.40, 0.05, 0.55]])
LABELS = np.array([0, 0, 1, 1, 2, 2])
# Per class, the fraction of (positive, negative) pairs ranked correctly (no ties within a column):
# class 0: positives 0.70, 0.50 above every negative (0.25, 0.30, 0.05, 0.40): 8/8;
# class 1: 0.60 above all 4 negatives (0.20, 0.15, 0.35, 0.05), 0.12 above only 0.05: 5/8;
# class 2: 0.60 above all 4 (0.10, 0.35, 0.15, 0.58), 0.55 above 3: 7/8.
AUC_BY_HAND = (1.0 + 5 / 8 + 7 / 8) / 3
# argmax predictions 0, 0, 1, 2, 2, 2; per class (1 + TPR - FPR) / 2: class 0 (1 + 1 - 0)/2, class 1
# (1 + 1/2 - 0)/2, class 2 (1 + 1 - 1/4)/2
HARD_AUC_BY_HAND = (1.0 + 0.75 + 0.875) / 3


def test_roc_auc_by_hand():
    s = common.roc_auc_scores(LABELS, PROBS, 3)
    assert s["roc_auc"] == pytest.approx(AUC_BY_HAND) and AUC_BY_HAND == pytest.approx(0.8333333)
    assert s["roc_auc_hard"] == pytest.approx(HARD_AUC_BY_HAND) and s["accuracy"] == pytest.approx(5 / 6)
    constant = common.roc_auc_scores(LABELS, np.full((6, 3), 1 / 3), 3)  # no ranking at all
    assert constant["roc_auc"] == 0.5 and constant["roc_auc_hard"] == 0.5 and constant["accuracy"] == pytest.approx(1 / 3)


def test_spearman_rounds_and_mean_curve_by_hand():
    assert common.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert common.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # ranks (1, 2, 3) vs (1.5, 1.5, 3): 1.5 / sqrt(2 * 1.5)
    assert common.spearman([1.0, 1.81, 2.0], [0.5, 0.5, 0.83]) == pytest.approx(1.5 / math.sqrt(3))
    assert common.spearman([1, 2], [1, 2]) is None and common.spearman([1, 1, 1], [1, 2, 3]) is None
    curve = [(1.0, 0.2), (2.0, 0.5), (3.0, 0.7)]
    assert iwds.rounds_to(curve, 0.5) == 2.0 and iwds.rounds_to(curve, 0.71) is None and iwds.rounds_to(curve, None) is None
    assert iwds.mean_curve([[(1.0, 0.2), (2.0, 0.4)], [(1.0, 0.4), (2.0, 0.6), (3.0, 0.9)]]) == [
        (1.0, pytest.approx(0.3)), (2.0, pytest.approx(0.5))]
    assert common.mean_sd([0.6, 0.62]) == (pytest.approx(0.61), pytest.approx(0.0141421356))
    assert common.mean_sd([0.5]) == (0.5, None) and common.mean_sd([]) == (None, None)


# ---- iwds: the report from fake finished runs ----------------------------------------------------------

IWDS_ARGV = ["--budget", "quick", "--algos", "fedavg", "--settings", "llt-0.9,lda-0.5", "--seeds", "0,1",
             "--rounds", "4", "--local-steps", "2"]
# accuracy after rounds 1-4 per (sampler, setting, seed); the last value is the summary's final accuracy
IWDS_CURVES = {
    ("uniform", "llt", 0): [0.2, 0.4, 0.5, 0.60], ("uniform", "llt", 1): [0.2, 0.3, 0.5, 0.62],
    ("iwds", "llt", 0): [0.5, 0.6, 0.7, 0.70], ("iwds", "llt", 1): [0.4, 0.6, 0.68, 0.72],
    ("uniform", "lda", 0): [0.5, 0.7, 0.8, 0.80], ("uniform", "lda", 1): [0.5, 0.7, 0.8, 0.82],
    ("iwds", "lda", 0): [0.6, 0.75, 0.8, 0.81], ("iwds", "lda", 1): [0.6, 0.75, 0.8, 0.81],
}


def write_run(spec, curve_steps, summary, extra_files=None):
    spec.out.mkdir(parents=True)
    (spec.out / "launch.json").write_text(json.dumps(runner.launch_record(spec)))
    (spec.out / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "train_loss": 1.0, **({"val_accuracy": a} if a is not None else {})}) + "\n"
        for s, a in curve_steps))
    for name, content in (extra_files or {}).items():
        if isinstance(content, bytes):
            (spec.out / name).write_bytes(content)
        else:
            (spec.out / name).write_text(content)
    (spec.out / "summary.json").write_text(json.dumps(summary))


def fake_iwds(tmp_path, skip=()):
    args, runs = iwds.prepare([*IWDS_ARGV, "--out", str(tmp_path / "s")])
    for r in runs:
        if r.spec.run_id in skip:
            continue
        accs = IWDS_CURVES[(r.sampler, r.partition, r.seed)]
        steps = [(2, None), *[(2 * (i + 1), a) for i, a in enumerate(accs)]]  # a log line without evaluation too
        write_run(r.spec, steps, {"final_val_accuracy": accs[-1], "final_val_loss": 0.5, "wall_seconds": 3.0})
    return args, runs


def test_iwds_report_by_hand(tmp_path, capsys):
    args, runs = fake_iwds(tmp_path)
    assert iwds.main([*IWDS_ARGV, "--out", str(tmp_path / "s")], launcher=no_launch) == 0
    out = capsys.readouterr().out
    assert out.count("] reused ") == 8
    rep = json.loads((tmp_path / "s" / "iwds.json").read_text())
    llt, lda = rep["cells"]
    u, i = llt["uniform"], llt["iwds"]
    # LLT: finals uniform 0.60/0.62 (mean 0.61), IWDS 0.70/0.72 (0.71); T = 0.9 x 0.71 = 0.639
    assert u["final_mean"] == pytest.approx(0.61) and i["final_mean"] == pytest.approx(0.71)
    assert u["final_sd"] == pytest.approx(0.0141421356) and u["target"] == pytest.approx(0.639)
    # seed-mean curves: uniform 0.2, 0.35, 0.5, 0.61 never reaches T; IWDS 0.45, 0.6, 0.69, 0.71 at round 3
    assert u["rounds_to_target"] is None and i["rounds_to_target"] == 3
    assert u["mean_accuracy"] == pytest.approx((0.2 + 0.35 + 0.5 + 0.61) / 4)
    assert i["rounds_mean"] == 3 and i["rounds_sd"] == 0 and u["rounds_mean"] is None and u["seeds_reached"] == 0
    assert llt["claim"]["verdict"] == "supported" and llt["claim"]["final_diff"] == pytest.approx(0.10)
    assert llt["claim"]["beyond_noise"] is True
    # LDA: finals 0.81 both, T = 0.729: uniform (0.5, 0.7, 0.8, 0.81) at round 3, IWDS (0.6, 0.75, ...) at 2
    assert lda["uniform"]["rounds_to_target"] == 3 and lda["iwds"]["rounds_to_target"] == 2
    assert lda["claim"]["verdict"] == "supported" and lda["claim"]["final_diff"] == pytest.approx(0.0, abs=1e-12)
    md = (tmp_path / "s" / "iwds.md").read_text()
    assert ("| FedAvg | LLT 0.9 | 61.0 +- 1.4% | 71.0 +- 1.4% | +10.0 pp | 63.9% | - | 3 | 41.5% | 61.3% | "
            "IWDS converges fastest and ends highest (Figure 5) | supported |") in md
    assert "| FedAvg | LDA 0.5 | 81.0 +- 1.4% | 81.0 +- 0.0% | +0.0 pp | 72.9% | 3 | 2 |" in md
    assert ("**supported**. T = 63.9%: IWDS round 3 vs uniform not reached; final IWDS 71.0 +- 1.4% vs uniform "
            "61.0 +- 1.4% (+10.0 pp, beyond the seed sd 1.4 pp)") in md
    # early accuracy: all 4 rounds (fewer than 10): (0.4 + 0.6 + 0.68 + 0.72) / 4; roughness: the second half, |0.72 - 0.68|
    assert ("| fedavg-iwds-llt-0.9-s1 | FedAvg | iwds | LLT 0.9 | longtail --tail 0.9 | 1 | 0.7200 | 0.7200 | 60.0% | 60.0% "
            "| 4.00 pp | 3 | reused |") in md
    # paired IWDS - uniform at LLT: finals +0.10 in both seeds (no spread: no p); early (0.625 - 0.425, 0.60 - 0.405):
    # +0.1975 +- 0.0035, t = 79 at 1 df, p = 1 - 2 atan(79) / pi (the Cauchy distribution); roughness (0 - 0.1,
    # 0.04 - 0.12): -0.09 +- 0.014, t = -9, p = 2 atan(1 / 9) / pi
    p_early, p_rough = 1 - 2 * math.atan(79) / math.pi, 2 * math.atan(1 / 9) / math.pi
    assert (f"| FedAvg: IWDS - uniform | LLT 0.9 | - | 2 | +10.00 +- 0.00 pp (2/2 above 0) | +19.75 +- 0.35 pp "
            f"(2/2 above 0, p = {p_early:.2g}) | -9.00 +- 1.41 pp (0/2 above 0, p = {p_rough:.2g}) |") in md
    paired_llt = rep["paired"][0]
    assert paired_llt["early_accuracy"]["p"] == pytest.approx(p_early, rel=1e-9)
    assert paired_llt["roughness"]["p"] == pytest.approx(p_rough, rel=1e-9)
    assert paired_llt["final_accuracy"]["p"] is None and len(rep["paired"]) == 2  # FedAvg only: no algorithm - FedAvg rows
    assert "**supported**" in out  # the evidence is printed too
    with open(tmp_path / "s" / "iwds.csv") as f:
        rows = {r["run_id"]: r for r in csv.DictReader(f)}
    assert len(rows) == 8 and float(rows["fedavg-uniform-lda-0.5-s1"]["final_accuracy"]) == pytest.approx(0.82)
    assert rows["fedavg-uniform-llt-0.9-s0"]["rounds_to_target"] == ""
    assert rows["fedavg-iwds-lda-0.5-s0"]["geodml_partition"] == "dirichlet --alpha 5"
    with open(tmp_path / "s" / "iwds_cells.csv") as f:
        cells = list(csv.DictReader(f))
    assert [c["sampler"] for c in cells] == ["uniform", "iwds", "uniform", "iwds"] and cells[1]["verdict"] == "supported"
    with open(tmp_path / "s" / "iwds_paired.csv") as f:
        paired_rows = list(csv.DictReader(f))
    assert len(paired_rows) == 2 * 3 and paired_rows[2]["measure"] == "roughness" and paired_rows[2]["seeds"] == "0;1"
    assert [float(d) for d in paired_rows[2]["diffs"].split(";")] == pytest.approx([-0.1, -0.08])
    assert float(paired_rows[2]["p"]) == pytest.approx(p_rough) and paired_rows[0]["p"] == ""
    with open(tmp_path / "s" / "iwds_curves.csv") as f:
        points = list(csv.DictReader(f))
    # 8 runs x 4 evaluated rounds (the log line without an evaluation is not a round)
    assert len(points) == 32
    mine = [p for p in points if p["run_id"] == "fedavg-iwds-llt-0.9-s1"]
    assert [(p["round"], float(p["val_accuracy"])) for p in mine] == [("1", 0.4), ("2", 0.6), ("3", 0.68), ("4", 0.72)]
    assert (mine[0]["algo"], mine[0]["sampler"], mine[0]["partition"], mine[0]["param"], mine[0]["seed"]) == (
        "fedavg", "iwds", "llt", "0.9", "1")
    for png in ("curves.png", "final.png"):
        assert (tmp_path / "s" / png).read_bytes()[:8] == PNG


def test_iwds_final_accuracy_over_the_last_rounds_by_hand(tmp_path):
    """--final-rounds 2: a run's final accuracy is the mean of its last two rounds, and the claims
    use it; the last round alone is reported beside it."""
    fake_iwds(tmp_path)
    args, runs = iwds.prepare([*IWDS_ARGV, "--out", str(tmp_path / "s"), "--final-rounds", "2"])
    rep = iwds.build_report(args, runs, [RunResult(r.spec, "reused", summary=runner.read_summary(r.spec.out),
                                                   returncode=0) for r in runs])
    llt, lda = rep["cells"]
    u, i = llt["uniform"], llt["iwds"]
    # LLT uniform: (0.5 + 0.60) / 2 = 0.55 and (0.5 + 0.62) / 2 = 0.56; IWDS: 0.70 and (0.68 + 0.72) / 2 = 0.70
    assert u["final_mean"] == pytest.approx(0.555) and u["final_sd"] == pytest.approx(0.00707106781)
    assert i["final_mean"] == pytest.approx(0.70) and i["final_sd"] == pytest.approx(0.0, abs=1e-12)
    assert i["last_round_mean"] == pytest.approx(0.71) and u["last_round_mean"] == pytest.approx(0.61)
    # T = 0.9 x 0.70 = 0.63: the IWDS seed-mean curve (0.45, 0.6, 0.69, 0.71) reaches it at round 3, uniform never
    assert u["target"] == pytest.approx(0.63) and i["rounds_to_target"] == 3 and u["rounds_to_target"] is None
    assert llt["claim"]["verdict"] == "supported" and llt["claim"]["final_diff"] == pytest.approx(0.145)
    assert "the last round alone: IWDS 71.0 +- 1.4% vs uniform 61.0 +- 1.4% (+10.0 pp)" in llt["claim"]["evidence"]
    # LDA: 0.80, 0.81 against 0.805, 0.805: T = 0.7245, uniform round 3 (0.8), IWDS round 2 (0.75)
    assert lda["claim"]["final_diff"] == pytest.approx(0.0, abs=1e-12) and lda["iwds"]["rounds_to_target"] == 2
    assert lda["uniform"]["rounds_to_target"] == 3 and lda["claim"]["verdict"] == "supported"
    md = iwds.format_markdown(rep)
    assert "a run's final accuracy is the mean of its last 2 round(s)" in md
    assert "| fedavg-iwds-llt-0.9-s1 | FedAvg | iwds | LLT 0.9 | longtail --tail 0.9 | 1 | 0.7000 | 0.7200 |" in md
    for bad in ("0", "5"):
        with pytest.raises(StudyError, match=r"--final-rounds must be in 1\.\.4"):
            iwds.parse([*IWDS_ARGV, "--final-rounds", bad])
    assert iwds.parse(["--budget", "full"]).final_rounds == 10 and iwds.parse(IWDS_ARGV).final_rounds == 1


def test_iwds_early_accuracy_and_roughness_by_hand():
    curve = [(1.0, 0.2), (2.0, 0.5), (3.0, 0.4), (4.0, 0.7), (5.0, 0.6)]
    assert iwds.early_accuracy(curve, rounds=2) == pytest.approx(0.35)
    assert iwds.early_accuracy(curve) == pytest.approx(0.48)  # fewer than 10 rounds: all of them
    assert iwds.early_accuracy([]) is None
    # the second half is the last ceil(5 / 2) = 3 points, 0.4, 0.7, 0.6: (0.3 + 0.1) / 2
    assert iwds.roughness(curve) == pytest.approx(0.2)
    assert iwds.roughness(curve[:3]) == pytest.approx(0.1)  # the last ceil(3 / 2) = 2 points: 0.5, 0.4
    assert iwds.roughness(curve[:1]) is None


def test_iwds_paired_against_fedavg_by_seed(tmp_path):
    """With FedAvg in the study, each other algorithm is compared with it seed by seed per sampler;
    a seed whose run failed on either side drops out of the pair."""
    args = iwds.parse(["--budget", "quick", "--algos", "fedavg,fedprox", "--settings", "hetero-0.5", "--seeds", "0,1,2",
                       "--out", str(tmp_path / "s")])

    def row(algo, sampler, seed, final, early, rough):
        return {"algo": algo, "partition": "hetero", "param": 0.5, "sampler": sampler, "seed": seed,
                "final_accuracy": final, "early_accuracy": early, "roughness": rough}
    rows = [row("fedavg", "uniform", 0, 0.90, 0.80, 0.010), row("fedprox", "uniform", 0, 0.91, 0.78, 0.008),
            row("fedavg", "uniform", 1, 0.89, 0.81, 0.012), row("fedprox", "uniform", 1, 0.89, 0.77, 0.012),
            row("fedavg", "uniform", 2, 0.88, 0.79, 0.009), row("fedprox", "uniform", 2, None, None, None),
            row("fedavg", "iwds", 0, 0.90, 0.82, 0.010), row("fedprox", "iwds", 0, 0.90, 0.80, 0.010)]
    comps = iwds.paired_comparisons(args, rows)
    assert [(c["comparison"], c["sampler"]) for c in comps] == [
        ("FedAvg: IWDS - uniform", ""), ("FedProx: IWDS - uniform", ""), ("FedProx - FedAvg", "uniform"),
        ("FedProx - FedAvg", "iwds")]
    fp_u = comps[2]
    assert fp_u["seeds"] == [0, 1]  # seed 2's FedProx run failed
    assert fp_u["final_accuracy"]["diffs"] == pytest.approx([0.01, 0.0]) and fp_u["final_accuracy"]["above"] == 1
    # early: -0.02 and -0.04: mean -0.03, sd 0.0141, t = -3 at 1 df: p = 2 atan(1 / 3) / pi
    assert fp_u["early_accuracy"]["mean"] == pytest.approx(-0.03) and fp_u["early_accuracy"]["above"] == 0
    assert fp_u["early_accuracy"]["p"] == pytest.approx(2 * math.atan(1 / 3) / math.pi)
    assert fp_u["roughness"]["diffs"] == pytest.approx([-0.002, 0.0]) and fp_u["roughness"]["seeds"] == [0, 1]
    # a measure missing on one side drops that seed from that measure only; differences equal up to rounding
    # (0.3 - 0.2 and 0.4 - 0.3 as floats) have no spread and no p
    rows[2]["early_accuracy"] = None
    fp_u = iwds.paired_comparisons(args, rows)[2]
    assert fp_u["early_accuracy"]["seeds"] == [0] and fp_u["final_accuracy"]["seeds"] == [0, 1]
    assert iwds.paired_t_p([0.3 - 0.2, 0.4 - 0.3]) is None and iwds.paired_t_p([0.1, 0.2]) is not None
    assert comps[3]["seeds"] == [0] and comps[3]["final_accuracy"]["sd"] is None and comps[3]["final_accuracy"]["p"] is None
    assert comps[0]["seeds"] == [0] and comps[0]["early_accuracy"]["mean"] == pytest.approx(0.02)
    assert iwds.paired_text(comps[3]["early_accuracy"]) == "-2.00 pp (0/1 above 0)"
    assert iwds.paired_text(comps[1]["early_accuracy"]) == "+2.00 pp (1/1 above 0)"  # FedProx IWDS - uniform, seed 0
    assert iwds.paired_text(iwds.paired([], rows)["final_accuracy"]) == "-"


def test_iwds_failed_run_is_excluded_and_verdicts_follow(tmp_path):
    """A failed IWDS seed drops out of its cell: LLT IWDS is then seed 1 alone (0.72, no sd)."""
    args, runs = fake_iwds(tmp_path, skip={"fedavg-iwds-llt-0.9-s0"})
    results = []
    for r in runs:
        s = runner.read_summary(r.spec.out)
        results.append(RunResult(r.spec, "reused", summary=s, returncode=0) if s is not None else
                       RunResult(r.spec, "failed", returncode=3, error="exit code 3"))
    rep = iwds.build_report(args, runs, results)
    llt = rep["cells"][0]
    assert rep["failed"] == ["fedavg-iwds-llt-0.9-s0"]
    assert llt["iwds"]["seeds_ok"] == 1 and llt["iwds"]["final_mean"] == pytest.approx(0.72) and llt["iwds"]["final_sd"] is None
    assert llt["uniform"]["target"] == pytest.approx(0.9 * 0.72)  # 0.648: IWDS seed 1 reaches it at round 3 (0.68)
    assert llt["iwds"]["rounds_to_target"] == 3 and llt["claim"]["verdict"] == "supported"
    md = iwds.format_markdown(rep)
    assert "Failed (excluded): fedavg-iwds-llt-0.9-s0: exit code 3" in md and "FAILED (exit 3)" in md
    # an LDA IWDS result 2 pp below uniform: faster but not 'similar' (> 1 pp)
    for r in rep["rows"]:
        if r["sampler"] == "iwds" and r["partition"] == "lda":
            r["final_accuracy"] = 0.79
    pair = {c: {**rep["cells"][1][c]} for c in ("uniform", "iwds")}
    pair["iwds"]["final_mean"] = 0.79
    assert iwds.claim(args, "lda", pair)["verdict"] == "partly: faster, final differs by more than 1 pp"


# ---- vanlier: the report from fake finished runs --------------------------------------------------------

VL_ARGV = ["--budget", "quick", "--entropy-steps", "0,50", "--seeds", "0,1"]
# final accuracies per distribution and seed; label counts (partition x class) whose entropy is worked out by hand
VL_ACC = {"d_0": (0.50, 0.52), "d_50": (0.60, 0.62), "d_iid": (0.80, 0.82), "central": (0.75, 0.77)}
VL_COUNTS = {"d_0": [[4, 0], [0, 4]],      # Pr = 1/2, 1/2: 1 bit
             "d_50": [[3, 1], [1, 3]],     # Pr = 3/8, 1/8, 1/8, 3/8: 0.75 log2(8/3) + 0.25 log2(8) = 1.8113 bits
             "d_iid": [[2, 2], [2, 2]],    # 2 bits
             "central": [[4, 4]]}
ENTROPY_D50 = 0.75 * math.log2(8 / 3) + 0.25 * 3
IDENTITY, CONSTANT = "identity", "constant"
# FedAvg d_0 and d_50 end as a constant model (ROC AUC 0.5), d_iid and centralized as the identity on the
# hand-made test set (AUC_BY_HAND)
VL_MODEL = {"d_0": CONSTANT, "d_50": CONSTANT, "d_iid": IDENTITY, "central": IDENTITY}


def tiny_dataset(*_args):
    x = torch.tensor(np.log(PROBS), dtype=torch.float32).reshape(6, 1, 1, 3)  # softmax(log p) = p
    y = torch.tensor(LABELS)
    return Dataset("tiny", x, y, x, y, 3)


def model_bytes(kind):
    import io
    w = torch.eye(3) if kind == IDENTITY else torch.zeros(3, 3)
    buf = io.BytesIO()
    torch.save({"linear.weight": w, "linear.bias": torch.zeros(3)}, buf)
    return buf.getvalue()


def fake_vanlier(tmp_path):
    args, runs = vanlier.prepare([*VL_ARGV, "--out", str(tmp_path / "s")])
    config = json.dumps({"config": {"data": {"dataset": "digits", "data_dir": None, "cache": "off"}, "seed": 0,
                                    "model": {"model": "logreg", "norm": "none", "gn_group_size": None, "gn_groups": None}}})
    for r in runs:
        final = VL_ACC[r.label][r.seed]
        curve = [(r.steps_per_round * k, final - 0.1 * (3 - k)) for k in (1, 2, 3)]
        write_run(r.spec, curve, {"final_val_accuracy": final, "final_val_loss": 0.5, "wall_seconds": 2.0},
                  {"config.json": config, "partitions.json": json.dumps({"label_counts": VL_COUNTS[r.label]}),
                   "model.pt": model_bytes(VL_MODEL[r.label])})
    return args, runs


def test_vanlier_report_by_hand(tmp_path, capsys):
    fake_vanlier(tmp_path)
    argv = [*VL_ARGV, "--out", str(tmp_path / "s")]
    assert vanlier.main(argv, launcher=no_launch, loader=tiny_dataset) == 0
    out = capsys.readouterr().out
    assert out.count("] reused ") == 8
    rep = json.loads((tmp_path / "s" / "vanlier.json").read_text())
    d = {x["distribution"]: x for x in rep["distributions"]}
    assert list(d) == ["d_0", "d_50", "d_iid", "central"]
    assert d["d_0"]["entropy_bits"] == pytest.approx(1.0) and d["d_50"]["entropy_bits"] == pytest.approx(ENTROPY_D50)
    assert d["d_iid"]["entropy_bits"] == pytest.approx(2.0) and ENTROPY_D50 == pytest.approx(1.811278)
    assert d["d_iid"]["final_accuracy"] == pytest.approx(0.81) and d["central"]["final_accuracy"] == pytest.approx(0.76)
    assert d["d_iid"]["acc_vs_central"] == pytest.approx(0.05) and d["d_50"]["acc_vs_central"] == pytest.approx(-0.15)
    assert d["central"]["roc_auc"] == pytest.approx(AUC_BY_HAND) and d["central"]["roc_auc_sd"] == 0
    assert d["d_0"]["roc_auc"] == 0.5 and d["d_0"]["roc_auc_hard"] == 0.5
    assert d["d_iid"]["auc_vs_central"] == pytest.approx(0.0) and d["d_50"]["auc_vs_central"] == pytest.approx(0.5 - AUC_BY_HAND)
    assert d["central"]["roc_auc_hard"] == pytest.approx(HARD_AUC_BY_HAND) and rep["majority_accuracy"] == pytest.approx(1 / 3)
    row = next(r for r in rep["rows"] if r["run_id"] == "fedavg-d0-s1")
    assert row["model_accuracy"] == pytest.approx(1 / 3) and row["curve"] == [[1.0, pytest.approx(0.32)],
                                                                             [2.0, pytest.approx(0.42)], [3.0, 0.52]]
    central_row = next(r for r in rep["rows"] if r["run_id"] == "central-s0")
    assert [x for x, _ in central_row["curve"]] == [1.0, 2.0, 3.0]  # steps 2, 4, 6 at m x local steps = 2 per round
    c1, c2, c3 = rep["claims"]
    # entropy (1, 1.81, 2) against accuracy (0.51, 0.61, 0.81): +1; against ROC AUC (0.5, 0.5, 0.83): 1.5 / sqrt(3)
    assert c1["verdict"] == "supported" and "+1.00" in c1["evidence"] and "+0.87" in c1["evidence"]
    # high entropy: d_50 (-15 pp) and d_iid (+5 pp) against centralized 76%
    assert c2["verdict"] == "partly" and "d_50 -15.0 pp, d_iid +5.0 pp" in c2["evidence"]
    # ROC AUC: d_0 and d_50 below centralized, d_iid equal to it
    assert c3["verdict"] == "partly" and "d_iid +0.0000" in c3["evidence"] and "above 2 of 3" in c3["evidence"]
    md = (tmp_path / "s" / "vanlier.md").read_text()
    assert ("| d_50 | 1.811 | 61.0 +- 1.4% | -15.0 pp | 0.5000 +- 0.0000 | -0.3333 | 0.5000 +- 0.0000 | "
            "accuracy above centralized training, ROC AUC below it (Section 3.2, Figures 3.4-3.5) |") in md
    assert "| central | - | 76.0 +- 1.4% | - | 0.8333 +- 0.0000 | - | 0.8750 +- 0.0000 | the best ROC AUC of all" in md
    assert "| fedavg-d0-s0 | d_0 | 20 | 0 | 1.000 | 0.5000 | 0.5000 | 0.5000 | reused |" in md
    assert "Majority-class base classifier: accuracy 33.3%" in md
    with open(tmp_path / "s" / "vanlier_distributions.csv") as f:
        rows = {r["distribution"]: r for r in csv.DictReader(f)}
    assert float(rows["d_iid"]["acc_vs_central"]) == pytest.approx(0.05) and rows["central"]["acc_vs_central"] == ""
    with open(tmp_path / "s" / "vanlier.csv") as f:
        assert len(list(csv.DictReader(f))) == 8
    for png in ("curves.png", "entropy.png"):
        assert (tmp_path / "s" / png).read_bytes()[:8] == PNG
    # the ROC AUC is cached next to the model: a second report needs no dataset
    assert json.loads((tmp_path / "s" / "central-s0" / common.ROC_CACHE).read_text())["scores"]["roc_auc"] == pytest.approx(
        AUC_BY_HAND)

    def no_data(*_a):
        raise AssertionError("dataset loaded although every ROC AUC is cached")
    assert vanlier.main(argv, launcher=no_launch, loader=no_data) == 0


def test_vanlier_roc_auc_failure_is_reported_not_fatal(tmp_path, capsys):
    fake_vanlier(tmp_path)
    (tmp_path / "s" / "fedavg-d0-s0" / "model.pt").unlink()

    def loader(*a):
        return tiny_dataset()
    assert vanlier.main([*VL_ARGV, "--out", str(tmp_path / "s"), "--no-plots"], launcher=no_launch, loader=loader) == 0
    md = (tmp_path / "s" / "vanlier.md").read_text()
    assert "ROC AUC not computed for fedavg-d0-s0: FileNotFoundError" in md
    rep = json.loads((tmp_path / "s" / "vanlier.json").read_text())
    d0 = next(x for x in rep["distributions"] if x["distribution"] == "d_0")
    assert d0["roc_auc"] == 0.5 and d0["roc_auc_sd"] is None  # seed 1 alone
    assert not (tmp_path / "s" / "curves.png").exists()


def test_run_roc_auc_through_the_saved_model(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"config": {"data": {"dataset": "digits", "data_dir": None}, "seed": 4,
                                                            "model": {"model": "logreg", "norm": "none"}}}))
    (run / "model.pt").write_bytes(model_bytes(IDENTITY))
    seen = []

    def loader(name, data_dir, seed, cache):
        seen.append((name, data_dir, seed))
        return tiny_dataset()
    memo: dict = {}
    s = common.run_roc_auc(run, loader=loader, datasets=memo)
    assert s["roc_auc"] == pytest.approx(AUC_BY_HAND) and s["roc_auc_hard"] == pytest.approx(HARD_AUC_BY_HAND)
    assert s["accuracy"] == pytest.approx(5 / 6) and seen == [("digits", None, 4)]  # digits' split depends on the seed
    # a new model invalidates the cache
    (run / "model.pt").write_bytes(model_bytes(CONSTANT))
    import os
    os.utime(run / "model.pt", ns=(1, 1))
    assert common.run_roc_auc(run, loader=loader, datasets=memo)["roc_auc"] == 0.5 and len(seen) == 1  # memoized data
    assert Path(run / common.ROC_CACHE).exists()
