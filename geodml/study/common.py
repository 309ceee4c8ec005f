"""Shared parts of the studies (geodml.study.*; the parser is iwds's, vanlier's and plateau's,
``run_and_report`` theirs and the Quagmire studies', the rest every study's).

* Arguments: a parser whose errors are one line (``geodml.study NAME: error: ...``, exit 2), the
  common flags (``--budget``, ``--seeds``, ``--jobs``, ``--processes``, ``--out``, ``--dry-run`` ...), the
  check that flags after ``--`` do not touch what the study sets itself, and every run's flags through
  geodml's preflight before anything launches.
* Running: ``run_specs`` (the plan at ``--jobs``, reusing finished runs), ``run_only`` (``--only``: some of
  the plan's runs, no report) and ``run_and_report``.
* Run directories read back: the test-accuracy curve of ``metrics.jsonl``, the label counts of
  ``partitions.json`` and, for a saved global model (``model.pt``), its test-set ROC AUC.
* Seed statistics (mean, sample standard deviation) and a Spearman rank correlation.

ROC AUC (no geodml run computes it): the report step rebuilds the run's network from its
``config.json`` (``geodml.models.build_model``), loads ``model.pt`` (the final global model), and
scores the run's own test set (``geodml.data.load_dataset`` with the run's dataset, data directory
and seed): ``roc_auc`` is the one-vs-rest macro average of the per-class ROC AUCs of the softmax
probabilities (scikit-learn ``roc_auc_score(multi_class="ovr", average="macro")``);
``roc_auc_hard`` is the same of one-hot argmax predictions, where each class's AUC is
(1 + TPR - FPR) / 2 (its balanced accuracy): the only ROC AUC the van Lier thesis's code can have
computed, since it saves argmax predictions only (github.com/stanvanlier/FedAvg_DMOZdistributions,
``src/models/train_model.py``). The result is cached next to the model as ``study_roc_auc.json``,
keyed on ``model.pt``'s size and modification time.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from geodml.config import DATASETS
from geodml.study.runner import (
    AUTO_CHECKPOINT_STEPS,
    LAUNCH_FILE,
    Launcher,
    RunResult,
    RunSpec,
    is_running,
    read_summary,
    resume_step,
    run_all,
)

ROC_CACHE = "study_roc_auc.json"
TRAIN_SIZES = {"digits": 1438, "fashion-mnist": 60000, "mnist": 60000, "cifar10": 50000}
"""Training-set sizes of geodml's datasets (digits: its seeded 80/20 split, geodml.data.datasets)."""


class StudyError(ValueError):
    """Bad study arguments, found before anything is launched (exit 2)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line error (``geodml.study NAME: error: ...``) and exit 2, no usage dump."""

    study = "study"

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"geodml.study {self.study}: error: {message}\n")


def run_accuracy(summary: dict) -> float:
    """The Quagmire studies' accuracy of a finished run: the mean of its partitions' own models'
    validation accuracies (``per_rank_val_accuracy``), what the authors' released code reports
    (geodml.study.paper, "Which accuracy"); ``final_val_accuracy`` for a summary without them."""
    per = summary.get("per_rank_val_accuracy")
    return statistics.fmean(per) if per else summary["final_val_accuracy"]


def seed_list(text: str) -> tuple[int, ...]:
    """argparse type of ``--seeds 0,1,2``: distinct integers >= 0."""
    try:
        seeds = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 0,1,2, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected distinct seeds >= 0, got {text!r}")
    return seeds


def int_list(text: str) -> tuple[int, ...]:
    """argparse type of a list of distinct integers >= 0 (``--entropy-steps 0,5,10``)."""
    try:
        values = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 0,5,10, got {text!r}") from None
    if not values or any(v < 0 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct integers >= 0, got {text!r}")
    return values


def make_parser(name: str, description: str, epilog: str) -> OneLineParser:
    p = OneLineParser(prog=f"python -m geodml.study {name}", description=description, epilog=epilog,
                      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.study = name
    p.add_argument("--budget", choices=("quick", "full"), default="full",
                   help="quick: tiny runs on digits that check the machinery (seconds each); full: the paper's protocol "
                        "(docs/study.md gives its run count and machine time)")
    p.add_argument("--dataset", choices=DATASETS, help="default: digits for quick, fashion-mnist for full")
    p.add_argument("--seeds", type=seed_list, help="seeds; every configuration runs once per seed (default: full 0,1,2; "
                   "quick 0)")
    p.add_argument("--rounds", type=int, help="communication rounds per run")
    p.add_argument("--lr", type=float, help="learning rate of the local momentum SGD")
    p.add_argument("--out", help=f"study directory (default runs/study-{name}-DATASET-BUDGET)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time")
    p.add_argument("--processes", type=int, default=1, help="processes per run; each hosts a block of the run's "
                   "partitions (results do not depend on it, so finished runs are reused whatever it was)")
    p.add_argument("--run-timeout", type=float, default=4 * 3600.0, help="seconds before a run is killed and reported")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    add_checkpoint_every(p)
    add_dry_run(p)
    add_only(p)
    return p


def steps_or_zero(text: str) -> int:
    """argparse type of --checkpoint-every: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of steps >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of steps >= 0 (0: no checkpoints), got {value}")
    return value


def add_checkpoint_every(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint-every", type=steps_or_zero, metavar="STEPS",
                   help="each run's --checkpoint-every: a run cut short (the machine or session went away) is resumed "
                        "from its checkpoints by the next invocation instead of starting again; 0: none (default: "
                        f"{AUTO_CHECKPOINT_STEPS} steps; results do not depend on it)")


def add_dry_run(p: argparse.ArgumentParser) -> None:
    """Every study's ``--dry-run`` (print_plan)."""
    p.add_argument("--dry-run", action="store_true", help="print the plan (every run's id and geodml flags, and which "
                   "are finished and would be reused) after the arguments are checked; launch nothing")


def run_id_list(text: str) -> tuple[str, ...]:
    """argparse type of ``--only ID,ID``: distinct, non-empty run ids (as ``--dry-run`` lists them)."""
    ids = tuple(x for x in text.replace(" ", "").split(",") if x)
    if not ids or len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"expected distinct comma-separated run ids, as --dry-run lists them, "
                                         f"got {text!r}")
    return ids


def add_only(p: argparse.ArgumentParser) -> None:
    """A study's ``--only`` (run_only)."""
    p.add_argument("--only", type=run_id_list, metavar="RUN_ID[,RUN_ID...]",
                   help="run (or reuse) only these runs of the plan, ids as --dry-run lists them: to fill a failed run, "
                        "to add a few runs at a time on a busy machine, or to split the plan over machines that share "
                        "the study directory; the report is not written (run the same command without --only once the "
                        "plan is finished: it reuses them)")


def select_only(specs: Sequence[RunSpec], only: Sequence[str], *, later_note: str = "") -> list[RunSpec]:
    """The specs whose run ids are in ``only``, in plan order; StudyError naming every id the plan lacks
    (``later_note``: why some runs are not planned yet, appended to that error)."""
    known = {s.run_id for s in specs}
    missing = [x for x in only if x not in known]
    if missing:
        raise StudyError(f"--only: not in this plan: {', '.join(missing)} (--dry-run lists its {len(specs)} run ids"
                         f"{'; ' + later_note if later_note else ''})")
    wanted = set(only)
    return [s for s in specs if s.run_id in wanted]


def print_plan(specs: Sequence[RunSpec]) -> None:
    """``--dry-run``'s listing: the run count, how many are finished (summary.json: reused, not run again) or
    running (another study process on this directory holds the run's lock), interrupted with checkpoints (resumed
    from them), and each run's state, id and flags."""

    def state(s: RunSpec) -> str:
        if read_summary(s.out) is not None:
            return "finished"
        if is_running(s):
            return "running"
        return "resume" if (Path(s.out) / LAUNCH_FILE).exists() and resume_step(s)[0] is not None else "to run"
    states = [state(s) for s in specs]
    print(f"plan: {len(specs)} runs, {states.count('finished')} finished (reused), {states.count('running')} running "
          f"(another study process), {states.count('resume')} to resume from their checkpoints, "
          f"{states.count('to run')} to run; nothing launched (--dry-run)", flush=True)
    for spec, state in zip(specs, states):
        print(f"  {state:<8} {spec.run_id}: {' '.join(spec.argv)}", flush=True)


def split_extra(argv: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """(study flags, geodml flags after '--')."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], tuple(argv[i + 1:])
    return argv, ()


def check_common(args: argparse.Namespace) -> None:
    """The common flags' ranges (StudyError)."""
    if args.rounds is not None and args.rounds < 1:
        raise StudyError(f"--rounds must be >= 1, got {args.rounds}")
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        raise StudyError(f"--lr must be > 0, got {args.lr}")
    if args.jobs < 1:
        raise StudyError(f"--jobs must be >= 1, got {args.jobs}")
    if args.processes < 1:
        raise StudyError(f"--processes must be >= 1, got {args.processes}")
    if not (math.isfinite(args.run_timeout) and args.run_timeout > 0):
        raise StudyError(f"--run-timeout must be > 0, got {args.run_timeout}")


def final_rounds(value: int | None, *, rounds: int, quick: bool, full: int) -> int:
    """--final-rounds W (a run's final accuracy: the mean over its last W rounds): ``value``, or quick 1 and
    ``full`` otherwise, at most ``rounds``; StudyError outside 1..rounds."""
    w = min(1 if quick else full, rounds) if value is None else value
    if not 1 <= w <= rounds:
        raise StudyError(f"--final-rounds must be in 1..{rounds} (the rounds of a run), got {w}")
    return w


def check_extra_flags(extra: Sequence[str], controlled: Sequence[str]) -> None:
    """Flags after '--' must parse as geodml flags and leave alone what the study sets (``controlled``: dests)."""
    from geodml.cli import UsageError
    from geodml.cli import build_parser as geodml_parser
    try:
        given = vars(geodml_parser().parse_args(list(extra)))  # argument_default=SUPPRESS: only the flags given
    except UsageError as exc:
        raise StudyError(f"flags after '--': {exc}") from None
    taken = [f"--{d.replace('_', '-')}" for d in given if d in controlled]
    if taken:
        raise StudyError(f"flags after '--': {', '.join(taken)} are set by the study (use the study's own flags)")
    if "divergence_loss" in given:
        raise StudyError("flags after '--': --divergence-loss is not supported in a study: its reports read each run's "
                         "whole curve, and a run stopped early would be reported over the rounds it ran")


def validate_specs(specs: Sequence[RunSpec]) -> None:
    """Every run's flags through geodml's own preflight (no data decoded) and reuse safety, before any launch."""
    from geodml.study.runner import validate_spec
    for spec in specs:
        try:
            validate_spec(spec)
        except ValueError as exc:
            raise StudyError(f"run {spec.run_id}: {exc}") from None


def run_specs(args: argparse.Namespace, specs: Sequence[RunSpec], launcher: Launcher, *,
              on_result: Callable[[RunResult], None] | None = None) -> list[RunResult]:
    """Run (or reuse) ``specs`` at the study's ``--jobs``, ``--run-timeout`` and ``--processes``, logging to stdout."""
    return run_all(list(specs), jobs=args.jobs, timeout_s=args.run_timeout, launcher=launcher,
                   processes=args.processes, log=lambda m: print(m, flush=True), on_result=on_result,
                   checkpoint_every=args.checkpoint_every)


def run_only(name: str, args: argparse.Namespace, specs: Sequence[RunSpec], launcher: Launcher, *,
             total: int | None = None, later_note: str = "",
             on_result: Callable[[RunResult], None] | None = None) -> int:
    """``--only``: the runs of ``specs`` it names (listed with --dry-run, else run or reused), and no report;
    ``total``: the plan's run count when ``specs`` is not all of it (default ``len(specs)``). 0: each succeeded;
    1: some failed; 2: an id ``specs`` lacks (one error line, nothing launched)."""
    try:
        chosen = select_only(specs, args.only, later_note=later_note)
    except StudyError as exc:
        print(f"geodml.study {name}: error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print_plan(chosen)
        return 0
    failed = [r.spec.run_id for r in run_specs(args, chosen, launcher, on_result=on_result) if not r.succeeded]
    total = len(specs) if total is None else total
    print(f"--only: {len(chosen)} of the plan's {total} runs; no report written (run the same command without --only "
          f"once the plan is finished: it reuses every finished run)", flush=True)
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def run_and_report(name: str, args: argparse.Namespace, specs: Sequence[RunSpec], launcher: Launcher,
                   report: Callable[[list[RunResult]], dict], write: Callable[..., tuple[str, list[Path]]]) -> int:
    """The end of a study's main: run ``specs`` (run_specs), build the report from the results, write it
    (``write(report, out, plots=...)``), print it and the failed runs. 0: every run succeeded; 1: some failed
    (reported). ``--dry-run``: print_plan, 0. ``--only``: run_only (no report)."""
    if args.only:
        return run_only(name, args, specs, launcher)
    if args.dry_run:
        print_plan(specs)
        return 0
    rep = report(run_specs(args, specs, launcher))
    text, paths = write(rep, Path(args.out), plots=not args.no_plots)
    print("\n" + text + "\nwritten: " + ", ".join(str(p) for p in paths), flush=True)
    if rep["failed"]:
        print(f"{len(rep['failed'])} run(s) failed: {', '.join(rep['failed'])}", file=sys.stderr)
    return 1 if rep["failed"] else 0


def fmt(value: float) -> str:
    """Shortest exact text of a number: 0.1 -> '0.1', 20.0 -> '20'."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


# ---- run directories read back ------------------------------------------------------------------

def read_curve(run_dir: Path | str) -> list[tuple[int, float]]:
    """(step, val_accuracy) of every evaluation in the run's metrics.jsonl, in step order ([] when absent)."""
    path = Path(run_dir) / "metrics.jsonl"
    points: dict[int, float] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("val_accuracy"), (int, float)) and isinstance(rec.get("step"), int):
            points[rec["step"]] = float(rec["val_accuracy"])
    return sorted(points.items())


def label_counts(run_dir: Path | str) -> list[list[int]] | None:
    """The (partition, label) count matrix of the run's partitions.json, or None."""
    try:
        doc = json.loads((Path(run_dir) / "partitions.json").read_text())
    except (OSError, ValueError):
        return None
    counts = doc.get("label_counts") if isinstance(doc, dict) else None
    return counts if isinstance(counts, list) else None


def mean_sd(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(mean, sample standard deviation); sd None below two values, both None for none."""
    vals = [float(v) for v in values]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) >= 2 else None)


def pm(mean: float | None, sd: float | None, *, scale: float = 100.0, digits: int = 1, unit: str = "%") -> str:
    """'85.3 +- 0.4%' (scale 100: accuracies as percent); '-' when there is no value."""
    if mean is None:
        return "-"
    text = f"{scale * mean:.{digits}f}"
    return text + (f" +- {scale * sd:.{digits}f}" if sd is not None else "") + unit


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1  # ties share their average rank
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None below 3 pairs or for a constant series."""
    if len(x) != len(y) or len(x) < 3:
        return None
    rx, ry = _ranks(x), _ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


# ---- ROC AUC of a saved model ---------------------------------------------------------------------

def roc_auc_scores(labels, probabilities, num_classes: int) -> dict[str, float]:
    """``roc_auc`` (one-vs-rest macro ROC AUC of the probabilities), ``roc_auc_hard`` (the same of one-hot
    argmax predictions) and ``accuracy``, for int labels [N] and probabilities [N, num_classes]."""
    import numpy as np
    from sklearn.metrics import roc_auc_score
    y = np.asarray(labels, dtype=np.int64)
    p = np.asarray(probabilities, dtype=np.float64)
    pred = p.argmax(axis=1)
    onehot = np.zeros_like(p)
    onehot[np.arange(len(pred)), pred] = 1.0
    classes = list(range(num_classes))
    return {"roc_auc": float(roc_auc_score(y, p, multi_class="ovr", average="macro", labels=classes)),
            "roc_auc_hard": float(roc_auc_score(y, onehot, multi_class="ovr", average="macro", labels=classes)),
            "accuracy": float((pred == y).mean())}


DatasetLoader = Callable[..., Any]
"""(dataset name, data directory, seed, cache setting) -> a geodml.data.Dataset."""


def load_run_dataset(name: str, data_dir: str | None, seed: int, cache: str | None):
    """The dataset a run trained on (geodml.data.load_dataset through the shared decoded cache)."""
    from geodml.data.datasets import load_dataset, resolve_cache_dir
    return load_dataset(name, data_dir, seed=seed, cache_dir=resolve_cache_dir(cache))


def run_roc_auc(run_dir: Path | str, *, loader: DatasetLoader = load_run_dataset, datasets: dict | None = None) -> dict:
    """ROC AUC of the run's final global model (module docstring); cached in ``study_roc_auc.json``.
    ``datasets`` memoizes loaded test sets across runs (key: dataset, data directory, digits' seed)."""
    import torch

    from geodml.models import build_model
    run = Path(run_dir)
    model_file = run / "model.pt"
    stat = model_file.stat()
    key = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    cache_file = run / ROC_CACHE
    try:
        cached = json.loads(cache_file.read_text())
        if cached.get("model_pt") == key:
            return cached["scores"]
    except (OSError, ValueError, AttributeError, KeyError):
        pass
    cfg = json.loads((run / "config.json").read_text())["config"]
    data, m = cfg["data"], cfg["model"]
    seed = int(cfg.get("seed", 0)) if data["dataset"] == "digits" else 0  # only digits' split depends on the seed
    dkey = (data["dataset"], data.get("data_dir"), seed)
    memo = datasets if datasets is not None else {}
    if dkey not in memo:
        memo[dkey] = loader(data["dataset"], data.get("data_dir"), seed, data.get("cache"))
    ds = memo[dkey]
    model = build_model(m["model"], m["norm"], tuple(ds.test_x.shape[1:]), int(ds.num_classes),
                        gn_group_size=m.get("gn_group_size"), gn_groups=m.get("gn_groups"),
                        input_scale=ds.pixel_std)
    model.load_state_dict(torch.load(model_file, map_location="cpu", weights_only=True))
    model.eval()
    with torch.no_grad():
        probs = torch.cat([torch.softmax(model(ds.test_x[i:i + 1000]).double(), dim=1)
                           for i in range(0, len(ds.test_y), 1000)])
    scores = roc_auc_scores(ds.test_y.numpy(), probs.numpy(), int(ds.num_classes))
    counts = torch.bincount(ds.test_y, minlength=int(ds.num_classes))
    scores["majority_accuracy"] = float(counts.max()) / float(counts.sum())  # the thesis's "base classifier"
    try:
        cache_file.write_text(json.dumps({"model_pt": key, "scores": scores}, indent=2) + "\n")
    except OSError:
        pass
    return scores


def matplotlib_pyplot():
    """matplotlib.pyplot on the Agg backend, or None with a warning when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("warning: matplotlib is not installed; no PNGs (pip install 'geodml[plot]')", file=sys.stderr)
        return None
    return plt


def write_outputs(name: str, rep: dict, out: Path, *, markdown: Callable[[dict], str],
                  csvs: Callable[[dict, Path], list[Path]], plots: Callable[[dict, Path], list[Path]] | None
                  ) -> tuple[str, list[Path]]:
    """A study's NAME.md, its CSVs, NAME.json and (``plots`` given) its PNGs in ``out``: the
    markdown text and every path written."""
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(rep)
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps(rep, indent=2) + "\n")
    paths = [out / f"{name}.md", *csvs(rep, out), out / f"{name}.json"]
    return text, paths + (plots(rep, out) if plots is not None else [])
