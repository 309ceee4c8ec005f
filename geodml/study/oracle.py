"""The Oracle baseline of Quagmire §7.3 (Figure 8): ``python -m geodml.study oracle``.

Oracle is "the ideal, yet unrealistic, approach that selects the most communication-efficient
theta that retains model accuracy, by running all possible theta in each setting prior to
measured execution". This study runs, as torchrun subprocesses (geodml.study.runner):

(a) BSP in the IID setting: its final validation accuracy is the accuracy target (Figure 8:
    "all results achieve the same accuracy as BSP in the IID setting");
(b) BSP in the requested setting: the communication reference (savings = bytes_BSP / bytes);
(c) the algorithm at every theta of its grid (the grid of its ``KNOB``, geodml.algorithms; ``--grid``
    restricts it) in the requested setting;
(d) with ``--with-skewscout``: the algorithm with ``--skewscout``, started from the middle of
    the algorithm's full grid (SkewScout searches the full grid whatever ``--grid`` says).

Decisions (documented, tested in tests/test_oracle.py):

* A run's accuracy is ``common.run_accuracy``: the mean of its partitions' own models' accuracies,
  what the authors' released code reports (geodml.study.paper, "Which accuracy"). A run *meets the
  target* when that accuracy >= acc(BSP-IID) - tolerance (absolute, 0.01 = one percentage point;
  1e-12 of slack absorbs float rounding).
* Oracle = among the successful theta runs (c) that meet the target, the one with the fewest
  ``wan_bytes_total`` (every kind counted); equal bytes go to the more communication-
  conservative theta (the one earlier in the algorithm's grid order, which lists the most
  communication first: smaller T0 / Iter_Local, longer DGC warm-up). BSP and SkewScout are
  never Oracle candidates. No candidate -> "no theta reaches the target"; a failed BSP-IID ->
  no target, no Oracle.
* Failed runs (non-zero exit, timeout, no summary.json) are shown in the table with their
  exit code and excluded from every comparison; the exit status is then 1.
* Run directories are deterministic (``OUT/bsp-iid``, ``OUT/bsp-label-1``, ``OUT/gaia-t0-0.1``,
  ``OUT/gaia-skewscout-t0-0.2``); a directory with summary.json is reused. With
  ``--partition iid`` (a) and (b) are the same run.
* Extra geodml flags after ``--`` go to every run; flags the study sets itself (algo, data
  split, theta, SkewScout, out) are refused there.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from geodml.config import DATASETS, KNOB_ALGOS, DataConfig
from geodml.study import common
from geodml.study.common import StudyError, run_accuracy
from geodml.study.runner import Launcher, RunResult, RunSpec, finite_floats, torchrun_launcher

THETA_FLAGS = {"t0": "--t0", "iter_local": "--iter-local", "e_warm": "--e-warm"}
ALGO_LABEL = {"gaia": "Gaia", "fedavg": "FedAvg", "dgc": "DGC"}
# geodml flag dests the study sets itself, so they may not appear after "--"
CONTROLLED = ("algo", "out", "dataset", "partition", "skew", "alpha", "shards_per_partition", "skewscout",
              "t0", "iter_local", "e_warm", "partition_eval_examples", "rounds", "eval_every_rounds")
EPS = 1e-12


# ---- pure selection logic -------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """One theta run: its summary (None if the run failed) and its grid order (0 = most communication)."""

    theta: float
    summary: dict | None
    order: int
    run_id: str = ""

    @property
    def accuracy(self) -> float | None:
        return None if self.summary is None else run_accuracy(self.summary)

    @property
    def wan_bytes(self) -> int | None:
        return None if self.summary is None else self.summary.get("wan_bytes_total")


def meets_target(accuracy: float | None, target: float | None, tolerance: float) -> bool:
    if accuracy is None or target is None:
        return False
    return accuracy >= target - tolerance - EPS


def select_oracle(candidates: list[Candidate], target: float | None, tolerance: float) -> Candidate | None:
    """Most communication-efficient candidate within ``tolerance`` of ``target`` (see module docstring)."""
    ok = [c for c in candidates if c.summary is not None and c.wan_bytes is not None
          and meets_target(c.accuracy, target, tolerance)]
    return min(ok, key=lambda c: (c.wan_bytes, c.order), default=None)


def savings(bsp_bytes: int | None, run_bytes: int | None) -> float | None:
    """bytes_BSP / bytes_run (None when either is unknown or the run sent nothing)."""
    if not bsp_bytes or not run_bytes:
        return None
    return bsp_bytes / run_bytes


def conservative_order(values: tuple[float, ...], algo_grid: tuple[float, ...]) -> tuple[float, ...]:
    """``values`` ordered like the algorithm's grid: most communication first."""
    descending = len(algo_grid) > 1 and algo_grid[0] > algo_grid[-1]
    return tuple(sorted(set(values), reverse=descending))


def format_theta(value: float) -> str:
    """Shortest exact text: 0.1 -> '0.1', 20.0 -> '20' (--iter-local takes integers)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


# ---- planning -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Planned:
    role: str  # "bsp-iid" (the accuracy target), "bsp" (same setting), "theta", "skewscout"
    theta: float | None
    spec: RunSpec


ORACLE_PARTITIONS = ("iid", "label", "dirichlet", "shards")
"""The partitions whose parameters setting_name and data_flags carry (longtail and entropy are not wired in yet)."""


def setting_name(args: argparse.Namespace) -> str:
    if args.partition == "label":
        return f"label-{format_theta(args.skew)}"
    if args.partition == "dirichlet":
        return f"dirichlet-{format_theta(args.alpha)}"
    if args.partition == "shards":
        return f"shards-{args.shards_per_partition}"
    return "iid"


def data_flags(args: argparse.Namespace, partition: str) -> list[str]:
    flags = ["--dataset", args.dataset, "--partition", partition]
    if partition == "label":
        flags += ["--skew", format_theta(args.skew)]
    elif partition == "dirichlet":
        flags += ["--alpha", format_theta(args.alpha)]
    elif partition == "shards":
        flags += ["--shards-per-partition", str(args.shards_per_partition)]
    return flags


def default_out(args: argparse.Namespace) -> Path:
    return Path("runs") / f"oracle-{args.algo}-{args.dataset}-{setting_name(args)}-k{args.nproc}"


def plan(args: argparse.Namespace, theta_name: str, grid: tuple[float, ...], algo_grid: tuple[float, ...]) -> list[Planned]:
    """The runs, deduplicated by run id (with --partition iid, BSP-IID is also the same-setting BSP)."""
    out, setting, extra = Path(args.out), setting_name(args), list(args.geodml_args)
    flag, knob = THETA_FLAGS[theta_name], theta_name.replace("_", "-")
    runs = [Planned("bsp-iid", None, RunSpec("bsp-iid", out / "bsp-iid", ("--algo", "bsp", *data_flags(args, "iid"), *extra),
                                             args.nproc)),
            Planned("bsp", None, RunSpec(f"bsp-{setting}", out / f"bsp-{setting}",
                                         ("--algo", "bsp", *data_flags(args, args.partition), *extra), args.nproc))]
    for theta in grid:
        rid = f"{args.algo}-{knob}-{format_theta(theta)}"
        runs.append(Planned("theta", theta, RunSpec(rid, out / rid, ("--algo", args.algo, *data_flags(args, args.partition),
                                                                     flag, format_theta(theta), *extra), args.nproc)))
    if args.with_skewscout:
        start = algo_grid[len(algo_grid) // 2]
        rid = f"{args.algo}-skewscout-{knob}-{format_theta(start)}"
        runs.append(Planned("skewscout", start, RunSpec(rid, out / rid, ("--algo", args.algo, *data_flags(args, args.partition),
                                                                         flag, format_theta(start), "--skewscout", *extra),
                                                        args.nproc)))
    unique: dict[str, Planned] = {}
    for p in runs:
        unique.setdefault(p.spec.run_id, p)
    return list(unique.values())


# ---- arguments and validation ----------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    data = DataConfig()
    p = argparse.ArgumentParser(
        prog="python -m geodml.study oracle", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Oracle baseline (Quagmire section 7.3, Figure 8): BSP-IID sets the accuracy target; the algorithm "
                    "runs at every theta of its grid; Oracle = fewest WAN bytes within --tolerance of the target.",
        epilog="Flags after '--' go to every geodml run, e.g. -- --epochs 5 --model logreg. Finished runs "
               "(summary.json) are reused.")
    p.add_argument("--algo", choices=KNOB_ALGOS, default="gaia", help="algorithm whose theta is searched")
    p.add_argument("--dataset", choices=DATASETS, default=data.dataset)
    p.add_argument("--partition", choices=ORACLE_PARTITIONS, default="label", help="the requested (non-IID) setting")
    p.add_argument("--skew", type=float, default=data.skew, help="--partition label: fraction partitioned by label")
    p.add_argument("--alpha", type=float, default=data.alpha, help="--partition dirichlet: concentration")
    p.add_argument("--shards-per-partition", type=int, default=data.shards_per_partition, help="--partition shards")
    p.add_argument("--nproc", type=int, default=5, help="partitions (torchrun --nproc_per_node)")
    p.add_argument("--processes", type=int, help="processes per run R (default: one per partition); each hosts a "
                   "block of the --nproc partitions; results do not depend on R, so finished runs are reused")
    p.add_argument("--tolerance", type=float, default=0.01, help="accepted accuracy below BSP-IID's (absolute)")
    p.add_argument("--grid", type=finite_floats,
                   help="restrict the knob's grid, e.g. 0.05,0.5 (default: the algorithm's whole grid)")
    p.add_argument("--with-skewscout", action="store_true", help="also run the algorithm with --skewscout from the grid's middle")
    p.add_argument("--out", help="study directory (default runs/oracle-ALGO-DATASET-SETTING-kNPROC)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time")
    p.add_argument("--run-timeout", type=float, default=1800.0, help="seconds before a run is killed and reported")
    common.add_checkpoint_every(p)
    common.add_dry_run(p)
    common.add_only(p)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Study flags, then '--' and the geodml flags for every run. argparse errors exit 2."""
    head, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = build_parser()
    args = parser.parse_args(head)
    args.geodml_args = tuple(extra)
    for name, ok, want in (("--nproc", args.nproc >= 1, ">= 1"), ("--jobs", args.jobs >= 1, ">= 1"),
                           ("--tolerance", math.isfinite(args.tolerance) and args.tolerance >= 0, ">= 0"),
                           ("--run-timeout", math.isfinite(args.run_timeout) and args.run_timeout > 0, "> 0")):
        if not ok:
            parser.error(f"{name} must be {want}, got {getattr(args, name[2:].replace('-', '_'))}")
    if args.out is None:
        args.out = str(default_out(args))
    return args


def resolve_grid(algo: str, grid: tuple[float, ...] | None) -> tuple[str, tuple[float, ...], tuple[float, ...]]:
    """(theta_name, grid to run in conservative order, the algorithm's full grid)."""
    from geodml.algorithms import algorithm_factory
    knob = algorithm_factory(algo).KNOB
    assert knob is not None, f"{algo} has no knob"  # --algo choices are KNOB_ALGOS
    algo_grid = tuple(float(v) for v in knob.grid)
    return knob.name, conservative_order(grid or algo_grid, algo_grid), algo_grid


# ---- report -------------------------------------------------------------------------------

def trajectory_text(summary: dict) -> str:
    """SkewScout's theta changes: '0.2@0 -> 0.3@500' (repeats collapsed)."""
    points, last = [], None
    for p in summary.get("theta_trajectory") or []:
        if p.get("theta") != last:
            points.append(f"{format_theta(p['theta'])}@{p['step']}")
            last = p.get("theta")
    return " -> ".join(points) if points else "(no decisions)"


def build_report(args: argparse.Namespace, theta_name: str, grid: tuple[float, ...], runs: list[Planned],
                 results: list[RunResult]) -> dict:
    by_id = {r.spec.run_id: r for r in results}
    setting = setting_name(args)
    target_res, bsp_res = by_id["bsp-iid"], by_id[f"bsp-{setting}"]
    target = run_accuracy(target_res.summary) if target_res.succeeded and target_res.summary else None
    bsp_bytes = bsp_res.summary["wan_bytes_total"] if bsp_res.succeeded else None
    rows = []
    for p in runs:
        res = by_id[p.spec.run_id]
        s = res.summary if res.succeeded else None
        acc = None if s is None else run_accuracy(s)
        wan = None if s is None else s.get("wan_bytes_total")
        row = {"run_id": p.spec.run_id, "role": p.role, "theta": p.theta, **res.to_dict(), "accuracy": acc,
               "wan_bytes_total": wan, "savings": savings(bsp_bytes, wan) if s is not None else None,
               "meets_target": meets_target(acc, target, args.tolerance) if s is not None else None}
        if p.role == "skewscout" and s is not None:
            row.update(theta_final=s.get("theta_final"), theta_trajectory=s.get("theta_trajectory"))
        rows.append(row)
    cands = [Candidate(p.theta, by_id[p.spec.run_id].summary if by_id[p.spec.run_id].succeeded else None, i, p.spec.run_id)
             for i, p in enumerate(r for r in runs if r.role == "theta")]
    best = select_oracle(cands, target, args.tolerance)
    oracle = None if best is None else {"run_id": best.run_id, "theta": best.theta, "accuracy": best.accuracy,
                                        "wan_bytes_total": best.wan_bytes, "savings": savings(bsp_bytes, best.wan_bytes)}
    scout = next((r for r in rows if r["role"] == "skewscout"), None)
    if scout is not None and oracle is not None and scout["wan_bytes_total"]:
        scout["bytes_vs_oracle"] = scout["wan_bytes_total"] / oracle["wan_bytes_total"] if oracle["wan_bytes_total"] else None
    return {"study": "oracle", "paper": "Quagmire section 7.3, Figure 8", "algo": args.algo, "theta_name": theta_name,
            "grid": list(grid), "dataset": args.dataset, "partition": args.partition, "setting": setting,
            "nproc": args.nproc, "tolerance": args.tolerance, "geodml_args": list(args.geodml_args), "out": str(args.out),
            "target": None if target is None else {"run_id": "bsp-iid", "accuracy": target, "threshold": target - args.tolerance},
            "bsp": {"run_id": f"bsp-{setting}", "wan_bytes_total": bsp_bytes},
            "oracle": oracle, "oracle_note": oracle_note(target, oracle, cands, args.tolerance),
            "skewscout": scout, "failed": [r["run_id"] for r in rows if r["status"] in ("failed", "timeout")], "runs": rows}


def oracle_note(target: float | None, oracle: dict | None, cands: list[Candidate], tolerance: float) -> str:
    if target is None:
        return "no accuracy target: the BSP-IID run failed"
    if oracle is not None:
        return "most communication-efficient theta within tolerance of BSP-IID"
    done = [c for c in cands if c.summary is not None]
    if not done:
        return "no theta run succeeded"
    best = max(done, key=lambda c: c.accuracy)
    return (f"no theta reaches the target {target - tolerance:.4f} (best: theta={format_theta(best.theta)} "
            f"with accuracy {best.accuracy:.4f})")


def _bytes(n: int | None) -> str:
    from geodml.metrics.sinks import human_bytes
    return "-" if n is None else f"{human_bytes(n)} ({n:,} B)"


def _x(v: float | None) -> str:
    return "-" if v is None else f"x{v:.2f}"


def _role_label(report: dict, row: dict) -> str:
    algo = ALGO_LABEL[report["algo"]]
    if row["role"] == "bsp-iid":
        return "BSP, IID (target)" + (" = same-setting BSP" if report["setting"] == "iid" else "")
    return {"bsp": f"BSP, {report['setting']}", "theta": algo, "skewscout": f"{algo} + SkewScout"}[row["role"]]


def _theta_cell(row: dict) -> str:
    if row["theta"] is None:
        return "-"
    if row["role"] == "skewscout":
        final = row.get("theta_final")
        return f"{format_theta(row['theta'])} -> {format_theta(final)}" if final is not None else format_theta(row["theta"])
    return format_theta(row["theta"])


def format_table(report: dict) -> str:
    """The Figure 8-style table (markdown) and the Oracle / SkewScout lines."""
    oracle_id = (report["oracle"] or {}).get("run_id")
    lines = [f"# Oracle baseline: {ALGO_LABEL[report['algo']]} on {report['dataset']}, {report['setting']}, "
             f"K={report['nproc']} (Quagmire section 7.3, Figure 8)", "",
             f"| run | algorithm | theta ({report['theta_name']}) | final accuracy | WAN bytes | savings over BSP "
             "| meets target |",
             "|---|---|---|---|---|---|---|"]
    for row in report["runs"]:
        if row["status"] in ("failed", "timeout"):
            acc, meets = f"{row['status'].upper()} (exit {row['returncode']})", "excluded"
        else:
            acc = f"{row['accuracy']:.4f}"
            meets = ("yes" if row["meets_target"] else "no") + (" (Oracle)" if row["run_id"] == oracle_id else "")
        lines.append(f"| {row['run_id']} | {_role_label(report, row)} | {_theta_cell(row)} | {acc} | "
                     f"{_bytes(row['wan_bytes_total'])} | {_x(row['savings'])} | {meets} |")
    lines.append("")
    t = report["target"]
    lines.append("Target: none (BSP-IID failed)" if t is None else
                 f"Target: BSP-IID accuracy {t['accuracy']:.4f} - tolerance {report['tolerance']:g} = {t['threshold']:.4f}")
    o = report["oracle"]
    lines.append(f"Oracle: none: {report['oracle_note']}" if o is None else
                 f"Oracle: theta={format_theta(o['theta'])} ({report['theta_name']}), savings {_x(o['savings'])} over BSP, "
                 f"accuracy {o['accuracy']:.4f}, WAN bytes {_bytes(o['wan_bytes_total'])}"
                 + ("; it sends more than BSP in this setting" if o["savings"] is not None and o["savings"] < 1 else ""))
    s = report["skewscout"]
    if s is not None:
        if s["status"] in ("failed", "timeout"):
            lines.append(f"SkewScout: {s['status']} ({s['error']})")
        else:
            vs = f"; {s['bytes_vs_oracle']:.2f}x the Oracle's bytes" if s.get("bytes_vs_oracle") else ""
            lines.append(f"SkewScout: savings {_x(s['savings'])}, accuracy {s['accuracy']:.4f} "
                         f"({'meets' if s['meets_target'] else 'misses'} the target), "
                         f"theta trajectory {trajectory_text({'theta_trajectory': s.get('theta_trajectory')})}{vs}")
    for row in report["runs"]:
        if row["status"] in ("failed", "timeout"):
            lines.append(f"Failed (excluded): {row['run_id']}: {row['error']}; stderr: {Path(row['dir']) / 'stderr.txt'}")
    return "\n".join(lines) + "\n"


def write_outputs(report: dict, out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    table = format_table(report)
    (out / "oracle.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "oracle.md").write_text(table)
    return table


# ---- entry point --------------------------------------------------------------------------

def prepare(argv: list[str]) -> tuple[argparse.Namespace, str, tuple[float, ...], list[Planned]]:
    """Parse and validate everything; raises StudyError (argparse errors exit 2 themselves)."""
    args = parse_args(argv)
    common.check_extra_flags(args.geodml_args, CONTROLLED)
    theta_name, grid, algo_grid = resolve_grid(args.algo, args.grid)
    runs = plan(args, theta_name, grid, algo_grid)
    common.validate_specs([p.spec for p in runs])
    return args, theta_name, grid, runs


def main(argv: list[str] | None = None, *, launcher: Launcher = torchrun_launcher) -> int:
    """0: every run succeeded; 1: some run failed (reported); 2: bad arguments; 130: interrupted."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, theta_name, grid, runs = prepare(argv)
    except StudyError as exc:
        print(f"geodml.study oracle: error: {exc}", file=sys.stderr)
        return 2
    print(f"oracle study: {len(runs)} runs of {args.algo} ({theta_name} in {', '.join(map(format_theta, grid))}) "
          f"on {args.dataset}, {setting_name(args)}, K={args.nproc}, into {args.out}", flush=True)
    specs = [p.spec for p in runs]
    if args.only:
        return common.run_only("oracle", args, specs, launcher)
    if args.dry_run:
        common.print_plan(specs)
        return 0
    report = build_report(args, theta_name, grid, runs, common.run_specs(args, specs, launcher))
    print("\n" + write_outputs(report, Path(args.out)) + f"\nwritten: {Path(args.out) / 'oracle.json'}, "
          f"{Path(args.out) / 'oracle.md'}", flush=True)
    return 1 if report["failed"] else 0
