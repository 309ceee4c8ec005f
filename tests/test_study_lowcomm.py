"""The lowcomm study (geodml.study.lowcomm, issue 67 item 8): its plan against the stated protocol, a report
from fake finished runs with every number worked out by hand, and bad arguments. No processes."""

from __future__ import annotations

import csv
import json

import pytest

from geodml.study import STUDIES, lowcomm, runner

PNG = b"\x89PNG\r\n\x1a\n"


def no_launch(spec, stdout, stderr):
    raise AssertionError(f"launched {spec.run_id}")


def flag(argv, name):
    return [argv[i + 1] for i, a in enumerate(argv) if a == name][-1]


def test_full_plan_is_the_stated_protocol(tmp_path):
    assert STUDIES["lowcomm"] == "geodml.study.lowcomm:main"
    args = lowcomm.parse(["--out", str(tmp_path)])
    runs = lowcomm.plan(args)
    by_id = {r.spec.run_id: r for r in runs}
    # every entry on its skews at 3 seeds, plus the sweep (2 more scales) for the paper settings at seed 0
    expected = sum(len(e.skews) * (3 + (2 if e.setting == "paper" else 0)) for e in lowcomm.ENTRIES)
    assert len(runs) == expected
    bsp = by_id["bsp-iid-s1"].spec
    assert bsp.nproc == 5 and flag(bsp.argv, "--topology") == "five-continents"
    assert flag(bsp.argv, "--epochs") == "4" and flag(bsp.argv, "--eval-every") == "100"
    assert flag(bsp.argv, "--compute-s-per-step") == "0.05" and flag(bsp.argv, "--lr") == "0.02"
    assert flag(bsp.argv, "--dataset") == "fashion-mnist" and flag(bsp.argv, "--model") == "cnn"
    assert flag(by_id["gaia-t0.1-label-s0"].spec.argv, "--lr") == "0.004"             # lr / K: it sums updates
    assert flag(by_id["gaia-t0.1-label-s0"].spec.argv, "--skew") == "1.0"
    dil = by_id["diloco-500-dir-s2"].spec
    assert dil.nproc == 100 and flag(dil.argv, "--topology") == "five-continents-cyclic"
    assert flag(dil.argv, "--lr") == "0.001" and flag(dil.argv, "--alpha") == "0.1"
    assert flag(dil.argv, "--client-fraction") == "0.1" and dil.argv.count("--lr") == 1
    assert flag(by_id["bsp-label-s0-wan0.1"].spec.argv, "--wan-scale") == "0.1"
    assert "bsp-label-s1-wan10" not in by_id and "fedavg-200-iid-s0-wan10" not in by_id   # seed 0, paper only
    assert [r.spec.run_id for r in runs if r.entry.key == "hierfavg"][:1] == ["hierfavg-dir-s0"]
    quick = lowcomm.plan(lowcomm.parse(["--budget", "quick", "--out", str(tmp_path / "q")]))
    assert all(r.scale == 1.0 and r.seed == 0 for r in quick)
    assert flag(quick[0].spec.argv, "--steps") == "40" and flag(quick[0].spec.argv, "--dataset") == "digits"
    assert {r.spec.nproc for r in quick if r.skew == "dir"} == {20}


ARGV = ["--entries", "bsp,diloco-500", "--seeds", "0,1", "--sweep-seeds", "0", "--no-dirichlet", "--no-plots"]

# per (entry, skew, seed): final accuracy and the validations (step, emulated s, accuracy) at wan scale 1
FAKE = {
    ("bsp", "iid", 0): (0.90, [(100, 10.0, 0.80), (200, 20.0, 0.90), (300, 30.0, 0.90)]),
    ("bsp", "iid", 1): (0.92, [(100, 12.0, 0.89), (200, 24.0, 0.91), (300, 36.0, 0.92)]),
    ("bsp", "label", 0): (0.90, [(100, 10.0, 0.70), (200, 20.0, 0.85), (300, 30.0, 0.90)]),
    ("bsp", "label", 1): (0.90, [(100, 10.0, 0.70), (200, 20.0, 0.85), (300, 30.0, 0.899)]),
    ("diloco-500", "iid", 0): (0.905, [(100, 1.0, 0.5), (200, 2.0, 0.905), (300, 3.0, 0.905)]),
    ("diloco-500", "iid", 1): (0.915, [(100, 1.0, 0.5), (200, 2.0, 0.8), (300, 3.0, 0.915)]),
    ("diloco-500", "label", 0): (0.50, [(300, 3.0, 0.50)]),
    ("diloco-500", "label", 1): (0.60, [(300, 3.0, 0.60)]),
}
BYTES = {"bsp": 5e9, "diloco-500": 1e7}


def write_run(spec, evals, summary):
    spec.out.mkdir(parents=True)
    (spec.out / "launch.json").write_text(json.dumps(runner.launch_record(spec)))
    (spec.out / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "emulated_s": t, "train_loss": 1.0, "val_accuracy": a}) + "\n" for s, t, a in evals)
        + json.dumps({"step": 350, "emulated_s": 99.0, "train_loss": 1.0}) + "\n")   # a log line without validation
    (spec.out / "summary.json").write_text(json.dumps(summary))


def test_report_by_hand(tmp_path, capsys):
    out = tmp_path / "s"
    args = lowcomm.parse([*ARGV, "--out", str(out)])
    runs = lowcomm.plan(args)
    assert len(runs) == 2 * 2 * 2 + 2 * 2 * 2       # bsp and diloco, 2 skews, 2 seeds, + 0.1 and 10 at seed 0
    for r in runs:
        final, evals = FAKE[(r.entry.key, r.skew, r.seed)]
        evals = [(s, t / r.scale, a) for s, t, a in evals]       # a 10x slower WAN: 10x the time (fake)
        write_run(r.spec, evals, {"final_val_accuracy": final, "wan_bytes_total": BYTES[r.entry.key],
                                  "emulated_seconds": evals[-1][1], "wan_peak_bps_by_link": {"a->b": 8e7, "b->a": 9e7}})
    assert lowcomm.main([*ARGV, "--out", str(out)], launcher=no_launch) == 0
    rep = json.loads((out / "lowcomm.json").read_text())
    # BSP-IID: (0.90 + 0.92) / 2 = 0.91; target 0.90
    assert rep["bsp_iid_accuracy"] == pytest.approx(0.91) and rep["target_accuracy"] == pytest.approx(0.90)
    cells = {(c["entry"], c["skew"]): c for c in rep["cells"]}
    b = cells[("bsp", "iid")]
    # first validation >= 0.90: seed 0 at 20 s, seed 1 at 24 s -> 22 s; sweep (seed 0): 200 s at 0.1x, 2 s at 10x
    assert b["tta_s"] == pytest.approx(22.0) and b["tta_reached"] == 2
    assert b["tta_s_wan0.1"] == pytest.approx(200.0) and b["tta_s_wan10"] == pytest.approx(2.0)
    assert b["peak_bps"] == 9e7 and b["wan_bytes"] == 5e9
    assert cells[("bsp", "label")]["tta_s"] == pytest.approx(30.0) and cells[("bsp", "label")]["tta_reached"] == 1
    d = cells[("diloco-500", "iid")]
    assert d["final_accuracy"] == pytest.approx(0.91) and d["tta_s"] == pytest.approx(2.5)   # (2 + 3) / 2
    claims = {c["claim"]: c for c in rep["claims"]}
    # IID: 0.91 vs 0.91, within max(1 pp, 2 SE): supported, 500x fewer bytes
    iid = claims["diloco-500: matches synchronous training (IID)"]
    assert iid["verdict"] == "supported" and "500x fewer WAN bytes" in iid["evidence"]
    # label skew: 0.55 +- 0.0707 vs 0.90 +- 0: SE = sqrt(0.005 / 2) = 0.05, gap -35 pp > 10 pp: not supported
    lab = claims["diloco-500: matches synchronous training (100% label skew)"]
    assert lab["verdict"] == "not supported" and "-35.0 pp, beyond" in lab["evidence"]
    rob = claims["diloco-500: robust to label skew"]
    assert rob["verdict"] == "not supported" and "(-36.0 pp)" in rob["evidence"]
    assert claims["diloco-100: robust to label skew"]["verdict"] == "no data"
    md = (out / "lowcomm.md").read_text()
    assert ("| BSP | paper: the baseline: gradients all-reduced every step | IID | 91.0 +- 1.4% | 5 GB | 90 Mbit/s | "
            "22 s | 200 s | 2 s |") in md
    assert "| BSP | paper: the baseline: gradients all-reduced every step | 100% label skew | 90.0 +- 0.0% | 5 GB | " \
           "90 Mbit/s | 30 s (1/2) |" in md
    assert "| diloco-500-label-s0 | reused | 0.5000 | 0.01 GB | never |" in md
    with open(out / "lowcomm_cells.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and float(rows[0]["tta_s"]) == pytest.approx(22.0)
    assert "reused" in capsys.readouterr().out


def test_plots_are_written(tmp_path):
    out = tmp_path / "s"
    argv = [a for a in ARGV if a != "--no-plots"]
    runs = lowcomm.plan(lowcomm.parse([*argv, "--out", str(out)]))
    for r in runs:
        final, evals = FAKE[(r.entry.key, r.skew, r.seed)]
        write_run(r.spec, evals, {"final_val_accuracy": final, "wan_bytes_total": BYTES[r.entry.key]})
    assert lowcomm.main([*argv, "--out", str(out)], launcher=no_launch) == 0
    for png in ("accuracy_vs_bytes.png", "time_vs_bandwidth.png"):
        assert (out / png).read_bytes()[:8] == PNG


@pytest.mark.parametrize(("argv", "message"), [
    (["--entries", "bsp,nope"], "--entries: unknown nope"),
    (["--rounds", "3"], "--rounds: every lowcomm run has the same budget in steps; use --epochs"),
    (["--epochs", "0"], "--epochs must be > 0, got 0.0"),
    (["--", "--lr", "0.1"], "flags after '--': --lr are set by the study"),
])
def test_bad_arguments_one_line_exit_2_nothing_launched(argv, message, tmp_path, capsys):
    assert lowcomm.main(["--out", str(tmp_path / "o"), *argv], launcher=no_launch) == 2
    err = capsys.readouterr().err
    assert err.startswith("geodml.study lowcomm: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
