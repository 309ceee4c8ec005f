"""``python -m geodml.study plateau``: how long the Quagmire figures must train (issue 21's budget rule).

The paper trains "until training/validation accuracy has stopped improving" (Hsieh et al. 2020,
Appendix C) and gives 128 epochs with the lr divided by 10 at epochs 64 and 96. A shorter budget
is only a stand-in for that if BSP-IID, the reference every figure is relative to, has reached
its plateau within it. This study measures it: BSP on IID partitions with the released solver's
schedule scaled to E epochs (lr / 10 at 50% and 75% of E, as 64 and 96 of 128; BSP at K x eta,
eta = 0.01/K, batch 100/K per partition: geodml.study.paper), for every E of ``--epochs-grid``
(default 1, 2, 4, 8, 16, 32, each twice the one before) and every seed.

**The rule** (``plateau_budget``): the plateau budget is the smallest E of the grid whose
successor (the next, larger E) improves neither the mean final validation accuracy nor the mean
final training accuracy by more than ``--min-gain`` (default 0.5 percentage points), and whose
validation accuracy is at least ``LEARNED`` (20%, twice chance: a network that has not started to
learn does not improve either). Doubling the
budget then buys less than the seed noise this project measured for one cell (about 3 pp across
studies, REPRODUCTION.md) and less than the paper's smallest reported differences. When no E
qualifies, the plateau is beyond the grid and the report says the largest E is a lower bound.

* Validation accuracy: ``common.run_accuracy`` (the partitions' own models' mean, the released
  code's measure; for BSP every partition holds the global model).
* Training accuracy: the mean of summary.json's ``per_rank_train_accuracy``, each partition's
  final model on its own training data (under IID, the training set split K ways).
* The report also draws every run's validation curve per epoch, so the within-run plateau (after
  the last lr drop) is visible beside the across-budget one.

Run ids: ``bsp-iid-e8-s0``. Outputs in ``--out`` (default ``runs/study-plateau-DATASET-BUDGET-MODEL``):
``plateau.md``, ``plateau.csv`` (one row per run), ``plateau.json``, ``plateau.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from geodml.config import DATASETS
from geodml.study import common, paper
from geodml.study.common import StudyError
from geodml.study.runner import Launcher, RunResult, RunSpec, torchrun_launcher

NAME = "plateau"
GRID_FULL = (1, 2, 4, 8, 16, 32)
GRID_QUICK = (1, 2)
MIN_GAIN_PP = 0.5
LEARNED = 0.2
"""A budget counts only when its mean validation accuracy reaches this (twice chance on geodml's 10-class
datasets): a network that has not started to learn also "stops improving"."""
CONTROLLED = ("algo", "out", "dataset", "partition", "model", "norm", "lr", "epochs", "steps", "lr_milestones",
              "partition_scores", "eval_every", "eval_at", "seed", "batch_size", "partition_eval_examples", "rounds",
              "eval_every_rounds")


@dataclass(frozen=True)
class PlateauRun:
    epochs: int
    seed: int
    spec: RunSpec


def _grid(text: str) -> tuple[int, ...]:
    values = common.int_list(text)
    if any(v < 1 for v in values) or list(values) != sorted(values):
        raise argparse.ArgumentTypeError(f"expected increasing epochs >= 1 such as 1,2,4,8, got {text!r}")
    return values


def build_parser() -> common.OneLineParser:
    p = common.OneLineParser(
        prog=f"python -m geodml.study {NAME}", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="The Quagmire figures' budget: BSP-IID at the released solver's schedule scaled to each E of "
                    "--epochs-grid; the plateau budget is the smallest E whose successor gains <= --min-gain "
                    "(geodml/study/plateau.py, docs/study.md).",
        epilog="Flags after '--' go to every geodml run (e.g. -- --comm-timeout 300). Finished runs are reused.")
    p.study = NAME
    p.add_argument("--budget", choices=("quick", "full"), default="full",
                   help="quick: digits, K = 2, E = 1, 2 (checks the machinery); full: Fashion-MNIST, the paper's schedule")
    p.add_argument("--dataset", choices=DATASETS, help="default: digits for quick, fashion-mnist for full")
    p.add_argument("--model", choices=paper.STUDY_MODELS, default="lenet", help="the network (geodml.study.paper)")
    p.add_argument("--norm", choices=tuple(paper.NORM_FLAGS), help="its normalization variant (default: the network's "
                   "own: BatchNorm for resnet20, none otherwise; group2g = GroupNorm with 2 groups)")
    p.add_argument("--nproc", type=int, help="partitions K (default: full 5, quick 2)")
    p.add_argument("--epochs-grid", type=_grid, help=f"budgets E in epochs, increasing (default: full "
                   f"{','.join(map(str, GRID_FULL))}; quick {','.join(map(str, GRID_QUICK))})")
    p.add_argument("--seeds", type=common.seed_list, help="seeds (default 0; each E runs once per seed)")
    p.add_argument("--min-gain", type=float, default=MIN_GAIN_PP, help="percentage points: the rule's threshold")
    p.add_argument("--lr", type=float, help="eta (BSP runs at K x eta); default 0.01/K, the released solvers'")
    p.add_argument("--eval-every", type=int, help="steps between validations (default: one epoch)")
    p.add_argument("--out", help="study directory (default runs/study-plateau-DATASET-BUDGET-MODEL[-NORM])")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time")
    p.add_argument("--processes", type=int, help="processes per run (default: one per partition); results do not "
                   "depend on it, so finished runs are reused whatever it was")
    p.add_argument("--run-timeout", type=float, default=24 * 3600.0, help="seconds before a run is killed and reported")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG")
    common.add_checkpoint_every(p)
    common.add_dry_run(p)
    common.add_only(p)
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    head, extra = common.split_extra(argv)
    args = build_parser().parse_args(head)
    args.geodml_args = extra
    quick = args.budget == "quick"
    args.dataset = args.dataset or ("digits" if quick else "fashion-mnist")
    args.nproc = args.nproc or (2 if quick else 5)
    args.epochs_grid = args.epochs_grid or (GRID_QUICK if quick else GRID_FULL)
    args.seeds = args.seeds or (0,)
    args.norm = args.norm or paper.base_norm(args.model)
    if args.nproc < 1:
        raise StudyError(f"--nproc must be >= 1, got {args.nproc}")
    if args.processes is not None and not 1 <= args.processes <= args.nproc:
        raise StudyError(f"--processes must be in 1..--nproc ({args.nproc}), got {args.processes}")
    if not args.min_gain >= 0:
        raise StudyError(f"--min-gain must be >= 0, got {args.min_gain}")
    if args.lr is not None and not args.lr > 0:
        raise StudyError(f"--lr must be > 0, got {args.lr}")
    if args.eval_every is not None and args.eval_every < 1:
        raise StudyError(f"--eval-every must be >= 1, got {args.eval_every}")
    if args.jobs < 1:
        raise StudyError(f"--jobs must be >= 1, got {args.jobs}")
    if not args.run_timeout > 0:
        raise StudyError(f"--run-timeout must be > 0, got {args.run_timeout}")
    common.check_extra_flags(extra, CONTROLLED)
    if args.out is None:
        norm = "" if args.norm == paper.base_norm(args.model) else f"-{args.norm}"
        args.out = str(Path("runs") / f"study-{NAME}-{args.dataset}-{args.budget}-{args.model}{norm}")
    return args


def plan(args: argparse.Namespace) -> list[PlateauRun]:
    eta = args.lr or paper.paper_eta(args.nproc)
    batch = paper.paper_batch(args.nproc)
    per_epoch = max(1, common.TRAIN_SIZES[args.dataset] // (args.nproc * batch))
    runs = []
    for seed in args.seeds:
        for e in args.epochs_grid:
            budget = paper.Budget(name="full", epochs=float(e), steps=None, lr=eta, batch_size=batch,
                                  eval_every=args.eval_every or per_epoch)
            rid = f"bsp-iid-e{e}-s{seed}"
            argv = ("--algo", "bsp", "--dataset", args.dataset, "--partition", "iid", *paper.model_flags(args.model),
                    *paper.NORM_FLAGS[args.norm], "--lr", paper.fmt(paper.lr_for("bsp", eta, args.nproc, "paper")),
                    "--seed", str(seed), *budget.flags(), "--partition-scores", "all", *args.geodml_args)
            runs.append(PlateauRun(e, seed, RunSpec(rid, Path(args.out) / rid, argv, args.nproc)))
    return runs


# ---- the rule and the report ---------------------------------------------------------------------

def plateau_budget(points: list[tuple[int, float | None, float | None]], min_gain_pp: float,
                   learned: float = LEARNED) -> int | None:
    """The smallest E whose successor gains <= ``min_gain_pp`` in both mean accuracies and whose mean
    validation accuracy is >= ``learned``.

    ``points``: (E, mean validation accuracy, mean training accuracy) in increasing E, accuracies
    as fractions (None: no successful run; such an E and its predecessor cannot decide). None when
    no E of the grid qualifies."""
    for (e, val, train), (_, val2, train2) in zip(points, points[1:]):
        if None in (val, train, val2, train2):
            continue
        assert val is not None and train is not None and val2 is not None and train2 is not None
        if val >= learned and 100 * (val2 - val) <= min_gain_pp and 100 * (train2 - train) <= min_gain_pp:
            return e
    return None


def train_accuracy(summary: dict) -> float | None:
    per = summary.get("per_rank_train_accuracy")
    return statistics.fmean(per) if per else None


def build_report(args: argparse.Namespace, runs: list[PlateauRun], results: list[RunResult]) -> dict:
    by_id = {r.spec.run_id: r for r in results}
    rows = []
    for r in runs:
        res = by_id[r.spec.run_id]
        s = res.summary if res.succeeded else None
        rows.append({"run_id": r.spec.run_id, "epochs": r.epochs, "seed": r.seed, "status": res.status,
                     "val_accuracy": None if s is None else common.run_accuracy(s),
                     "train_accuracy": None if s is None else train_accuracy(s),
                     "steps": None if s is None else s.get("steps"), "wall_s": None if s is None else s.get("wall_seconds"),
                     "dir": str(r.spec.out), "error": res.error})
    budgets = []
    for e in args.epochs_grid:
        ok = [row for row in rows if row["epochs"] == e and row["val_accuracy"] is not None]
        val, val_sd = common.mean_sd([row["val_accuracy"] for row in ok])
        train, train_sd = common.mean_sd([row["train_accuracy"] for row in ok if row["train_accuracy"] is not None])
        budgets.append({"epochs": e, "val_accuracy": val, "val_sd": val_sd, "train_accuracy": train, "train_sd": train_sd,
                        "seeds": [row["seed"] for row in ok]})
    for b, nxt in zip(budgets, budgets[1:] + [None]):
        b["val_gain_pp"] = None if nxt is None or None in (b["val_accuracy"], nxt["val_accuracy"]) \
            else 100 * (nxt["val_accuracy"] - b["val_accuracy"])
        b["train_gain_pp"] = None if nxt is None or None in (b["train_accuracy"], nxt["train_accuracy"]) \
            else 100 * (nxt["train_accuracy"] - b["train_accuracy"])
    found = plateau_budget([(b["epochs"], b["val_accuracy"], b["train_accuracy"]) for b in budgets], args.min_gain)
    return {"study": NAME, "dataset": args.dataset, "model": paper.model_label(args.model, args.norm), "nproc": args.nproc,
            "eta": args.lr or paper.paper_eta(args.nproc), "batch_size": paper.paper_batch(args.nproc),
            "seeds": list(args.seeds), "min_gain_pp": args.min_gain, "plateau_epochs": found,
            "grid": list(args.epochs_grid), "budgets": budgets, "rows": rows, "geodml_args": list(args.geodml_args),
            "failed": [row["run_id"] for row in rows if row["status"] in ("failed", "timeout")]}


def format_markdown(rep: dict) -> str:
    k, eta = rep["nproc"], rep["eta"]
    found = rep["plateau_epochs"]
    verdict = (f"**Plateau budget: {found} epochs** (the smallest E whose doubling gains <= {rep['min_gain_pp']:g} pp in "
               f"both mean accuracies, at >= {100 * LEARNED:g}% validation accuracy)." if found is not None else
               f"**No plateau within the grid**: every doubling up to {rep['grid'][-1]} epochs still gains more than "
               f"{rep['min_gain_pp']:g} pp in one accuracy (or has not reached {100 * LEARNED:g}% validation accuracy); "
               f"{rep['grid'][-1]} epochs is a lower bound.")
    lines = [f"# plateau: BSP-IID budget, {rep['model']} on {rep['dataset']}, K={k}", "",
             f"BSP on IID partitions at lr {paper.fmt(round(k * eta, 12))} (K x eta, eta {eta:g}), batch {rep['batch_size']} "
             "per partition, momentum 0.9, weight decay 5e-4, lr / 10 at 50% and 75% of each budget E; seeds "
             f"{','.join(map(str, rep['seeds']))}. Validation accuracy: the partitions' own models' mean; training "
             "accuracy: each partition's model on its own training data, averaged.", "", verdict, "",
             "| budget E (epochs) | validation accuracy | gain to next E | training accuracy | gain to next E | seeds |",
             "|---|---|---|---|---|---|"]
    for b in rep["budgets"]:
        lines.append(f"| {b['epochs']} | {common.pm(b['val_accuracy'], b['val_sd'], digits=2)} | "
                     f"{'-' if b['val_gain_pp'] is None else format(b['val_gain_pp'], '+.2f') + ' pp'} | "
                     f"{common.pm(b['train_accuracy'], b['train_sd'], digits=2)} | "
                     f"{'-' if b['train_gain_pp'] is None else format(b['train_gain_pp'], '+.2f') + ' pp'} | "
                     f"{','.join(map(str, b['seeds'])) or '-'} |")
    if len(rep["seeds"]) < 2:
        lines += ["", "One seed: the gains carry no error bar; the seed noise of one cell measured elsewhere in this "
                  "project is up to ~3 pp (REPRODUCTION.md)."]
    lines += ["", "| run | E | seed | validation | training | steps | wall s | status |", "|---|---|---|---|---|---|---|---|"]
    for r in rep["rows"]:
        lines.append(f"| {r['run_id']} | {r['epochs']} | {r['seed']} | {common.pm(r['val_accuracy'], None, digits=2)} | "
                     f"{common.pm(r['train_accuracy'], None, digits=2)} | {r['steps'] or '-'} | "
                     f"{'-' if r['wall_s'] is None else format(r['wall_s'], '.0f')} | {r['status']} |")
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("run_id", "epochs", "seed", "status", "val_accuracy", "train_accuracy", "steps", "wall_s", "dir", "error")


def epoch_curve(run_dir: str) -> list[tuple[float, float]]:
    """(epoch, validation accuracy) of a run's evaluations ([] without a summary to convert steps)."""
    try:
        s = json.loads((Path(run_dir) / "summary.json").read_text())
        per_epoch = s["steps"] / s["epochs"]
    except (OSError, ValueError, KeyError, ZeroDivisionError):
        return []
    return [(step / per_epoch, acc) for step, acc in common.read_curve(run_dir)]


def write_plot(rep: dict, path: Path) -> bool:
    plt = common.matplotlib_pyplot()
    if plt is None:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    done = [b for b in rep["budgets"] if b["val_accuracy"] is not None]
    for key, sd, label in (("val_accuracy", "val_sd", "validation"), ("train_accuracy", "train_sd", "training")):
        pts = [b for b in done if b[key] is not None]
        ax1.errorbar([b["epochs"] for b in pts], [100 * b[key] for b in pts],
                     yerr=[0.0 if b[sd] is None else 100 * b[sd] for b in pts], fmt="o-", capsize=2, label=label)
    if rep["plateau_epochs"] is not None:
        ax1.axvline(rep["plateau_epochs"], color="grey", ls="--", lw=0.8, label=f"plateau budget ({rep['plateau_epochs']})")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("budget E [epochs]")
    ax1.set_ylabel("final accuracy [%]")
    ax1.legend(fontsize=7)
    ax1.set_title("final accuracy per budget (mean ± sd)", fontsize=9)
    first = rep["seeds"][0]
    for r in rep["rows"]:
        if r["seed"] == first and r["val_accuracy"] is not None:
            curve = epoch_curve(r["dir"])
            if curve:
                ax2.plot([e for e, _ in curve], [100 * a for _, a in curve], lw=1, label=f"E={r['epochs']}")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("validation accuracy [%]")
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend(fontsize=7)
    ax2.set_title(f"validation curves (seed {first})", fontsize=9)
    fig.suptitle(f"plateau: BSP-IID, {rep['model']} on {rep['dataset']}, K={rep['nproc']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def write_outputs(rep: dict, out: Path, *, plots: bool = True) -> tuple[str, list[Path]]:
    out.mkdir(parents=True, exist_ok=True)
    text = format_markdown(rep)
    (out / f"{NAME}.md").write_text(text)
    (out / f"{NAME}.json").write_text(json.dumps(rep, indent=2) + "\n")
    with open(out / f"{NAME}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rep["rows"]:
            w.writerow({k: "" if r.get(k) is None else r[k] for k in CSV_FIELDS})
    paths = [out / f"{NAME}.md", out / f"{NAME}.csv", out / f"{NAME}.json"]
    if plots and write_plot(rep, out / f"{NAME}.png"):
        paths.append(out / f"{NAME}.png")
    return text, paths


def main(argv: list[str] | None = None, *, launcher: Launcher = torchrun_launcher) -> int:
    """0: every run succeeded; 1: some run failed (reported); 2: bad arguments (nothing launched)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse(argv)
        runs = plan(args)
        common.validate_specs([r.spec for r in runs])
    except StudyError as exc:
        print(f"geodml.study {NAME}: error: {exc}", file=sys.stderr)
        return 2
    print(f"{NAME} study: BSP-IID, {paper.model_label(args.model, args.norm)} on {args.dataset}, K={args.nproc}, budgets "
          f"{','.join(map(str, args.epochs_grid))} epochs, seeds {','.join(map(str, args.seeds))}: {len(runs)} runs into "
          f"{args.out}", flush=True)
    return common.run_and_report(NAME, args, [r.spec for r in runs], launcher,
                                 lambda results: build_report(args, runs, results), write_outputs)
