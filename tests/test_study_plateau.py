"""The plateau study (geodml.study.plateau): the budget rule worked by hand, the plan, a report from reused runs."""

from __future__ import annotations

import json

import pytest

from geodml.study import plateau, runner


def no_launch(spec, stdout, stderr):
    raise AssertionError(f"launched {spec.run_id}")


def flag(argv, name):
    return [argv[i + 1] for i, a in enumerate(argv) if a == name][-1]


def test_rule_by_hand():
    # gains 1 -> 2: +20 / +23 pp; 2 -> 4: +10 / +11; 4 -> 8: +0.3 / +0.6 (train > 0.5); 8 -> 16: +0.2 / +0.4
    points = [(1, 0.50, 0.52), (2, 0.70, 0.75), (4, 0.80, 0.86), (8, 0.803, 0.866), (16, 0.805, 0.870)]
    assert plateau.plateau_budget(points, 0.5) == 8
    assert plateau.plateau_budget(points, 0.7) == 4  # a looser threshold stops one doubling earlier
    assert plateau.plateau_budget(points[:4], 0.5) is None  # beyond the grid: no successor qualifies
    # not learning is not a plateau: 10% -> 10% qualifies on gains but not on LEARNED (20%)
    assert plateau.plateau_budget([(1, 0.10, 0.10), (2, 0.10, 0.101), (4, 0.5, 0.5)], 0.5) is None
    # an E without a successful run decides nothing on either side
    assert plateau.plateau_budget([(1, 0.5, 0.5), (2, None, None), (4, 0.8, 0.8), (8, 0.8, 0.8)], 0.5) == 4


def test_plan_is_the_released_solver_scaled(tmp_path):
    args = plateau.parse(["--out", str(tmp_path / "p"), "--seeds", "0,1"])
    runs = {r.spec.run_id: r for r in plateau.plan(args)}
    assert len(runs) == 12 and args.epochs_grid == (1, 2, 4, 8, 16, 32)
    a = runs["bsp-iid-e8-s1"].spec.argv
    # BSP at K x eta = 5 x 0.002, batch 100/K, lr / 10 at 4 and 6 of 8 epochs, one evaluation per epoch (60000 / 100)
    assert flag(a, "--lr") == "0.01" and flag(a, "--batch-size") == "20" and flag(a, "--epochs") == "8"
    assert flag(a, "--lr-milestones") == "4,6" and flag(a, "--eval-every") == "600" and flag(a, "--seed") == "1"
    assert flag(a, "--partition") == "iid" and flag(a, "--model") == "lenet" and flag(a, "--norm") == "none"
    assert flag(a, "--param-mults") == "prototxt"
    assert runs["bsp-iid-e8-s1"].spec.nproc == 5
    args = plateau.parse(["--out", str(tmp_path / "q"), "--model", "resnet20", "--nproc", "2"])
    a = plateau.plan(args)[0].spec.argv
    assert flag(a, "--norm") == "batch" and flag(a, "--lr") == "0.01" and flag(a, "--batch-size") == "50"


@pytest.mark.parametrize("argv, message", [
    (["--", "--lr", "0.1"], "--lr are set by the study"),
    (["--epochs-grid", "4,2"], "increasing epochs"),
    (["--min-gain", "-1"], "--min-gain must be >= 0"),
    (["--processes", "9"], "--processes must be in 1..--nproc"),
])
def test_bad_arguments(tmp_path, capsys, argv, message):
    cut = argv.index("--") if "--" in argv else len(argv)
    try:
        rc = plateau.main([*argv[:cut], "--out", str(tmp_path / "o"), *argv[cut:]], launcher=no_launch)
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2 and message in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_report_from_reused_runs(tmp_path, capsys):
    out = tmp_path / "p"
    argv = ["--budget", "quick", "--epochs-grid", "1,2,4", "--seeds", "0,1", "--out", str(out)]
    args = plateau.parse(argv)
    acc = {(1, 0): (0.60, 0.62), (1, 1): (0.64, 0.66), (2, 0): (0.80, 0.84), (2, 1): (0.82, 0.86),
           (4, 0): (0.803, 0.845), (4, 1): (0.821, 0.862)}  # (validation, training) per (E, seed)
    for r in plateau.plan(args):
        r.spec.out.mkdir(parents=True)
        (r.spec.out / "launch.json").write_text(json.dumps(runner.launch_record(r.spec)))
        val, train = acc[(r.epochs, r.seed)]
        (r.spec.out / "summary.json").write_text(json.dumps({
            "final_val_accuracy": val, "per_rank_val_accuracy": [val - 0.01, val + 0.01],
            "per_rank_train_accuracy": [train, train], "steps": 10 * r.epochs, "epochs": r.epochs, "wall_seconds": 1.0}))
    assert plateau.main(argv, launcher=no_launch) == 0
    rep = json.loads((out / "plateau.json").read_text())
    # E=1: 62 +- 2.83 / 64; E=2: 81 +- 1.41 / 85 (gains +19 / +21); E=4: 81.2 / 85.35 (gains +0.2 / +0.35)
    assert rep["plateau_epochs"] == 2
    b2 = rep["budgets"][1]
    assert b2["val_accuracy"] == pytest.approx(0.81) and b2["val_sd"] == pytest.approx(0.01 * 2 ** 0.5)
    assert b2["val_gain_pp"] == pytest.approx(0.2) and b2["train_gain_pp"] == pytest.approx(0.35)
    md = (out / "plateau.md").read_text()
    assert "**Plateau budget: 2 epochs**" in md
    assert "| 2 | 81.00 +- 1.41% | +0.20 pp | 85.00 +- 1.41% | +0.35 pp | 0,1 |" in md
    assert (out / "plateau.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.count("] reused ") == 6
