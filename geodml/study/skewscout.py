"""Quagmire Figure 8: ``python -m geodml.study skewscout`` -- SkewScout against the Oracle and BSP per skew level.

The paper (§7.3, Figure 8): Gaia on CIFAR-10 at 20-100% non-IID; "Oracle: the ideal, yet
unrealistic, approach that selects the most communication-efficient theta that retains model
accuracy, by running all possible theta in each setting"; "all results achieve the same
validation accuracy as BSP" in the IID setting; SkewScout saves 9.6x (100%) to 34.1x (20%) over
BSP and needs 1.1-1.5x the Oracle's bytes. This study runs, for every seed of ``--seeds`` and
every level of ``--levels`` (full: 20/40/60/80/100%; quick: 20% and 100%), all in one study so
the Oracle and SkewScout share seeds, budget, network and target:

(a) BSP, IID: the target. Target = mean over the seeds of BSP-IID's final accuracy (every accuracy
    here is ``common.run_accuracy``, the partitions' own models' mean, as the released code reports); a run or
    an aggregate *meets the target* when its accuracy >= target - ``--tolerance`` (absolute,
    default 0.01 = 1 pp; the report states the BSP-IID seeds' standard deviation beside it, and
    says so when the tolerance is below twice that, i.e. within the seeds' noise);
(b) BSP at the level: the bytes every savings figure divides;
(c) each algorithm of ``--algos`` (default Gaia, FedAvg, DGC) at EVERY theta of its Figure 8 grid
    (``fig8_grid``), the Oracle's candidates;
(d) the algorithm with ``--skewscout`` over the same grid (``--skewscout-grid``), started at the
    paper's Figure 1 setting (T0 = 10%, Iter_Local = 20, E_warm = 8; §3's choice), deciding
    ``--travel-decisions`` times per run (default 128: the paper's 64,000 steps / 500), so a
    shortened budget keeps the paper's order of decisions.

Grids. The paper's Tables 6-8 grids (the algorithms' ``KNOB.grid``), with Gaia's extended at the
tight end by T0 = 1% and 0.5%: at 80-100% skew no T0 of Table 6 reaches BSP-IID accuracy for any
network the paper shows (LeNet 52.6% at T0 = 2%, GoogLeNet 75.6% at 5%, BSP-IID 77.4-78.4%), yet
Figure 8 reaches it at every level, so the paper's runs had tighter thresholds; the released code
(github.com/kevinhsieh/non_iid_dml, ps_config files) uses a 1% significance threshold as its
default and 0.5% as its lower bound. Gaia's is also extended at the loose end by T0 = 75% and 100%: in the
pilot (GN-LeNet, 4 epochs, 20% skew) SkewScout reached the paper's loosest T0 = 50% by step 180 and held it
with AL 0.4-2% +- 0.7 pp, far below sigma_AL = 5%, so the grid, not the accuracy, stopped it. FedAvg's grid
is extended by Iter_Local = 1 and 2 (1 averages every step, the BSP end). DGC's is the paper's (E_warm
only lengthens the warm-up; no E_warm approaches BSP). ``--grid`` replaces the grid (one algorithm
only); the Oracle is then not the paper's, and the report says so.

Network. The paper does not name Figure 8's network. §6 (Figure 6), which §7 builds on, studies
the skew levels with GN-LeNet; the released code reads the skewed partitions with LeNet, GN-LeNet
and a GoogLeNet without normalization, and holds a per-500-iteration Gaia threshold schedule (the
shape of a SkewScout trajectory) only in GoogLeNet configs. GoogLeNet is not in geodml, so the
study runs GN-LeNet (``--norm group``, the default) and LeNet with ``--norm none``.

Decisions (tests/test_study.py):

* Aggregates are over the seeds that succeeded: mean accuracy (and its sd), mean WAN bytes (every
  kind: SkewScout's travel and control bytes included). A theta is an Oracle candidate only when
  every seed succeeded. Oracle = the candidate whose mean accuracy meets the target with the fewest
  mean bytes (ties: the more conservative theta).
* CSV columns: ``skew, algorithm, savings_over_bsp, accuracy, meets_target, bytes_vs_oracle``
  (the issue's), then ``knob, theta, accuracy_sd, seeds_meeting, wan_bytes, seeds, note``.
  savings = mean BSP bytes / mean bytes; bytes_vs_oracle = mean bytes / the Oracle's mean bytes.
* Run ids name the setting, algorithm, theta and seed (``gaia-t0-0.05-label-0.8-s1``); a finished
  run is reused (geodml.study.runner), so adding a seed or a level runs only the new runs.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from geodml.study import common, paper
from geodml.study.common import run_accuracy
from geodml.study.runner import Launcher, RunResult, RunSpec, finite_floats, torchrun_launcher

PAPER_DECISIONS = 128
"""The paper's decisions per run: 64,000 steps (128 epochs, batch 20, K=5) / one every 500 minibatches."""
GRID_EXTENSION: dict[str, tuple[float, ...]] = {"gaia": (0.005, 0.01, 0.75, 1.0), "fedavg": (1.0, 2.0), "dgc": ()}
"""Knob values added to the paper's Tables 6-8 grid (module docstring: why)."""
STUDY_BACKOFF = 16
"""SkewScout's --travel-backoff in this study: 128 decisions' cadence, stretched up to 16x while settled (docs/skewscout.md,
"Travel cost": travel <= ~10% of the bytes at 20% skew)."""
ORACLE_SEARCHES = ("bisect", "full")
PAPER_FIG8 = {0.2: 34.1, 1.0: 9.6}
"""The paper's SkewScout savings over BSP at the ends of Figure 8 (the text gives only these and 1.1-1.5x the Oracle)."""
LEVELS_FULL, LEVELS_QUICK = (0.2, 0.4, 0.6, 0.8, 1.0), (0.2, 1.0)
KNOB_ALGOS = ("gaia", "fedavg", "dgc")
CONTROLLED = ("seed", "travel_every", "travel_decisions", "skewscout_grid", "partition_eval_examples")
"""geodml flags this study sets (beyond paper.CONTROLLED), refused after '--'."""
FIELDS = ("skew", "algorithm", "savings_over_bsp", "accuracy", "meets_target", "bytes_vs_oracle", "knob", "theta",
          "accuracy_sd", "seeds_meeting", "wan_bytes", "seeds", "note")


def fig8_grid(algo: str) -> tuple[float, ...]:
    """The Figure 8 grid of ``algo`` in the paper's units, most communication first."""
    from geodml.algorithms import algorithm_factory
    knob = algorithm_factory(algo).KNOB
    assert knob is not None, f"{algo} has no knob"
    return knob.with_grid(GRID_EXTENSION[algo] + knob.grid).grid


@dataclass(frozen=True)
class Fig8Run:
    """One run of the study and its place in the figure."""

    role: str
    """'bsp-iid' (the target), 'bsp' (the level's reference), 'theta' (an Oracle candidate), 'skewscout'."""
    level: float | None
    """Fraction non-IID; None for BSP-IID."""
    algo: str
    theta: float | None
    """The knob value in the paper's units (DGC: paper epochs); SkewScout: its start."""
    seed: int
    spec: RunSpec


# ---- arguments ---------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    """This study's flags, beside paper.build_parser's common ones."""
    p.set_defaults(model="lenet")  # the paper's network (the common parser's default is cnn)
    p.add_argument("--levels", type=finite_floats, help="non-IID fractions (default: full 0.2,0.4,0.6,0.8,1; quick 0.2,1)")
    p.add_argument("--norm", choices=("group", "none"), default="group",
                   help="LeNet's normalization: group = GN-LeNet (Figure 6's network for the skew levels), none = LeNet")
    p.add_argument("--tolerance", type=float, default=0.01, help="accepted accuracy below BSP-IID's mean (absolute)")
    p.add_argument("--grid", type=finite_floats, help="replace the knob grid (one algorithm in --algos; the paper's units); "
                   "default: the paper's Tables 6-8 grid, extended (see geodml/study/skewscout.py)")
    p.add_argument("--travel-decisions", type=int, help=f"SkewScout decisions per run (default {PAPER_DECISIONS}, "
                   "the paper's 64,000 steps / 500)")
    p.add_argument("--travel-every", type=int, help="SkewScout travels every this many steps instead")
    p.add_argument("--travel-backoff", type=int, default=STUDY_BACKOFF,
                   help=f"SkewScout's --travel-backoff (default {STUDY_BACKOFF}: travel at most ~10%% of the bytes, "
                   "docs/skewscout.md; 1: the paper's fixed cadence)")
    p.add_argument("--oracle", choices=ORACLE_SEARCHES, default="bisect",
                   help="bisect: the Oracle's theta by bisection over the grid, checked for monotonicity, the full "
                   "grid where it is not (default); full: every theta of the grid")


def knob_algos(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(a for a in args.algos if a in KNOB_ALGOS)


def check_args(args: argparse.Namespace) -> None:
    """Study-level checks (StudyError); geodml's own flags are checked per run by common.validate_specs."""
    if args.travel_every is not None and args.travel_decisions is not None:
        raise paper.StudyError("--travel-every (steps) and --travel-decisions (per run) set the same cadence; give one")
    for name in ("travel_every", "travel_decisions"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise paper.StudyError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.travel_backoff < 1:
        raise paper.StudyError(f"--travel-backoff must be >= 1 (1: a fixed cadence), got {args.travel_backoff}")
    if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise paper.StudyError(f"--tolerance must be >= 0, got {args.tolerance}")
    if not knob_algos(args):
        raise paper.StudyError("--algos: name at least one of gaia, fedavg, dgc (BSP is always run)")
    if args.grid is not None and len(knob_algos(args)) != 1:
        raise paper.StudyError("--grid replaces one algorithm's grid: give one of gaia, fedavg, dgc in --algos")
    if any(not 0 < v <= 1 for v in args.levels):
        raise paper.StudyError(f"--levels are non-IID fractions in (0, 1], got {args.levels}")


def parse(argv: list[str]) -> tuple[argparse.Namespace, paper.Budget]:
    args = paper.parse_args("skewscout", argv, add_arguments)
    quick = args.budget == "quick"
    args.levels = args.levels or (LEVELS_QUICK if quick else LEVELS_FULL)
    if args.travel_every is None and args.travel_decisions is None:
        args.travel_decisions = PAPER_DECISIONS
    budget = paper.make_budget(args)
    common.check_extra_flags(args.geodml_args, paper.CONTROLLED + CONTROLLED)
    check_args(args)
    return args, budget


# ---- plan --------------------------------------------------------------------------------------

def grid_of(args: argparse.Namespace, algo: str) -> tuple[float, ...]:
    from geodml.algorithms import algorithm_factory
    if args.grid is not None:
        knob = algorithm_factory(algo).KNOB
        assert knob is not None
        return knob.with_grid(args.grid).grid
    return fig8_grid(algo)


def _knob_value(algo: str, theta: float, budget: paper.Budget) -> str:
    """The value geodml gets for ``theta`` (DGC's E_warm scaled to the budget, as paper.knob_flags)."""
    return paper.knob_flags(algo, theta, budget)[0][1]


def _label(level: float | None) -> str:
    return "iid" if level is None else f"label-{paper.fmt(level)}"


def plan(args: argparse.Namespace, budget: paper.Budget) -> list[Fig8Run]:
    """Every run of the study, unique run ids, in launch order (targets and references first)."""
    out = Path(args.out)
    runs: list[Fig8Run] = []

    def add(role: str, level: float | None, algo: str, theta: float | None, seed: int, slug: str,
            flags: tuple[str, ...]) -> None:
        lr = paper.lr_for(algo, budget.lr, args.nproc, args.lr_rule)
        data = paper.data_flags(args.dataset, "iid", None) if level is None else paper.data_flags(args.dataset, "label",
                                                                                                  level)
        rid = f"{slug}-{_label(level)}-s{seed}"
        argv = ("--algo", algo, *data, *paper.model_flags(args.model), "--norm", args.norm, "--lr", paper.fmt(lr),
                *budget.flags(), "--seed", str(seed), *flags, *paper.ALGO_FLAGS.get(algo, ()), *args.geodml_args)
        runs.append(Fig8Run(role, level, algo, theta, seed, RunSpec(rid, out / rid, argv, args.nproc)))

    for seed in args.seeds:
        add("bsp-iid", None, "bsp", None, seed, "bsp", ())
    for level in args.levels:
        for seed in args.seeds:
            add("bsp", level, "bsp", None, seed, "bsp", ())
        for algo in knob_algos(args):
            grid = grid_of(args, algo)
            knob = paper.FIG1_THETA[algo][0]
            slug = f"{algo}-{knob.lstrip('-')}"
            for seed in args.seeds:
                for theta in grid:
                    add("theta", level, algo, theta, seed, f"{slug}-{paper.fmt(theta)}",
                        (knob, _knob_value(algo, theta, budget)))
                start = float(paper.FIG1_THETA[algo][1])
                cadence = (("--travel-decisions", str(args.travel_decisions)) if args.travel_decisions is not None
                           else ("--travel-every", str(args.travel_every)))
                values = ",".join(_knob_value(algo, v, budget) for v in grid)
                backoff = ("--travel-backoff", str(args.travel_backoff)) if args.travel_backoff != 1 else ()
                add("skewscout", level, algo, start, seed, f"{algo}-skewscout",
                    (knob, _knob_value(algo, start, budget), "--skewscout", *cadence, *backoff,
                     "--skewscout-grid", values))
    ids = [r.spec.run_id for r in runs]
    assert len(ids) == len(set(ids)), "run ids are unique by construction"
    return runs


# ---- the Oracle's search ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Probe:
    """One grid point once every seed of it has finished: its seeds' mean accuracy and WAN bytes (None: a seed failed)."""

    accuracy: float | None
    wan_bytes: float | None


def _monotone_break(i: int, pi: Probe, j: int, pj: Probe, tolerance: float) -> str:
    """Why tighter point ``i`` and looser point ``j`` (i < j) break the Oracle's monotone assumption, or ""."""
    assert pi.accuracy is not None and pj.accuracy is not None and pi.wan_bytes is not None
    assert pj.wan_bytes is not None
    if pj.accuracy > pi.accuracy + tolerance:
        return f"not monotone: point {j} is {pj.accuracy - pi.accuracy:.4f} more accurate than the tighter {i}"
    if pj.wan_bytes > pi.wan_bytes:
        return f"not monotone: point {j} sends more bytes than the tighter {i}"
    return ""


def oracle_next(probed: dict[int, Probe], n: int, threshold: float, tolerance: float) -> tuple[str, list[int], str]:
    """The Oracle's next step over a grid of ``n`` points, index 0 sending most: ``("probe", [i], "")`` to run
    point i, ``("full", [unprobed...], why)`` to run the rest of the grid, ``("done", [], why)``.

    Bisection on "meets the target" (mean accuracy >= threshold), assuming accuracy falls and bytes fall as the
    index grows (looser theta): invariant lo meets (-1: none known), hi misses (n: none known); probe the middle.
    Its answer, lo, is then the cheapest point meeting the target. The assumption is checked on every pair of
    probed points i < j once the bracket is closed: a looser point more accurate than a tighter one by more than
    ``tolerance`` (the study's accuracy tolerance, the seeds' noise scale), or sending more bytes, breaks it, and
    the rest of the grid is run (``build_report`` then picks among all points, as with ``--oracle full``). A
    point with a failed seed counts as missing the target.
    """
    def meets_target(i: int) -> bool:
        a = probed[i].accuracy
        return a is not None and a >= threshold - 1e-12

    lo, hi = -1, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mid not in probed:
            return "probe", [mid], ""
        lo, hi = (mid, hi) if meets_target(mid) else (lo, mid)
    done = sorted(i for i, p in probed.items() if p.accuracy is not None and p.wan_bytes is not None)
    why = next(filter(None, (_monotone_break(i, probed[i], j, probed[j], tolerance)
                             for i, j in itertools.combinations(done, 2))), "")
    if not why:
        return "done", [], ""
    rest = [i for i in range(n) if i not in probed]
    return ("full", rest, why) if rest else ("done", [], why)


def oracle_theta_runs(runs: list[Fig8Run], level: float, algo: str, theta: float) -> list[Fig8Run]:
    return [r for r in runs if r.role == "theta" and r.level == level and r.algo == algo and r.theta == theta]


def run_study(args: argparse.Namespace, runs: list[Fig8Run], launcher: Launcher) -> tuple[list[Fig8Run], list[RunResult],
                                                                                           dict]:
    """Run the plan: every run with ``--oracle full``; with ``bisect`` the targets first, then per level its BSP and
    SkewScout runs and the Oracle's probes (all seeds of one theta at a time, ``oracle_next``). Returns the runs
    made, their results and, per level and algorithm, the search's record (mode, probed thetas, fallback reason)."""
    if args.oracle == "full":
        return runs, common.run_specs(args, [r.spec for r in runs], launcher), {}
    made: list[Fig8Run] = []
    results: dict[str, RunResult] = {}

    def run(rs: list[Fig8Run]) -> None:
        todo = [r for r in rs if r.spec.run_id not in results]
        made.extend(todo)
        for res in common.run_specs(args, [r.spec for r in todo], launcher):
            results[res.spec.run_id] = res


    run([r for r in runs if r.role == "bsp-iid"])
    target = aggregate([r for r in made if r.role == "bsp-iid"], results).accuracy
    searches: dict = {}
    for level in args.levels:
        run([r for r in runs if r.level == level and r.role in ("bsp", "skewscout")])
        for algo in knob_algos(args):
            grid = grid_of(args, algo)
            record: dict = {"mode": "bisect", "probed": [], "why": ""}
            searches.setdefault(paper.fmt(level), {})[algo] = record
            if target is None:
                record["why"] = "no target (every BSP-IID run failed)"
                continue
            while True:
                probed: dict[int, Probe] = {}
                for i, theta in enumerate(grid):
                    rs = oracle_theta_runs(runs, level, algo, theta)
                    if rs and all(r.spec.run_id in results for r in rs):
                        res = [results[r.spec.run_id] for r in rs]
                        ok = all(x.succeeded for x in res)
                        probed[i] = Probe(statistics.fmean([run_accuracy(x.summary) for x in res if x.summary]) if ok else None,
                                          statistics.fmean([float(x.summary["wan_bytes_total"]) for x in res if x.summary])
                                          if ok else None)
                action, idx, why = oracle_next(probed, len(grid), target - args.tolerance, args.tolerance)
                record["probed"] = [grid[i] for i in sorted(probed)]
                if why:
                    record.update(mode="full" if action == "full" or record["mode"] == "full" else "bisect", why=why)
                if action == "done":
                    break
                run([r for i in idx for r in oracle_theta_runs(runs, level, algo, grid[i])])
    return made, [results[r.spec.run_id] for r in made], searches


# ---- report ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Aggregate:
    """One configuration over its seeds."""

    accuracy: float | None
    accuracy_sd: float | None
    wan_bytes: float | None
    seeds_ok: tuple[int, ...]
    seeds_failed: tuple[int, ...]
    accuracies: tuple[float, ...]
    summaries: tuple[dict, ...]


def aggregate(runs: list[Fig8Run], by_id: dict[str, RunResult]) -> Aggregate:
    ok = [(r.seed, by_id[r.spec.run_id].summary) for r in runs if by_id[r.spec.run_id].succeeded]
    accs = tuple(run_accuracy(s) for _, s in ok if s is not None)
    byts = [float(s["wan_bytes_total"]) for _, s in ok if s is not None]
    return Aggregate(accuracy=statistics.fmean(accs) if accs else None,
                     accuracy_sd=statistics.stdev(accs) if len(accs) >= 2 else None,
                     wan_bytes=statistics.fmean(byts) if byts else None,
                     seeds_ok=tuple(seed for seed, _ in ok),
                     seeds_failed=tuple(r.seed for r in runs if not by_id[r.spec.run_id].succeeded),
                     accuracies=accs, summaries=tuple(s for _, s in ok if s is not None))


def meets(accuracy: float | None, threshold: float | None) -> bool | None:
    if accuracy is None or threshold is None:
        return None
    return accuracy >= threshold - 1e-12


def ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b


def build_report(args: argparse.Namespace, budget: paper.Budget, runs: list[Fig8Run], results: list[RunResult],
                 searches: dict | None = None) -> dict:
    """The figure's rows from the runs made (with ``--oracle bisect`` only the probed thetas; ``searches``: its
    record per level and algorithm, ``run_study``'s)."""
    by_id = {r.spec.run_id: r for r in results}
    searches = searches or {}
    target_agg = aggregate([r for r in runs if r.role == "bsp-iid"], by_id)
    target = target_agg.accuracy
    threshold = None if target is None else target - args.tolerance
    rows: list[dict] = []

    def row(level: float, algorithm: str, agg: Aggregate, bsp_bytes: float | None, oracle_bytes: float | None,
            knob: str = "", theta: object = None, note: str = "") -> dict:
        meeting = sum(1 for a in agg.accuracies if meets(a, threshold))
        return {"skew": level, "algorithm": algorithm, "savings_over_bsp": ratio(bsp_bytes, agg.wan_bytes),
                "accuracy": agg.accuracy, "meets_target": meets(agg.accuracy, threshold),
                "bytes_vs_oracle": ratio(agg.wan_bytes, oracle_bytes), "knob": knob, "theta": theta,
                "accuracy_sd": agg.accuracy_sd, "seeds_meeting": f"{meeting}/{len(args.seeds)}",
                "wan_bytes": agg.wan_bytes, "seeds": ",".join(map(str, agg.seeds_ok)),
                "note": note + (f"; failed seeds {','.join(map(str, agg.seeds_failed))}" if agg.seeds_failed else "")}

    for level in args.levels:
        at = [r for r in runs if r.level == level]
        bsp = aggregate([r for r in at if r.role == "bsp"], by_id)
        level_rows = []
        for algo in knob_algos(args):
            label, knob = paper.ALGO_LABEL[algo], paper.FIG1_THETA[algo][0].lstrip("-")
            grid = grid_of(args, algo)
            cands = [(theta, aggregate([r for r in at if r.role == "theta" and r.algo == algo and r.theta == theta],
                                       by_id)) for theta in grid]
            ok = [(i, t, a) for i, (t, a) in enumerate(cands)
                  if not a.seeds_failed and a.seeds_ok and meets(a.accuracy, threshold)]
            best = min(ok, key=lambda x: (x[2].wan_bytes, x[0]), default=None)
            oracle_bytes = None if best is None else best[2].wan_bytes
            if best is None:
                done = [(t, a) for t, a in cands if a.accuracy is not None]
                top = max(done, key=lambda x: x[1].accuracy or 0.0, default=None)
                why = "no theta run succeeded" if top is None else (
                    f"no theta meets the target (best {knob}={paper.fmt(top[0])}: {top[1].accuracy:.4f})")
                level_rows.append({**{k: None for k in FIELDS}, "skew": level, "algorithm": f"{label} Oracle",
                                   "knob": knob, "seeds_meeting": "-", "note": why})
            else:
                grid_note = "over --grid, not the paper's full grid" if args.grid is not None else ""
                search = searches.get(paper.fmt(level), {}).get(algo)
                if search is not None:
                    probed = f"{len(search['probed'])} of {len(grid)} thetas run"
                    grid_note = "; ".join(x for x in (grid_note, f"{search['mode']}: {probed}", search["why"]) if x)
                if best[0] == len(grid) - 1:
                    grid_note = "; ".join(x for x in (grid_note, "the grid's loosest theta: a looser one may do") if x)
                level_rows.append(row(level, f"{label} Oracle", best[2], bsp.wan_bytes, oracle_bytes, knob,
                                      best[1], grid_note))
            scout = aggregate([r for r in at if r.role == "skewscout" and r.algo == algo], by_id)
            finals = [s.get("theta_final") for s in scout.summaries]
            level_rows.append(row(level, f"{label} + SkewScout", scout, bsp.wan_bytes, oracle_bytes, knob,
                                  "/".join("-" if t is None else paper.fmt(t) for t in finals) or None,
                                  f"start {paper.fmt(paper.FIG1_THETA[algo][1])}, final per seed"))
            if algo == knob_algos(args)[0]:  # one BSP row per level; its bytes_vs_oracle against this Oracle
                level_rows.insert(0, row(level, "BSP", bsp, bsp.wan_bytes, oracle_bytes,
                                         note=f"bytes vs Oracle: the {label} Oracle's"))
        rows.extend(level_rows)
    failed = sorted(r.spec.run_id for r in runs if not by_id[r.spec.run_id].succeeded)
    return {"study": "skewscout", "paper": paper.PAPER_REF["skewscout"], "dataset": args.dataset, "nproc": args.nproc,
            "norm": args.norm, "model": {"lenet": "LeNet", "cnn": "CNN"}[args.model] if args.norm == "none" else
            f"GN-{ {'lenet': 'LeNet', 'cnn': 'CNN'}[args.model] }", "seeds": list(args.seeds),
            "levels": list(args.levels), "algos": list(knob_algos(args)),
            "grids": {a: list(grid_of(args, a)) for a in knob_algos(args)}, "grid_override": args.grid is not None,
            "travel_decisions": args.travel_decisions, "travel_every": args.travel_every,
            "budget": {"name": budget.name, "epochs": budget.epochs, "steps": budget.steps, "lr": budget.lr,
                       "eval_every": budget.eval_every},
            "target": {"accuracy": target, "sd": target_agg.accuracy_sd, "seeds": list(target_agg.seeds_ok),
                       "tolerance": args.tolerance, "threshold": threshold},
            "figure8": rows, "failed": failed,
            "runs": [{"run_id": r.spec.run_id, "role": r.role, "level": r.level, "algo": r.algo, "theta": r.theta,
                      "seed": r.seed, **by_id[r.spec.run_id].to_dict(),
                      "accuracy": None if by_id[r.spec.run_id].summary is None
                      else run_accuracy(by_id[r.spec.run_id].summary),
                      "wan_bytes_total": (by_id[r.spec.run_id].summary or {}).get("wan_bytes_total"),
                      "theta_final": (by_id[r.spec.run_id].summary or {}).get("theta_final")} for r in runs]}


def tolerance_note(report: dict) -> str:
    t = report["target"]
    if t["accuracy"] is None:
        return "No target: every BSP-IID run failed."
    sd = t["sd"]
    text = (f"Target: BSP-IID mean accuracy {t['accuracy']:.4f} over seeds {','.join(map(str, t['seeds']))} - tolerance "
            f"{t['tolerance']:g} = {t['threshold']:.4f}.")
    if sd is None:
        return text + " One seed: the seeds' noise is not measured."
    verdict = ("at least twice" if t["tolerance"] >= 2 * sd else "below twice")
    return text + (f" BSP-IID's seed standard deviation is {sd:.4f}: the tolerance is {verdict} that"
                   + ("." if t["tolerance"] >= 2 * sd else ", so a miss by less than that is within the seeds' noise."))


def _cell(v: object, spec: str = "") -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return format(v, spec) if spec and isinstance(v, (int, float)) else str(v)


def format_markdown(report: dict) -> str:
    b = report["budget"]
    length = f"{b['steps']} steps" if b["steps"] else f"{paper.fmt(b['epochs'])} epochs"
    cadence = (f"{report['travel_decisions']} decisions per run" if report["travel_decisions"] is not None
               else f"a decision every {report['travel_every']} steps")
    grids = "; ".join(f"{paper.ALGO_LABEL[a]} {', '.join(map(paper.fmt, g))}" for a, g in report["grids"].items())
    lines = [f"# skewscout: Quagmire Figure 8 on {report['dataset']}, {report['model']}, K={report['nproc']}, "
             f"budget {b['name']}", "",
             f"Budget: {length} per run, BSP lr {b['lr']:g} (Gaia/DGC lr/K); seeds {', '.join(map(str, report['seeds']))}; "
             f"SkewScout: {cadence}. Grids: {grids}" + (" (--grid: NOT the paper's full grid)." if report["grid_override"]
                                                         else "."), "",
             tolerance_note(report), "",
             "| non-IID | algorithm | theta | accuracy (sd) | meets target (seeds) | savings over BSP | bytes vs Oracle | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["figure8"]:
        sd = f" ({r['accuracy_sd']:.4f})" if r["accuracy_sd"] is not None else ""
        t = r["theta"]
        theta = "-" if t is None else f"{r['knob']}={t if isinstance(t, str) else paper.fmt(t)}"
        lines.append(f"| {round(100 * r['skew'])}% | {r['algorithm']} | {theta} | {_cell(r['accuracy'], '.4f')}{sd} | "
                     f"{_cell(r['meets_target'])} ({r['seeds_meeting']}) | {_cell(r['savings_over_bsp'], '.1f')}x | "
                     f"{_cell(r['bytes_vs_oracle'], '.2f')}x | {r['note'] or ''} |")
    lines += ["", "Paper (CIFAR-10, one run per cell): SkewScout saves 9.6x (100% non-IID) to 34.1x (20%) over BSP at "
              "BSP-IID accuracy and needs 1.1-1.5x the Oracle's bytes."]
    if report["failed"]:
        lines.append(f"\nFailed runs (excluded): {', '.join(report['failed'])}")
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows([{k: ("" if r.get(k) is None else r[k]) for k in FIELDS} for r in rows])


def write_plot(report: dict, path: Path) -> Path | None:
    """Savings over BSP per level, Oracle and SkewScout side by side, one group of bars per algorithm."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("warning: matplotlib is not installed; no PNG", file=sys.stderr)
        return None
    rows = report["figure8"]
    levels = list(dict.fromkeys(r["skew"] for r in rows))
    series = [r["algorithm"] for r in rows if r["skew"] == levels[0] and r["algorithm"] != "BSP"] if levels else []
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(5.5, 1.2 * len(levels) * max(1, len(series)) ** 0.5), 3.4))
    for k, name in enumerate(series):
        ys = [next((r["savings_over_bsp"] or 0 for r in rows if r["skew"] == lv and r["algorithm"] == name), 0)
              for lv in levels]
        ax.bar([i + (k - (len(series) - 1) / 2) * width for i in range(len(levels))], ys, width, label=name)
    ax.set_xticks(range(len(levels)))
    ax.set_xticklabels([f"{round(100 * lv)}%" for lv in levels])
    ax.set_xlabel("non-IID fraction")
    ax.set_ylabel("communication savings over BSP (x)")
    ax.set_title(f"Figure 8: {report['dataset']}, {report['model']}, K={report['nproc']} ({report['budget']['name']})",
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# ---- entry point -------------------------------------------------------------------------------

def prepare(argv: list[str]) -> tuple[argparse.Namespace, paper.Budget, list[Fig8Run]]:
    args, budget = parse(argv)
    runs = plan(args, budget)
    common.validate_specs([r.spec for r in runs])
    return args, budget, runs


def main(argv: list[str] | None = None, *, launcher: Launcher = torchrun_launcher) -> int:
    """0: every run succeeded; 1: some run failed (reported); 2: bad arguments."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, budget, runs = prepare(argv)
    except paper.StudyError as exc:
        print(f"geodml.study skewscout: error: {exc}", file=sys.stderr)
        return 2
    print(f"skewscout study (Quagmire Figure 8): {len(runs)} runs on {args.dataset}, K={args.nproc}, budget "
          f"{budget.name}, seeds {','.join(map(str, args.seeds))}, into {args.out}", flush=True)
    specs = [r.spec for r in runs]
    if args.only:
        return common.run_only("skewscout", args, specs, launcher)
    if args.dry_run:
        if args.oracle == "bisect":
            n_theta = sum(1 for r in runs if r.role == "theta")
            print(f"--oracle bisect: of the {n_theta} theta runs listed (the Oracle's candidates) only its probes run, "
                  f"chosen as runs finish: about log2 of each grid; the other {len(runs) - n_theta} all run")
        common.print_plan(specs)
        return 0
    made, results, searches = run_study(args, runs, launcher)
    report = build_report(args, budget, made, results, searches)
    report["oracle_search"] = {"mode": args.oracle, "by_level": searches}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = format_markdown(report)
    (out / "skewscout.md").write_text(text)
    (out / "skewscout.json").write_text(json.dumps(report, indent=2) + "\n")
    write_csv(report["figure8"], out / "skewscout.csv")
    png = None if args.no_plots else write_plot(report, out / "savings.png")
    print("\n" + text + f"\nwritten: {out / 'skewscout.md'}, {out / 'skewscout.csv'}" + (f", {png}" if png else ""),
          flush=True)
    return 1 if report["failed"] else 0
