"""Quagmire Figure 8: ``python -m geodml.study skewscout`` -- SkewScout and Oracle savings over BSP per skew level.

For every label-skew level (full: 20/40/60/80/100% non-IID; quick: 20% and 100%) this plans the
Oracle study of geodml.study.oracle with ``--with-skewscout`` for Gaia (BSP-IID target, BSP in
the setting, Gaia at every T0 of the grid, Gaia + SkewScout from the grid's middle), runs all
levels together (the BSP-IID target is one shared run), and reports per level the Oracle's and
SkewScout's communication savings over BSP and whether they reach the BSP-IID accuracy
(within ``--tolerance``). The budget and the per-algorithm learning rate follow
geodml.study.paper (Gaia gets lr/K by default). ``skewscout.md/.csv/.json`` and ``savings.png``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from pathlib import Path

from geodml.config import SkewScoutConfig
from geodml.study import oracle, paper
from geodml.study.runner import Launcher, run_all, torchrun_launcher

FIELDS = ("skew", "setting", "target_accuracy", "bsp_accuracy", "bsp_wan_bytes", "oracle_t0", "oracle_accuracy",
          "oracle_savings", "skewscout_start_t0", "skewscout_final_t0", "skewscout_accuracy", "skewscout_savings",
          "skewscout_meets_target", "failed")


def levels(budget: paper.Budget) -> tuple[float, ...]:
    return (0.2, 0.4, 0.6, 0.8, 1.0) if budget.name == "full" else (0.2, 1.0)


DEFAULT_TRAVEL_EVERY = SkewScoutConfig.travel_every  # the paper's 500 steps


def travel_every(args: argparse.Namespace, budget: paper.Budget) -> int:
    """Steps between SkewScout's travels: ``--travel-every``, else steps/2 in the quick budget (one
    decision), else geodml's default."""
    if args.travel_every:
        return args.travel_every
    return max(1, budget.steps // 2) if budget.steps else DEFAULT_TRAVEL_EVERY


def plan(args: argparse.Namespace, budget: paper.Budget) -> tuple[dict[float, list[oracle.Planned]], list]:
    """Per level the oracle study's runs (Gaia runs get the per-algorithm lr), and the unique specs of all levels."""
    grid_text = args.grid or ("0.05,0.5" if budget.name == "quick" else None)
    theta_name, grid, algo_grid = oracle.resolve_grid("gaia", oracle._float_list(grid_text) if grid_text else None)
    # SkewScout's travel interval goes to its own runs only, so BSP and the Oracle's runs stay reusable
    # across intervals; geodml's own default (the paper's) is not passed, so default runs keep their ids.
    every = travel_every(args, budget)
    travel = ("--travel-every", str(every)) if every != DEFAULT_TRAVEL_EVERY else ()
    common = ["--model", args.model, "--lr", paper.fmt(budget.lr), *budget.flags(), *args.geodml_args]
    gaia_lr = paper.fmt(paper.lr_for("gaia", budget.lr, args.nproc, args.sum_lr))
    per_level, unique = {}, {}
    for level in levels(budget):
        ns = argparse.Namespace(algo="gaia", dataset=args.dataset, partition="label", skew=level, alpha=None,
                                shards_per_partition=None, nproc=args.nproc, out=args.out, with_skewscout=True,
                                geodml_args=tuple(common))
        planned = []
        for p in oracle.plan(ns, theta_name, grid, algo_grid):
            if p.role in ("theta", "skewscout"):
                # the oracle's Gaia run ids do not name the setting: prefix it so levels do not collide;
                # argparse keeps the last --lr, so appending one gives Gaia its own rate
                rid = f"{oracle.setting_name(ns)}-{p.spec.run_id}"
                scout = travel if p.role == "skewscout" else ()
                if scout and args.travel_every not in (None, DEFAULT_TRAVEL_EVERY):  # a chosen interval names the run
                    rid = f"{rid}-travel-{every}"
                p = dataclasses.replace(p, spec=dataclasses.replace(p.spec, run_id=rid, out=Path(args.out) / rid,
                                                                      argv=(*p.spec.argv, "--lr", gaia_lr, *scout)))
            planned.append(unique.setdefault(p.spec.run_id, p))
        per_level[level] = planned
    return per_level, (theta_name, grid)


def level_row(level: float, rep: dict) -> dict:
    o, s, t = rep["oracle"] or {}, rep["skewscout"] or {}, rep["target"] or {}
    bsp_row = next((r for r in rep["runs"] if r["role"] == "bsp"), {})
    return {"skew": level, "setting": rep["setting"], "target_accuracy": t.get("accuracy"),
            "bsp_accuracy": bsp_row.get("accuracy"), "bsp_wan_bytes": rep["bsp"]["wan_bytes_total"],
            "oracle_t0": o.get("theta"), "oracle_accuracy": o.get("accuracy"), "oracle_savings": o.get("savings"),
            "skewscout_start_t0": s.get("theta"), "skewscout_final_t0": s.get("theta_final"),
            "skewscout_accuracy": s.get("accuracy"), "skewscout_savings": s.get("savings"),
            "skewscout_meets_target": s.get("meets_target"), "failed": ",".join(rep["failed"]),
            "oracle_note": rep["oracle_note"]}


def _f(v, spec):
    return "-" if v is None else format(v, spec)


def format_markdown(report: dict) -> str:
    b = report["budget"]
    length = f"{b['steps']} steps" if b["steps"] else f"{paper.fmt(b['epochs'])} epochs"
    lines = [f"# skewscout: Quagmire Figure 8 (Gaia) on {report['dataset']}, K={report['nproc']}, budget {b['name']}", "",
             f"Budget: {length} per run, BSP lr {b['lr']:g}, Gaia lr {report['gaia_lr']:g}; target = BSP-IID accuracy "
             f"- {report['tolerance']:g}; T0 grid {', '.join(map(paper.fmt, report['grid']))}; SkewScout travels every "
             f"{report.get('travel_every', DEFAULT_TRAVEL_EVERY)} steps.", "",
             "| non-IID | BSP-IID acc | BSP acc | Oracle T0 | Oracle acc | Oracle savings | SkewScout T0 (start -> final) "
             "| SkewScout acc | SkewScout savings | meets target |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["levels"]:
        sc = ("-" if r["skewscout_start_t0"] is None
              else f"{paper.fmt(r['skewscout_start_t0'])} -> {_f(r['skewscout_final_t0'], 'g')}")
        meets = {True: "yes", False: "no", None: "-"}[r["skewscout_meets_target"]]
        lines.append(f"| {round(100 * r['skew'])}% | {_f(r['target_accuracy'], '.4f')} | {_f(r['bsp_accuracy'], '.4f')} | "
                     f"{_f(r['oracle_t0'], 'g')} | {_f(r['oracle_accuracy'], '.4f')} | {_f(r['oracle_savings'], '.1f')}x | "
                     f"{sc} | {_f(r['skewscout_accuracy'], '.4f')} | {_f(r['skewscout_savings'], '.1f')}x | {meets} |")
    for r in report["levels"]:
        if r["oracle_t0"] is None:
            lines.append(f"\n{round(100 * r['skew'])}% non-IID: no Oracle: {r['oracle_note']}")
        if r["failed"]:
            lines.append(f"\n{round(100 * r['skew'])}% non-IID: failed runs (excluded): {r['failed']}")
    lines.append("\nPer-level run tables: levels/*.md")
    return "\n".join(lines) + "\n"


def write_plot(report: dict, path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("warning: matplotlib is not installed; no PNG", file=sys.stderr)
        return None
    rows = report["levels"]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for off, key, label in ((-0.2, "skewscout_savings", "SkewScout"), (0.2, "oracle_savings", "Oracle")):
        ax.bar([x + off for x in xs], [r[key] or 0 for r in rows], 0.4, label=label)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{round(100 * r['skew'])}%" for r in rows])
    ax.set_xlabel("non-IID fraction")
    ax.set_ylabel("communication savings over BSP (x)")
    ax.set_title(f"Figure 8 (Gaia): {report['dataset']}, K={report['nproc']} ({report['budget']['name']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None, *, launcher: Launcher = torchrun_launcher) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = paper.parse_args("skewscout", argv)
        budget = paper.make_budget(args)
        paper.check_extra_flags(args.geodml_args)
        if "--travel-every" in args.geodml_args:
            raise paper.StudyError("flags after '--': use the study's own --travel-every (it applies to the SkewScout "
                                   "runs only, so BSP and the Oracle's runs stay reusable)")
        if args.travel_every is not None and args.travel_every < 1:
            raise paper.StudyError(f"--travel-every must be >= 1, got {args.travel_every}")
        if not args.tolerance >= 0:
            raise paper.StudyError(f"--tolerance must be >= 0, got {args.tolerance}")
        if args.grid:
            try:
                oracle._float_list(args.grid)
            except argparse.ArgumentTypeError as exc:
                raise paper.StudyError(f"--grid: {exc}") from None
        per_level, (theta_name, grid) = plan(args, budget)
        all_planned = list({p.spec.run_id: p for ps in per_level.values() for p in ps}.values())
        paper.validate_specs([p.spec for p in all_planned])
    except paper.StudyError as exc:
        print(f"geodml.study skewscout: error: {exc}", file=sys.stderr)
        return 2
    print(f"skewscout study (Quagmire Figure 8): {len(all_planned)} runs on {args.dataset}, K={args.nproc}, "
          f"budget {budget.name}, into {args.out}", flush=True)
    results = run_all([p.spec for p in all_planned], jobs=args.jobs, timeout_s=args.run_timeout, launcher=launcher,
                      log=lambda m: print(m, flush=True))
    out = Path(args.out)
    (out / "levels").mkdir(parents=True, exist_ok=True)
    rows, failed = [], set()
    for level, planned in per_level.items():
        ns = argparse.Namespace(algo="gaia", dataset=args.dataset, partition="label", skew=level, nproc=args.nproc,
                                tolerance=args.tolerance, geodml_args=(), out=args.out, alpha=None, shards_per_partition=None)
        rep = oracle.build_report(ns, theta_name, grid, planned, results)
        (out / "levels" / f"{rep['setting']}.md").write_text(oracle.format_table(rep))
        rows.append(level_row(level, rep))
        failed.update(rep["failed"])
    report = {"study": "skewscout", "paper": paper.PAPER_REF["skewscout"], "dataset": args.dataset, "nproc": args.nproc,
              "tolerance": args.tolerance, "grid": list(grid), "travel_every": travel_every(args, budget),
              "gaia_lr": paper.lr_for("gaia", budget.lr, args.nproc, args.sum_lr),
              "budget": {"name": budget.name, "epochs": budget.epochs, "steps": budget.steps, "lr": budget.lr,
                         "eval_every": budget.eval_every}, "levels": rows, "failed": sorted(failed)}
    text = format_markdown(report)
    (out / "skewscout.md").write_text(text)
    (out / "skewscout.json").write_text(json.dumps(report, indent=2) + "\n")
    with open(out / "skewscout.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows([{k: ("" if r.get(k) is None else r[k]) for k in FIELDS} for r in rows])
    png = None if args.no_plots else write_plot(report, out / "savings.png")
    print("\n" + text + f"\nwritten: {out / 'skewscout.md'}, {out / 'skewscout.csv'}" + (f", {png}" if png else ""), flush=True)
    return 1 if failed else 0
