"""The Hsu et al. 2019 / 2020 studies (geodml.study.hsu): plans and flags worked out from the papers, reports from
fake finished runs, bad arguments. No process is started: finished runs are faked as run directories."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from geodml.cores import usable_cores
from geodml.study import STUDIES, hsu, runner
from geodml.study.__main__ import main as study_main
from tests.support.procs import DoneProc


def no_launch(spec, stdout, stderr):
    raise AssertionError(f"launched {spec.run_id}")


def flag(argv, name):
    """The last value of a flag (argparse semantics)."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == name][-1]


def fake_run(out: Path, spec: runner.RunSpec, accuracy: float | None, curve: list[tuple[int, float]] = ()) -> None:
    """A finished run directory as the runner leaves it: launch.json, summary.json, metrics.jsonl, model files."""
    d = out / spec.run_id
    d.mkdir(parents=True, exist_ok=True)
    (d / "launch.json").write_text(json.dumps(runner.launch_record(spec)))
    if accuracy is not None:
        (d / "summary.json").write_text(json.dumps({"final_val_accuracy": accuracy, "final_val_loss": 1.0,
                                                    "wall_seconds": 3.0, "algo": "fedavg"}))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "val_accuracy": a, "wan_bytes_total": 0}) + "\n"
                                             for s, a in curve))


# ---- hsu2019: the plan ---------------------------------------------------------------------------------------

def plan19(argv, tmp_path):
    args = hsu.parse_2019([*argv, "--out", str(tmp_path / "s")])
    return args, {r.run_id: r for r in hsu.plan_2019_tuning(args)}


def test_hsu2019_full_plan_counts_and_the_papers_grids(tmp_path):
    args, runs = plan19([], tmp_path)
    assert args.alphas == (100, 10, 1, 0.5, 0.2, 0.1, 0.05, 0)                  # Hsu 2020 App. B.1, CIFAR-10
    assert args.fractions == (0.05, 0.1, 0.2, 0.4) and args.betas == (0.7, 0.9, 0.97, 0.99, 0.997)
    assert args.seeds == (0, 1, 2) and args.rounds == 100 and args.lrs == (0.03, 0.1, 0.3)
    # tuning at seed 0: FedAvg 8 alphas x 4 C x 3 eta_eff = 96; FedAvgM 8 alphas x C=0.05 x 5 betas x 3 eta_eff = 120
    assert len(runs) == 96 + 120 and all(r.seed == 0 for r in runs.values())
    grids = hsu.cells_2019(args)
    assert len(grids) == 8 * 4 + 8  # 40 cells; each then runs at seeds 1 and 2: 80 more runs, 296 in all
    assert len(hsu.plan_2019_confirm(args, {k: g[0] for k, g in grids.items()})) == 80
    # the quick budget: 2 alphas x (FedAvg 2 C x 2 lrs + FedAvgM 1 C x 1 beta x 2 lrs) at seed 0, nothing to confirm
    qargs, quick = plan19(["--budget", "quick"], tmp_path)
    assert len(quick) == 12 and qargs.dataset == "digits" and qargs.seeds == (0,)


def test_hsu2019_flags_by_hand(tmp_path):
    _, runs = plan19([], tmp_path)
    a = runs["fedavg-lr0.1-a0.1-c0.05-s0"].spec.argv
    # E = 1 on 500 examples with B = 64: ceil(500 / 64) = 8 local steps; 100 rounds = 800 steps, evaluated every 10 rounds
    assert math.ceil(500 / 64) == 8 == int(flag(a, "--iter-local")) and flag(a, "--batch-size") == "64"
    assert flag(a, "--steps") == "800" and flag(a, "--eval-every") == "80" and flag(a, "--log-every") == "8"
    assert flag(a, "--partition") == "dirichlet" and flag(a, "--alpha") == "0.1" and flag(a, "--client-size") == "500"
    assert flag(a, "--client-fraction") == "0.05" and hsu.num_selected(0.05, 100) == 5 and hsu.num_selected(0.4, 100) == 40
    assert flag(a, "--lr") == "0.1" and flag(a, "--momentum") == "0" and flag(a, "--weight-decay") == "0.004"
    assert flag(a, "--model") == "cifar-cnn" and flag(a, "--dataset") == "fashion-mnist" and flag(a, "--seed") == "0"
    assert "--server-momentum" not in a and "--server-nesterov" not in a and "--local-epochs" not in a
    # FedAvgM at a fixed effective rate: eta = eta_eff (1 - beta), server lr 1, Nesterov (Section 4.2, Figure 6)
    expected = {0.7: "0.03", 0.9: "0.01", 0.97: "0.003", 0.99: "0.001", 0.997: "0.0003"}
    for beta, lr in expected.items():
        m = runs[f"fedavgm-b{beta}-lr0.1-a0.1-c0.05-s0"].spec.argv
        assert flag(m, "--lr") == lr and flag(m, "--server-momentum") == str(beta)
        assert flag(m, "--server-lr") == "1" and "--server-nesterov" in m and flag(m, "--client-fraction") == "0.05"
    assert flag(runs["fedavgm-b0.997-lr0.03-a0-c0.05-s0"].spec.argv, "--lr") == "9e-05"
    assert hsu.eta_for(0.3, 0.997) == 0.0009 and hsu.eta_for(0.3, 0.0) == 0.3
    # FedAvgM runs only at the momentum report goal; FedAvg at every one
    assert "fedavgm-b0.9-lr0.1-a0.1-c0.4-s0" not in runs and "fedavg-lr0.3-a0.1-c0.4-s0" in runs


def test_hsu2019_momentum_fraction_brings_its_fedavg_cell(tmp_path):
    args, runs = plan19(["--fractions", "0.4", "--momentum-fractions", "0.1", "--alphas", "1", "--betas", "0.9",
                         "--lrs", "0.1"], tmp_path)
    assert sorted(runs) == ["fedavg-lr0.1-a1-c0.1-s0", "fedavg-lr0.1-a1-c0.4-s0", "fedavgm-b0.9-lr0.1-a1-c0.1-s0"]


# ---- hsu2019: the report from fake finished runs -------------------------------------------------------------

ARGV19 = ["--budget", "quick", "--alphas", "100,0", "--fractions", "0.05", "--momentum-fractions", "0.05", "--betas",
          "0.9", "--lrs", "0.05,0.2", "--seeds", "0,1"]
TUNING = {"fedavg-lr0.05-a100-c0.05-s0": 0.80, "fedavg-lr0.2-a100-c0.05-s0": 0.90,           # best: lr 0.2
          "fedavg-lr0.05-a0-c0.05-s0": 0.30, "fedavg-lr0.2-a0-c0.05-s0": 0.20,               # best: lr 0.05
          "fedavgm-b0.9-lr0.05-a100-c0.05-s0": 0.91, "fedavgm-b0.9-lr0.2-a100-c0.05-s0": 0.85,
          "fedavgm-b0.9-lr0.05-a0-c0.05-s0": 0.60, "fedavgm-b0.9-lr0.2-a0-c0.05-s0": 0.70}
CONFIRM = {"fedavg-lr0.2-a100-c0.05-s1": 0.92, "fedavg-lr0.05-a0-c0.05-s1": 0.34,
           "fedavgm-b0.9-lr0.05-a100-c0.05-s1": 0.89, "fedavgm-b0.9-lr0.2-a0-c0.05-s1": 0.74}


def test_hsu2019_report_from_reused_runs(tmp_path, capsys):
    out = tmp_path / "s"
    args = hsu.parse_2019([*ARGV19, "--out", str(out)])
    tuning = {r.run_id: r for r in hsu.plan_2019_tuning(args)}
    assert sorted(tuning) == sorted(TUNING)
    for rid, acc in TUNING.items():
        fake_run(out, tuning[rid].spec, acc)
    chosen = {("fedavg", 100.0, 0.05): (0.0, 0.2), ("fedavg", 0.0, 0.05): (0.0, 0.05),
              ("fedavgm", 100.0, 0.05): (0.9, 0.05), ("fedavgm", 0.0, 0.05): (0.9, 0.2)}
    for r in hsu.plan_2019_confirm(args, chosen):
        fake_run(out, r.spec, CONFIRM[r.run_id])
    # every run exists: the tuning choice must land on exactly the confirmation runs written above, or it launches
    assert hsu.hsu2019([*ARGV19, "--out", str(out)], launcher=no_launch) == 0
    printed = capsys.readouterr().out
    assert printed.count("] reused ") == 12
    md = (out / "hsu2019.md").read_text()
    # seed 0 chose the rate, seed 1 confirmed it: alpha 100 FedAvg 0.90, 0.92 -> 91.0 +- 1.4; alpha 0 0.30, 0.34 -> 32.0 +- 2.8
    assert "| 0.05 | 91.0 ± 1.4 [lr 0.2 (edge)] | 32.0 ± 2.8 [lr 0.05 (edge)] |" in md
    # Figure 5: FedAvgM alpha 0: 0.70, 0.74 -> 72.0; gain paired per seed 0.70 - 0.30, 0.74 - 0.34 = +40.0 ± 0.0 pp;
    # the paper's text numbers beside. alpha 100: 0.91 - 0.90, 0.89 - 0.92 = +1, -3 -> -1.0 ± 2.8 pp (sd of the pairs,
    # not of the cells: both cells' sds are 1.4)
    assert ("| 0 | 32.0 ± 2.8 [lr 0.05 (edge)] | 72.0 ± 2.8 [β 0.9, η_eff 0.2 (edge)] | +40.0 ± 0.0 pp (2 seeds) | "
            "≈35 (§4.2); 30.1 (abstract, 'most skewed') | >75 (§4.2); 76.9 (abstract, 'most skewed') |") in md
    assert ("| 100 | 91.0 ± 1.4 [lr 0.2 (edge)] | 90.0 ± 1.4 [β 0.9, η_eff 0.05 (edge)] | -1.0 ± 2.8 pp (2 seeds) "
            "|  |  |") in md
    # Figure 6's grid at the tuning seed, the chosen point marked
    assert "| 0.9 | 60.0 | 70.0 ◀ |" in md and "| 0.9 | 91.0 ◀ | 85.0 |" in md
    # claims: 91 -> 32 (-59.0 pp); FedAvgM recovers 40 / 59 = 68% of FedAvg's loss; margins 10.0 pp (0.90 - 0.80)
    assert "C=0.05: alpha 100 -> 0: 91.0% -> 32.0% (-59.0 pp); accuracy falls at 1 of 1 steps towards smaller alpha" in md
    assert ("C=0.05, alpha=0: FedAvg 32.0 ± 2.8% -> FedAvgM 72.0 ± 2.8%: +40.0 ± 0.0 pp (2 seeds); recovers 68% "
            "of FedAvg's loss to alpha=100") in md
    assert "FedAvg C=0.05: 2 distinct best settings over 2 alphas: alpha 100: lr 0.2 (edge), margin 10.0 pp" in md
    assert "alpha 0: β 0.9/η_eff 0.2 (edge), margin 10.0 pp" in md
    with open(out / "hsu2019.csv") as f:
        table = {r["run_id"]: r for r in csv.DictReader(f)}
    assert len(table) == 12 and float(table["fedavgm-b0.9-lr0.2-a0-c0.05-s1"]["lr"]) == pytest.approx(0.02)
    assert table["fedavg-lr0.05-a0-c0.05-s1"]["status"] == "reused" and table["fedavg-lr0.05-a0-c0.05-s1"]["seed"] == "1"
    rep = json.loads((out / "hsu2019.json").read_text())
    cell = next(c for c in rep["cells"] if c["algo"] == "fedavgm" and c["alpha"] == 0)
    assert cell["beta"] == 0.9 and cell["eta_eff"] == 0.2 and cell["accuracies"] == [0.70, 0.74]
    for png in ("fig2_fedavg.png", "fig5_fedavgm.png", "fig6_sensitivity.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hsu2019_tuning_skips_failed_settings(tmp_path):
    args = hsu.parse_2019([*ARGV19, "--seeds", "0", "--out", str(tmp_path / "s")])
    bad = "fedavg-lr0.2-a100-c0.05-s0"
    outs = [hsu.Outcome(r, "failed" if r.run_id == bad else "ok", accuracy=None if r.run_id == bad else TUNING[r.run_id])
            for r in hsu.plan_2019_tuning(args)]
    chosen = hsu.choose_2019(args, outs)
    assert chosen[("fedavg", 100.0, 0.05)] == (0.0, 0.05)  # the failed 0.90 is not chosen; 0.80 is the best left
    assert chosen[("fedavgm", 0.0, 0.05)] == (0.9, 0.2) and hsu.plan_2019_confirm(args, chosen) == []  # one seed: done
    outs = [hsu.Outcome(o.run, "failed") if o.run.algo == "fedavgm" and o.run.alpha == 0 else o for o in outs]
    assert ("fedavgm", 0.0, 0.05) not in hsu.choose_2019(args, outs)  # no setting ran: the cell is reported FAILED
    cells = hsu.cell_results(args, outs, hsu.choose_2019(args, outs))
    assert hsu._cell_text(cells[("fedavgm", 0.0, 0.05)]) == "FAILED"


def test_hsu2019_edge_flag_for_rates_and_betas(tmp_path):
    args = hsu.parse_2019(["--budget", "quick", "--alphas", "1", "--fractions", "0.1", "--momentum-fractions", "0.1",
                           "--betas", "0.7,0.9,0.99", "--lrs", "0.03,0.1,0.3", "--out", str(tmp_path / "s")])
    outs = [hsu.Outcome(r, "ok", accuracy=0.5) for r in hsu.plan_2019_tuning(args)]
    for chosen, edge in ((((0.0, 0.1)), False), ((0.0, 0.3), True)):
        assert hsu.cell_results(args, outs, {("fedavg", 1.0, 0.1): chosen})[("fedavg", 1.0, 0.1)].edge is edge
    for chosen, edge in (((0.9, 0.1), False), ((0.7, 0.1), True), ((0.99, 0.1), True), ((0.9, 0.03), True)):
        assert hsu.cell_results(args, outs, {("fedavgm", 1.0, 0.1): chosen})[("fedavgm", 1.0, 0.1)].edge is edge
    # equal accuracies everywhere: the first grid point wins
    assert hsu.choose_2019(args, outs)[("fedavgm", 1.0, 0.1)] == (0.7, 0.03)


# ---- hsu2020: the plan ---------------------------------------------------------------------------------------

def test_hsu2020_vc_budgets_are_table2_scaled():
    vc = hsu.VCBudget(rounds=200, curve_points=10)
    assert vc.table_rounds == (40, 100, 200) and vc.table_batches == (400, 1000, 2000)   # 1k/2.5k/5k, 10k/25k/50k / 25
    assert vc.curve_rounds == (20, 40, 60, 80, 100, 120, 140, 160, 180, 200)


def test_hsu2020_round_lengths_from_geodmls_fedavg():
    # every client selected: sizes 10, 20, 33, 64 at B = 16 take 1, 2, 3, 4 steps; each round lasts 4, costs 10 steps
    rs = hsu.e1_rounds(np.array([10, 20, 33, 64]), 4, 0, 16, until_rounds=3, until_steps=10)
    assert rs.ends[:4] == (0, 4, 8, 12) and rs.work[:4] == (0, 10, 20, 30) and rs.rounds_within(11) == 2
    # one client per round, drawn as geodml/algorithms/fedavg.py documents: default_rng([seed, t, 0xFEDA])
    sizes = np.array([16, 160, 32, 48, 64])  # 1, 10, 2, 3, 4 steps
    rs = hsu.e1_rounds(sizes, 1, 7, 16, until_rounds=20, until_steps=0)
    steps = [math.ceil(sizes[int(np.random.default_rng([7, t, 0xFEDA]).choice(5, size=1, replace=False)[0])] / 16)
             for t in range(20)]
    assert list(rs.ends[:21]) == list(np.cumsum([0, *steps]))


def test_hsu2020_plan_counts_and_flags(tmp_path):
    args = hsu.parse_2020(["--out", str(tmp_path / "s")])
    # a hand-made population: every client 640 examples -> 10 steps a round, S(r) = 10 r, so batches 400/1000/2000
    # fall at rounds 40/100/200, already round budgets: 10 budgets, one E = 1 run per algorithm and seed
    sizes = {s: np.full(100, 640) for s in (0, 1, 2)}
    runs = {r.run_id: r for r in hsu.plan_2020(args, sizes)}
    fedir = [r for r in runs.values() if r.part == "fedir"]
    assert len(fedir) == 4 * 2 * 2 * 3   # alphas 100, 1, 0.2, 0.05 x FedAvg/FedAvgM x FedIR off/on x 3 seeds
    assert len([r for r in runs.values() if r.part == "fedvc"]) == 2 * 3
    assert len([r for r in runs.values() if r.part == "e1"]) == 2 * 3
    ir = runs["ir-fedavgm-fedir-a0.05-s2"].spec.argv
    assert "--fedir" in ir and flag(ir, "--lr") == "0.01" and flag(ir, "--server-momentum") == "0.9"
    assert flag(ir, "--server-lr") == "1" and "--server-nesterov" not in ir and flag(ir, "--client-fraction") == "0.1"
    assert flag(ir, "--iter-local") == "8" and flag(ir, "--steps") == "800" and flag(ir, "--client-size") == "500"
    assert "--fedir" not in runs["ir-fedavg-a0.05-s2"].spec.argv
    vc = runs["vc-fedavgm-fedvc-s1"].spec.argv
    assert flag(vc, "--virtual-client-size") == "256" and "--local-epochs" not in vc and "--iter-local" not in vc
    assert flag(vc, "--size-zipf") == "1" and flag(vc, "--client-size") == "3000" and flag(vc, "--alpha") == "1"
    # FedVC rounds are ceil(256 / 64) = 4 steps: 2000 batches; evaluated every gcd(80, 160, ..., 1000, 2000) = 40 steps
    assert flag(vc, "--steps") == "2000" and flag(vc, "--eval-every") == "40"
    e1 = runs["vc-fedavg-e1-s0"]
    assert flag(e1.spec.argv, "--local-epochs") == "1" and "--virtual-client-size" not in e1.spec.argv
    # 200 rounds of 10 steps, evaluated at the end and after rounds 20, 40, ..., 180
    assert e1.rounds == 200 and flag(e1.spec.argv, "--steps") == "2000" == flag(e1.spec.argv, "--eval-every")
    assert flag(e1.spec.argv, "--eval-at") == "200,400,600,800,1000,1200,1400,1600,1800"
    assert e1.budget_steps == tuple((r, 10 * r) for r in range(20, 201, 20))
    assert e1.client_steps == 10 * 10 * 200  # 10 participants x 10 steps per round


def test_hsu2020_quick_population_and_dry_run(tmp_path, capsys):
    """The quick population from digits, as a run computes it: Zipf sizes floor(200 / r), r = 1..20."""
    args = hsu.parse_2020(["--budget", "quick", "--out", str(tmp_path / "s")])
    sizes = sorted(hsu.population_sizes(args, 0).tolist(), reverse=True)
    assert sizes == [200, 100, 66, 50, 40, 33, 28, 25, 22, 20, 18, 16, 15, 14, 13, 12, 11, 11, 10, 10] and sum(sizes) == 714
    assert hsu.hsu2020(["--budget", "quick", "--dry-run", "--out", str(tmp_path / "s")], launcher=no_launch) == 0
    printed = capsys.readouterr().out
    assert "20 clients, 714 examples, sizes 200 (largest) / 19 (median) / 10 (smallest)" in printed
    assert "vc-fedavgm-fedvc-s0: --algo fedavg" in printed and not (tmp_path / "s").exists()


# ---- hsu2020: the report from fake finished runs -------------------------------------------------------------

ARGV20 = ["--budget", "quick", "--seeds", "0,1", "--algos", "fedavg"]
IR = {"ir-fedavg-a1-s0": 0.80, "ir-fedavg-fedir-a1-s0": 0.81, "ir-fedavg-a0.1-s0": 0.50, "ir-fedavg-fedir-a0.1-s0": 0.56,
      "ir-fedavg-a1-s1": 0.82, "ir-fedavg-fedir-a1-s1": 0.82, "ir-fedavg-a0.1-s1": 0.52, "ir-fedavg-fedir-a0.1-s1": 0.60}
E1 = {0: {2: 0.40, 5: 0.60, 10: 0.50, 25: 0.70, 50: 0.65}, 1: {2: 0.42, 5: 0.58, 10: 0.54, 25: 0.72, 50: 0.69}}


def test_hsu2020_report_from_reused_runs(tmp_path, capsys):
    out = tmp_path / "s"
    argv = [*ARGV20, "--out", str(out)]
    args = hsu.parse_2020(argv)
    sizes = {0: np.full(20, 32), 1: np.full(20, 32)}   # 2 steps of B = 16 per round: S(r) = 2 r
    runs = hsu.plan_2020(args, sizes)
    # quick: rounds 2/5/10, batches 20/50/100 -> E = 1 rounds 10, 25, 50; curve points rounds 5, 10
    e1 = [r for r in runs if r.part == "e1" and r.seed == 0]
    assert len(e1) == 1 and e1[0].budget_steps == ((2, 4), (5, 10), (10, 20), (25, 50), (50, 100))
    for r in runs:
        if r.part == "fedir":
            fake_run(out, r.spec, IR[r.run_id])
        elif r.part == "e1":
            assert r.steps == 100 and flag(r.spec.argv, "--eval-at") == "4,10,20,50"
            fake_run(out, r.spec, E1[r.seed][50], [(2 * k, a) for k, a in E1[r.seed].items()])
        else:   # FedVC: N_VC 64 / B 16 = 4 steps a round, 100 steps, evaluated every 4: accuracy 0.5 + step/400 (+0.02)
            assert r.steps == 100 and r.eval_every == 4
            fake_run(out, r.spec, 0.75, [(s, 0.5 + s / 400 + 0.02 * r.seed) for s in range(4, 101, 4)])
    assert hsu.hsu2020(argv, launcher=no_launch, sizes=sizes) == 0
    assert capsys.readouterr().out.count("] reused ") == 8 + 2 + 2
    md = (out / "hsu2020.md").read_text()
    # FedIR: alpha 1: 80/82 -> 81/82, gains 1 and 0 pp; alpha 0.1: 50/52 -> 56/60, gains 6 and 8 pp
    assert "| 1 | 81.0 ± 1.4 | 81.5 ± 0.7 | +0.5 ± 0.7 pp |" in md
    assert "| 0.1 | 51.0 ± 1.4 | 58.0 ± 2.8 | +7.0 ± 1.4 pp |" in md
    assert "FedAvg: alpha 1: +0.5 ± 0.7 pp; alpha 0.1: +7.0 ± 1.4 pp; most skewed minus least skewed gain: +6.5 pp" in md
    assert "| Landmarks-User-160k, all layers (Table 4) | FedAvg | 49.7 | 51.7 | +2.0 pp |" in md
    # Table 2: without FedVC, Acc@Batch 20 = the 10-round run (20 steps), 50 -> 25 rounds, 100 -> 50 rounds;
    # drawdown between rounds 5 and 10: 0.10 and 0.04 -> 7.0 +- 4.2
    assert "| FedAvg | ✗ | 41.0 ± 1.4 | 59.0 ± 1.4 | 52.0 ± 2.8 | 52.0 ± 2.8 | 71.0 ± 1.4 | 67.0 ± 2.8 | 7.0 ± 4.2 |" in md
    # with FedVC, rounds r at step 4r, batches b at step 4 floor(b / 4): 8, 20, 40 | 20, 48, 100; never falls
    assert "| FedAvg | ✓ | 53.0 ± 1.4 | 56.0 ± 1.4 | 61.0 ± 1.4 | 56.0 ± 1.4 | 63.0 ± 1.4 | 76.0 ± 1.4 | 0.0 ± 0.0 |" in md
    # paired per seed: round 2: 52 - 40 and 54 - 42; batch 100 (round 50 without): 75 - 65 and 77 - 69
    assert "round 2: 41.0 ± 1.4 -> 53.0 ± 1.4 (paired +12.0 ± 0.0 pp, higher in 2 of 2 seeds)" in md
    assert "batch 100: 67.0 ± 2.8 -> 76.0 ± 1.4 (paired +9.0 ± 1.4 pp, higher in 2 of 2 seeds)" in md
    assert "FedAvg: without FedVC 7.0 ± 4.2 pp, with FedVC 0.0 ± 0.0 pp; lower with FedVC in 2 of 2 seeds" in md
    assert "| iNaturalist-Geo-3k | FedAvgM | ✓ | 49.7 | 54.8 | 56.7 | 54.8 | 56.7 | 57.1 |" in md
    assert "20 clients, 640 examples, sizes 32 (largest) / 32 (median) / 32 (smallest), E = 1 local steps 2 / 2 / 2" in md
    with open(out / "hsu2020.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 12 and {r["part"] for r in table} == {"fedir", "fedvc", "e1"}
    rep = json.loads((out / "hsu2020.json").read_text())
    assert next(x for x in rep["fedir"] if x["alpha"] == 0.1)["gains"] == pytest.approx([0.06, 0.08])
    assert next(x for x in rep["fedvc_gains"] if x["budget"] == "batch 100")["gains"] == pytest.approx([0.10, 0.08])
    for png in ("fedir_gain.png", "fedvc_curves.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_drawdown_by_hand():
    assert hsu.drawdown([0.5, 0.7, 0.6, 0.65, 0.55]) == pytest.approx(0.1 + 0.1)
    assert hsu.drawdown([0.1, 0.2, 0.3]) == 0.0 and hsu.drawdown([0.4]) == 0.0


# ---- bad arguments: one error line, exit 2, nothing launched or written --------------------------------------

@pytest.mark.parametrize("study, argv, message", [
    ("hsu2019", ["--tune-seeds", "4"], "--tune-seeds must be in 1..3"),
    ("hsu2019", ["--betas", "0.9,1"], "--betas must be in (0, 1)"),
    ("hsu2019", ["--lrs", "0.1,-0.1"], "--lrs must be > 0"),
    ("hsu2019", ["--fractions", "0.001"], "--fractions 0.001 selects no client of 100"),
    ("hsu2019", ["--rounds", "0"], "--rounds must be >= 1"),
    ("hsu2019", ["--fedavg-only", "--betas", "0.9"], "--fedavg-only runs no FedAvgM cell"),
    ("hsu2019", ["--fedavg-only", "--momentum-fractions", "0.1"], "--fedavg-only runs no FedAvgM cell"),
    ("hsu2019", ["--final-rounds", "0"], "--final-rounds must be in 1..100 (the rounds of a run), got 0"),
    ("hsu2020", ["--rounds", "5", "--final-rounds", "6"], "--final-rounds must be in 1..5 (the rounds of a run), got 6"),
    ("hsu2019", ["--processes", "0"], "--processes must be in 1..100"),
    ("hsu2019", ["--budget", "medium"], "invalid choice: 'medium'"),
    ("hsu2019", ["--seeds", "0,0"], "distinct seeds"),
    ("hsu2019", ["--", "--lr", "0.1"], "--lr are set by the study"),
    ("hsu2019", ["--", "--no-such-flag"], "unrecognized arguments"),
    ("hsu2019", ["--", "--batch-size", "8"], "--batch-size are set by the study"),
    ("hsu2020", ["--vc-rounds", "15", "--curve-points", "5"], "--vc-rounds must be a multiple of 10"),
    ("hsu2020", ["--vc-rounds", "20", "--curve-points", "3"], "must be a positive multiple of --curve-points"),
    ("hsu2020", ["--parts", "fedprox"], "--parts must be fedir, fedvc or fedir,fedvc"),
    ("hsu2020", ["--algos", "fedprox"], "subset of fedavg,fedavgm"),
    ("hsu2020", ["--server-momentum", "1"], "--server-momentum must be in (0, 1)"),
    ("hsu2020", ["--budget", "quick", "--vc-size-max", "2000"], "lower --client-size"),   # more than digits has
    ("hsu2020", ["--", "--fedir"], "--fedir are set by the study"),
])
def test_bad_arguments_exit_2_before_launching(study, argv, message, tmp_path, capsys):
    cut = argv.index("--") if "--" in argv else len(argv)
    fn = hsu.hsu2019 if study == "hsu2019" else hsu.hsu2020
    assert fn([*argv[:cut], "--out", str(tmp_path / "o"), *argv[cut:]], launcher=no_launch) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"geodml.study {study}: error: ") and message in err
    assert not (tmp_path / "o").exists()


# ---- registry, help, the runner hook -------------------------------------------------------------------------

def test_registered_with_help(capsys):
    import geodml.study as study
    assert STUDIES["hsu2019"] == "geodml.study.hsu:hsu2019" and STUDIES["hsu2020"] == "geodml.study.hsu:hsu2020"
    assert "``hsu2019``" in study.__doc__ and "``hsu2020``" in study.__doc__
    for name, flags in (("hsu2019", ("--tune-seeds", "--momentum-fractions", "--lrs")),
                        ("hsu2020", ("--virtual-client-size", "--vc-zipf", "--fedir-alphas"))):
        with pytest.raises(SystemExit) as exc:
            study_main([name, "--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        assert all(f in text for f in ("--budget", "--seeds", "--jobs", "--processes", "--out", *flags))


def test_partition_models_pruned_as_runs_end(tmp_path):
    spec = runner.RunSpec("r", tmp_path / "r", ("--algo", "fedavg"), 2)

    def launch(s, stdout, stderr):
        for k in (0, 1):
            (s.out / f"rank{k}").mkdir()
            (s.out / f"rank{k}" / "model.pt").write_bytes(b"x")
            (s.out / f"rank{k}" / "startup.json").write_text("{}")
        (s.out / "model.pt").write_bytes(b"global")
        (s.out / "summary.json").write_text(json.dumps({"final_val_accuracy": 0.5}))
        return DoneProc()

    seen = []
    res = runner.run_all([spec], launcher=launch, log=lambda m: None, poll_s=0.0,
                         on_result=lambda r: (seen.append(r.status), hsu.prune_partition_models(r)))
    assert seen == ["ok"] and res[0].succeeded
    assert not list((tmp_path / "r").glob("rank*/model.pt")) and (tmp_path / "r" / "rank0" / "startup.json").exists()
    assert (tmp_path / "r" / "model.pt").read_bytes() == b"global"


def test_estimates_count_the_final_per_partition_evaluations(tmp_path):
    # every client in every round: all partitions hold the last global model -> one distinct model; none run -> the initial
    assert hsu.distinct_snapshots(4, 4, 3, 0) == 1 and hsu.distinct_snapshots(4, 1, 0, 0) == 1
    args = hsu.parse_2019(["--out", str(tmp_path / "s"), "--alphas", "1", "--fractions", "0.4", "--momentum-fractions",
                           "0.4", "--lrs", "0.1", "--betas", "0.9"])
    run = hsu.plan_2019_tuning(args)[0]
    assert run.client_steps == 800 * 40  # 100 rounds x 8 steps x 40 participants
    d = hsu.distinct_snapshots(100, 40, 100, 0)
    # 10 periodic evaluations (every 80 of 800 steps, the last one the final) and 9 more after rounds 91-99 (the
    # final accuracy averages rounds 91-100) on 10,000 test images + d partition models on 500 of them
    # (--partition-eval-examples, in every run's flags), and every partition's model on its own 500 examples
    assert run.eval_images == (10 + 9) * 10_000 + d * 500 + 100 * 500
    flags = list(run.spec.argv)
    assert flags[flags.index("--partition-eval-examples") + 1] == "500"
    assert flag(flags, "--eval-at") == "728,736,744,752,760,768,776,784,792"
    assert run.final_steps == tuple(range(728, 801, 8))
    train, evals = hsu.core_seconds(args, [run])
    assert train == pytest.approx(32_000 * 0.13) and evals == pytest.approx(run.eval_images / 10_000 * 11.3)


def test_estimate_divides_by_the_cores_not_by_more_jobs_than_cores(tmp_path):
    """Each run is one single-threaded process: three jobs on two cores take the core-hours / 2, not / 3."""
    args = hsu.parse_2019(["--out", str(tmp_path / "s"), "--alphas", "1", "--fractions", "0.4", "--momentum-fractions",
                           "0.4", "--lrs", "0.1", "--betas", "0.9", "--jobs", "3"])
    runs = hsu.plan_2019_tuning(args)
    assert len(runs) == 2  # FedAvg and FedAvgM at lr 0.1, seed 0
    train, evals = hsu.core_seconds(args, runs)
    # by hand: 2 runs x 32,000 client steps x 0.13 s, and the evaluations of the test above for each run
    assert train == pytest.approx(2 * 32_000 * 0.13)
    total_h = (train + evals) / 3600
    assert f"~{total_h / 2:,.1f} h with --jobs 3 on this machine's 2 cores, if free" in hsu.estimate_text(args, runs, 2)
    assert f"~{total_h / 3:,.1f} h with --jobs 3 on 3 of this machine's 16 cores, if free" in hsu.estimate_text(args, runs, 16)
    one = hsu.parse_2019([*["--out", str(tmp_path / "t"), "--alphas", "1", "--lrs", "0.1"], "--jobs", "1"])
    assert "with --jobs 1 on 1 of this machine's 2 cores, if free" in hsu.estimate_text(one, hsu.plan_2019_tuning(one), 2)
    assert (f"{total_h / 2:,.1f}", f"{total_h / 3:,.1f}") == ("1.2", "0.8")  # the two differ as printed
    # without the argument: the cores this process may use (tests/test_cores.py)
    assert f"this machine's {usable_cores()} core" in hsu.estimate_text(args, runs)


def set_wall(out: Path, run_id: str, wall) -> None:
    path = out / run_id / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "wall_seconds": wall}))


def test_pace_scales_the_estimate_by_the_finished_runs_measured_time(tmp_path):
    args = hsu.parse_2019(["--out", str(tmp_path / "s"), "--alphas", "1", "--fractions", "0.05", "--momentum-fractions",
                           "0.4", "--lrs", "0.1", "--betas", "0.9", "--jobs", "2"])
    plan = {(r.algo, r.fraction): r for r in hsu.plan_2019_tuning(args)}
    small, big = plan[("fedavg", 0.05)], plan[("fedavgm", 0.4)]  # 8x the client steps
    assert (small.client_steps, big.client_steps) == (800 * 5, 800 * 40)
    assert hsu.pace_text(args, [small, big]) == ""  # nothing finished: no pace
    # each run's estimate, by hand (the test above): client steps at 0.13 s; 19 x 10,000 test images, and one 500-row
    # evaluation per distinct partition model and per partition, at 11.3 s per 10,000
    def est_s(run, m):
        return run.client_steps * 0.13 + (19 * 10_000 + hsu.distinct_snapshots(100, m, 100, 0) * 500 + 100 * 500) / 10_000 * 11.3
    fake_run(tmp_path / "s", small.spec, 0.5)
    for bad in ("3", float("inf"), True, 0):  # no usable run time: not counted as finished
        set_wall(tmp_path / "s", small.run_id, bad)
        assert hsu.pace_text(args, [small, big]) == ""
    set_wall(tmp_path / "s", small.run_id, 3 * est_s(small, 5))  # 3x slower than estimated
    left_h = 3 * est_s(big, 40) / 3600 / 2
    assert left_h > 8 * 3 * est_s(small, 5) / 3600 / 2 / 2  # the big run's own estimate, not the small one's
    assert hsu.pace_text(args, [small, big]) == (
        f"1 of these runs has finished in {args.out}, in {3 * est_s(small, 5) / 3600:.2f} h of run time (summed over "
        f"runs), 3.00x the estimate for it; at that pace the other 1 (to run, running elsewhere or failed) take "
        f"~{left_h:.1f} h with --jobs 2")


def test_pace_counts_the_runs_at_the_chosen_settings_once_tuning_is_done(tmp_path, capsys):
    """With the tuning runs finished, the confirmation runs are those at the settings the tuning chose (here FedAvg's
    second rate), not the first grid point the plan assumes before: the one already run counts as finished."""
    out = tmp_path / "s"
    argv = ["--budget", "quick", "--alphas", "1", "--fractions", "0.1", "--momentum-fractions", "0.1", "--lrs",
            "0.05,0.2", "--betas", "0.9", "--seeds", "0,1", "--tune-seeds", "1", "--out", str(out)]
    args = hsu.parse_2019(argv)
    tuning = hsu.plan_2019_tuning(args)
    best = {("fedavg", 0.2): 0.8, ("fedavgm", 0.05): 0.7}
    for r in tuning:
        acc = best.get((r.algo, r.eta_eff), 0.3)
        fake_run(out, r.spec, acc, [(s, acc) for s in r.final_steps])
    done = [runner.RunResult(r.spec, "reused", summary=runner.read_summary(r.spec.out), returncode=0) for r in tuning]
    chosen = hsu.choose_2019(args, hsu.outcomes(tuning, done))
    assert chosen == {("fedavg", 1.0, 0.1): (0.0, 0.2), ("fedavgm", 1.0, 0.1): (0.9, 0.05)}
    confirm = hsu.plan_2019_confirm(args, chosen)
    fedavg_s1 = next(r for r in confirm if r.algo == "fedavg")
    assert fedavg_s1.eta_eff == 0.2 and fedavg_s1.seed == 1
    fake_run(out, fedavg_s1.spec, 0.8)
    assert hsu.hsu2019([*argv, "--dry-run"], launcher=no_launch) == 0
    pace = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("pace: "))
    assert pace.startswith("pace: 5 of these runs have finished") and "the other 1 (to run" in pace


def test_final_accuracy_is_the_mean_of_the_last_rounds_evaluations(tmp_path):
    """--final-rounds 3 over 10 rounds of 4 steps (quick), evaluated every round (--eval-rounds 1): a run's
    accuracy is the mean of its evaluations after rounds 8, 9 and 10, by hand; the last one alone is kept beside
    it; a run whose metrics lack one of those evaluations is reported incomplete, not averaged over fewer."""
    args = hsu.parse_2019(["--budget", "quick", "--rounds", "10", "--eval-rounds", "1", "--final-rounds", "3",
                           "--alphas", "1", "--fractions", "0.1", "--momentum-fractions", "0.1", "--lrs", "0.1",
                           "--seeds", "0,1", "--tune-seeds", "2", "--out", str(tmp_path / "s")])
    a, b = [r for r in hsu.plan_2019_tuning(args) if r.algo == "fedavg"]
    assert a.final_steps == (32, 36, 40) and "--eval-at" not in a.spec.argv  # every round is evaluated anyway
    curve = [(4 * r, 0.5 + 0.01 * r) for r in range(1, 11)]
    fake_run(tmp_path / "s", a.spec, 0.60, curve)
    fake_run(tmp_path / "s", b.spec, 0.60, [c for c in curve if c[0] != 36])
    results = [runner.RunResult(r.spec, "reused", summary=json.loads((Path(r.spec.out) / "summary.json").read_text()))
               for r in (a, b)]
    oa, ob = hsu.outcomes([a, b], results)
    assert oa.accuracy == pytest.approx((0.58 + 0.59 + 0.60) / 3) and oa.last_round_accuracy == 0.60 and oa.status == "reused"
    assert ob.accuracy is None and ob.status == "incomplete" and "2 of the 3 evaluations" in (ob.error or "")
    quick = hsu.parse_2019(["--budget", "quick", "--out", str(tmp_path / "q")])
    full = hsu.parse_2020(["--parts", "fedir", "--out", str(tmp_path / "f")])
    assert quick.final_rounds == 1 and full.final_rounds == hsu.FULL_FINAL_ROUNDS == 10


def test_an_incomplete_run_is_reported_failed_and_not_chosen(tmp_path, capsys):
    """End to end from fake finished runs (quick: 4 steps a round, every round evaluated): with
    --final-rounds 2 the tuning run missing its round-2 evaluation is 'incomplete': the cell takes the
    other rate, the run is listed as failed in the report, and the study exits 1."""
    out = tmp_path / "s"
    argv = ["--budget", "quick", "--alphas", "1", "--fractions", "0.1", "--momentum-fractions", "0.1", "--betas", "0.9",
            "--lrs", "0.05,0.2", "--seeds", "0", "--final-rounds", "2", "--out", str(out)]
    args = hsu.parse_2019(argv)
    runs = hsu.plan_2019_tuning(args)
    assert {r.final_steps for r in runs} == {(8, 12)}
    for r in runs:
        # lr 0.2 would win on its last round (0.9 > 0.7), but its round 2 is missing
        acc = 0.9 if r.eta_eff == 0.2 else 0.7
        curve = [(4, 0.5), (8, 0.6), (12, acc)]
        fake_run(out, r.spec, acc, [c for c in curve if not (r.run_id == "fedavg-lr0.2-a1-c0.1-s0" and c[0] == 8)])
    assert hsu.hsu2019(argv, launcher=no_launch) == 1
    rep = json.loads((out / "hsu2019.json").read_text())
    assert rep["failed"] == ["fedavg-lr0.2-a1-c0.1-s0"] and rep["final_rounds"] == 2
    cell = next(c for c in rep["cells"] if c["algo"] == "fedavg")
    assert cell["eta_eff"] == 0.05 and cell["accuracies"] == [pytest.approx(0.65)]   # (0.6 + 0.7) / 2
    md = (out / "hsu2019.md").read_text()
    assert "Failed (excluded from every table): fedavg-lr0.2-a1-c0.1-s0: metrics.jsonl holds 1 of the 2" in md
    assert "1 run(s) failed: fedavg-lr0.2-a1-c0.1-s0" in capsys.readouterr().err


def test_hsu2020_one_e1_run_evaluated_at_round_ends_equals_a_run_stopped_there(tmp_path):
    """The E = 1 run replaces a run per budget (plan_fedvc): its evaluation at S(r) (--eval-at) scores the model
    a run of --steps S(r) ends with. Checked on the quick plan's real population (digits, 20 Zipf-sized clients,
    4 per round, rounds as long as their longest participant), in process, against a run stopped at the
    second budget; the longer run lasts the third."""
    from geodml.cli import main
    from geodml.report import load_run
    args = hsu.parse_2020(["--budget", "quick", "--parts", "fedvc", "--algos", "fedavg", "--out", str(tmp_path / "s")])
    e1 = next(r for r in hsu.plan_2020(args) if r.part == "e1")
    (r1, s1), (r2, s2), (_, s3) = e1.budget_steps[:3]
    assert s1 * r2 != s2 * r1   # rounds of unequal length: S(r) is not proportional to r
    cut = [*e1.spec.argv[:e1.spec.argv.index("--steps")], "--partitions", str(e1.spec.nproc), "--no-progress"]
    assert main([*cut, "--steps", str(s2), "--eval-every", str(s2), "--out", str(tmp_path / "short")]) == 0
    assert main([*cut, "--steps", str(s3), "--eval-every", str(s3), "--eval-at", f"{s1},{s2}",
                 "--out", str(tmp_path / "long")]) == 0
    short, long = load_run(tmp_path / "short").evals, load_run(tmp_path / "long").evals
    assert [int(e["step"]) for e in long] == [s1, s2, s3] and [int(e["step"]) for e in short] == [s2]
    assert (long[1]["val_accuracy"], long[1]["val_loss"]) == (short[0]["val_accuracy"], short[0]["val_loss"])
    assert long[1]["val_loss"] != long[2]["val_loss"]   # the model moved on after S(r2)


def test_hsu2019_claim_on_c_gains_worked_by_hand():
    """Claim 2 (diminishing returns in C, marginal for identical clients) from hand-made accuracies per seed.
    alpha 0, seeds 0 and 1: C 0.05 / 0.1 / 0.2 = 50, 52 / 60, 63 / 64, 66% -> steps +10, +11 (+10.5 ± 0.7 pp) and
    +4, +3 (+3.5 ± 0.7 pp): the second gains less (1 of 1). alpha 100: C 0.05 at seed 0 only (85%), 0.2 at seed 1
    only (86%): no common seed, the difference of the means, +1.0 pp over two doublings. Over C 0.05 -> 0.2: +1.0
    (alpha 100) vs +14, +14 = +14.0 ± 0.0 pp (alpha 0)."""
    accs = {("fedavg", 0.0, 0.05): {0: 0.50, 1: 0.52}, ("fedavg", 0.0, 0.1): {0: 0.60, 1: 0.63},
            ("fedavg", 0.0, 0.2): {0: 0.64, 1: 0.66}, ("fedavg", 100.0, 0.05): {0: 0.85}, ("fedavg", 100.0, 0.2): {1: 0.86}}
    lines = hsu._c_returns([100.0, 0.0], [0.05, 0.1, 0.2], accs.get)
    assert lines[1] == "   - alpha=100: gain per step up in C: 0.05 -> 0.2 +1.0 pp (means) = +0.5 pp per doubling"
    assert lines[2] == ("   - alpha=0: gain per step up in C: 0.05 -> 0.1 +10.5 ± 0.7 pp (2 seeds), 0.1 -> 0.2 +3.5 ± 0.7 pp "
                        "(2 seeds); per doubling of C, a step gains less than the one before in 1 of 1 pairs")
    assert lines[3] == ("   - C 0.05 -> 0.2: alpha=100 +1.0 pp (means) vs alpha=0 +14.0 ± 0.0 pp (2 seeds); "
                        "smaller for the more identical clients: yes")
    accs[("fedavg", 100.0, 0.2)] = {1: 1.0}                  # +15.0 pp at alpha 100: not marginal
    assert hsu._c_returns([100.0, 0.0], [0.05, 0.1, 0.2], accs.get)[3].endswith("smaller for the more identical clients: no")
    assert len(hsu._c_returns([0.0], [0.05], accs.get)) == 1  # nothing to compare: the heading only


def test_hsu2019_c_returns_compare_gains_per_doubling():
    """The report goal C grid need not double at every step (--fractions 0.05,0.2,0.4): C 0.05 -> 0.2 (two doublings)
    gains +8 pp = +4.0 per doubling, 0.2 -> 0.4 (one) +5 pp. The second step's gain is smaller in raw pp but larger
    per doubling, so it is not a diminishing return (0 of 1); one seed: no sd."""
    accs = {("fedavg", 0.0, 0.05): {0: 0.50}, ("fedavg", 0.0, 0.2): {0: 0.58}, ("fedavg", 0.0, 0.4): {0: 0.63}}
    line = hsu._c_returns([0.0], [0.05, 0.2, 0.4], accs.get)[1]
    assert line == ("   - alpha=0: gain per step up in C: 0.05 -> 0.2 +8.0 pp (1 seed) = +4.0 pp per doubling, "
                    "0.2 -> 0.4 +5.0 pp (1 seed); per doubling of C, a step gains less than the one before in 0 of 1 pairs")
    accs[("fedavg", 0.0, 0.4)] = {0: 0.61}                   # +3 pp < +4.0 per doubling: diminishing
    assert hsu._c_returns([0.0], [0.05, 0.2, 0.4], accs.get)[1].endswith("in 1 of 1 pairs")


def test_hsu2019_fedavg_lrs_give_fedavg_its_own_grid(tmp_path):
    argv = ["--budget", "quick", "--alphas", "0", "--fractions", "0.2", "--momentum-fractions", "0.2", "--betas", "0.97",
            "--seeds", "0,1", "--tune-seeds", "2", "--out", str(tmp_path / "s")]
    same = hsu.parse_2019([*argv, "--lrs", "1,3"])
    assert same.fedavg_lrs == same.lrs  # the default: one grid for both
    args = hsu.parse_2019([*argv, "--lrs", "1,3", "--fedavg-lrs", "0.1"])
    ids = sorted(r.run_id for r in hsu.plan_2019_tuning(args))
    assert ids == ["fedavg-lr0.1-a0-c0.2-s0", "fedavg-lr0.1-a0-c0.2-s1",  # 1 FedAvg rate + 2 FedAvgM rates, x 2 seeds
                   "fedavgm-b0.97-lr1-a0-c0.2-s0", "fedavgm-b0.97-lr1-a0-c0.2-s1",
                   "fedavgm-b0.97-lr3-a0-c0.2-s0", "fedavgm-b0.97-lr3-a0-c0.2-s1"]
    lrs = {r.run_id: r.lr for r in hsu.plan_2019_tuning(args)}
    assert lrs["fedavg-lr0.1-a0-c0.2-s0"] == 0.1 and abs(lrs["fedavgm-b0.97-lr3-a0-c0.2-s0"] - 0.09) < 1e-12  # 3 x (1 - 0.97)
    acc = {"fedavg-lr0.1": 0.60, "fedavgm-b0.97-lr1": 0.70, "fedavgm-b0.97-lr3": 0.65}
    outs = [hsu.Outcome(r, "ok", accuracy=acc[r.run_id.rsplit("-a0", 1)[0]]) for r in hsu.plan_2019_tuning(args)]
    chosen = hsu.choose_2019(args, outs)
    assert chosen == {("fedavg", 0.0, 0.2): (0.0, 0.1), ("fedavgm", 0.0, 0.2): (0.97, 1.0)}
    cells = hsu.cell_results(args, outs, chosen)
    assert cells[("fedavg", 0.0, 0.2)].edge is False  # a one-point grid of its own: no edge (as with --lrs alone) ...
    assert cells[("fedavg", 0.0, 0.2)].one_rate is True  # ... but marked as not tuned
    assert cells[("fedavgm", 0.0, 0.2)].edge is True  # 1 is the low end of FedAvgM's grid 1, 3
    assert cells[("fedavgm", 0.0, 0.2)].one_rate is False
    md = hsu.markdown_2019(args, cells, outs, [])
    assert "the eta_eff grid 1, 3 (FedAvg's: 0.1) (the paper" in md
    assert "| 0 | 60.0 ± 0.0 [lr 0.1 (one rate)] | 70.0 ± 0.0 [β 0.97, η_eff 1 (edge)] | +10.0 ± 0.0 pp (2 seeds) |" in md
    assert "(one rate): the cell ran one eta_eff, so its rate was not tuned." in md
    with pytest.raises(hsu.StudyError, match="--fedavg-lrs"):
        hsu.parse_2019([*argv, "--fedavg-lrs", "0,0.1"])


def test_hsu2019_fedavg_only_plans_and_reports_figure_2_alone(tmp_path, capsys):
    out = tmp_path / "s"
    argv = ["--budget", "quick", "--alphas", "1", "--fractions", "0.2", "--fedavg-only", "--lrs", "0.05,0.2", "--seeds",
            "0,1", "--tune-seeds", "2", "--out", str(out)]
    args = hsu.parse_2019(argv)
    assert args.momentum_fractions == () and args.betas == ()
    runs = {r.run_id: r for r in hsu.plan_2019_tuning(args)}
    # 1 alpha x 1 C x 2 rates x 2 seeds, FedAvg only (the default would add C = 0.1's FedAvg and FedAvgM cells)
    assert sorted(runs) == ["fedavg-lr0.05-a1-c0.2-s0", "fedavg-lr0.05-a1-c0.2-s1", "fedavg-lr0.2-a1-c0.2-s0",
                            "fedavg-lr0.2-a1-c0.2-s1"]
    for rid, acc in {"fedavg-lr0.05-a1-c0.2-s0": 0.70, "fedavg-lr0.05-a1-c0.2-s1": 0.74,
                     "fedavg-lr0.2-a1-c0.2-s0": 0.80, "fedavg-lr0.2-a1-c0.2-s1": 0.78}.items():
        fake_run(out, runs[rid].spec, acc)
    assert hsu.hsu2019(argv, launcher=no_launch) == 0
    assert capsys.readouterr().out.count("] reused ") == 4
    md = (out / "hsu2019.md").read_text()
    # lr 0.2: (0.80 + 0.78) / 2 = 79.0, sd |0.80 - 0.78| / sqrt(2) = 1.4; over 0.05's 72.0 by 7.0 pp
    assert "| 0.2 | 79.0 ± 1.4 [lr 0.2 (edge)] |" in md and "## Figure 5" not in md and "FedAvgM C=" not in md
    assert "   - not measured: --fedavg-only ran no FedAvgM cell" in md
    assert "FedAvg C=0.2: 1 distinct best settings over 1 alphas: alpha 1: lr 0.2 (edge), margin 7.0 pp" in md
    assert (out / "fig2_fedavg.png").exists() and not (out / "fig5_fedavgm.png").exists()
    assert not (out / "fig6_sensitivity.png").exists()


# ---- --only: a few runs of the plan, no report ----------------------------------------------------------------

def test_hsu2019_only_runs_the_named_runs_and_no_report(tmp_path, capsys):
    out = tmp_path / "s"
    argv = [*ARGV19, "--out", str(out)]
    launched = []

    def launch(spec, stdout, stderr):
        launched.append(spec.run_id)
        fake_run(out, spec, TUNING[spec.run_id])
        return DoneProc()

    picks = ["fedavgm-b0.9-lr0.2-a0-c0.05-s0", "fedavg-lr0.05-a100-c0.05-s0"]  # plan order: fedavg first
    assert hsu.hsu2019([*argv, "--only", ",".join(picks)], launcher=launch) == 0
    assert launched == picks[::-1]
    assert not (out / "hsu2019.md").exists() and not (out / "hsu2019.json").exists()
    assert "--only: 2 of the plan's 12 runs; no report written" in capsys.readouterr().out  # 8 tuning + 4 at seed 1
    # a dry run with --only lists the two, both finished now
    assert hsu.hsu2019([*argv, "--only", ",".join(picks), "--dry-run"], launcher=no_launch) == 0
    assert ("plan: 2 runs, 2 finished (reused), 0 running (another study process), 0 to resume from their checkpoints, "
            "0 to run") in capsys.readouterr().out
    # the other six tuning runs; then the whole command reuses all eight and runs only the four at seed 1
    rest = [rid for rid in TUNING if rid not in picks]
    assert hsu.hsu2019([*argv, "--only", ",".join(rest)], launcher=launch) == 0
    assert sorted(launched) == sorted(TUNING)

    def launch_confirm(spec, stdout, stderr):
        launched.append(spec.run_id)
        fake_run(out, spec, CONFIRM[spec.run_id])
        return DoneProc()

    # the tuning has finished, so the runs at the chosen settings have ids: --only takes one of them
    assert hsu.hsu2019([*argv, "--only", "fedavg-lr0.05-a0-c0.05-s1"], launcher=launch_confirm) == 0
    assert launched[-1] == "fedavg-lr0.05-a0-c0.05-s1" and len(launched) == 9
    capsys.readouterr()
    assert hsu.hsu2019(argv, launcher=launch_confirm) == 0
    assert sorted(launched[9:]) == sorted(set(CONFIRM) - {"fedavg-lr0.05-a0-c0.05-s1"})
    assert capsys.readouterr().out.count("] reused ") == 9 and (out / "hsu2019.md").exists()


def test_hsu2019_only_refuses_ids_not_in_the_plan_before_anything_runs(tmp_path, capsys):
    argv = [*ARGV19, "--out", str(tmp_path / "s")]
    assert hsu.hsu2019([*argv, "--only", "fedavg-lr0.05-a100-c0.05-s0,bogus"], launcher=no_launch) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("geodml.study hsu2019: error: --only: not in this plan: bogus (")
    # a run at the chosen settings has no id until every tuning run has finished
    assert hsu.hsu2019([*argv, "--only", "fedavg-lr0.05-a0-c0.05-s1"], launcher=no_launch) == 2
    assert ("not in this plan: fedavg-lr0.05-a0-c0.05-s1 (--dry-run lists its 8 run ids; the 4 runs at the chosen "
            "settings are planned once every tuning run has finished)") in capsys.readouterr().err
    for bad in ("a,a", ",", ""):
        assert hsu.hsu2019([*argv, "--only", bad], launcher=no_launch) == 2
        assert capsys.readouterr().err == (f"geodml.study hsu2019: error: argument --only: expected distinct "
                                           f"comma-separated run ids, as --dry-run lists them, got {bad!r}\n")
    assert not (tmp_path / "s").exists()


def test_hsu2020_only_runs_the_named_run(tmp_path, capsys):
    out = tmp_path / "s"
    argv = ["--budget", "quick", "--parts", "fedir", "--out", str(out)]
    runs = hsu.plan_2020(hsu.parse_2020(argv), {})
    launched = []

    def launch(spec, stdout, stderr):
        launched.append(spec.run_id)
        fake_run(out, spec, 0.5)
        return DoneProc()

    assert hsu.hsu2020([*argv, "--only", runs[-1].run_id], launcher=launch) == 0
    assert launched == [runs[-1].run_id] and not (out / "hsu2020.md").exists()
    assert f"--only: 1 of the plan's {len(runs)} runs; no report written" in capsys.readouterr().out
    assert hsu.hsu2020([*argv, "--only", "nope"], launcher=no_launch) == 2
    assert "geodml.study hsu2020: error: --only: not in this plan: nope" in capsys.readouterr().err
