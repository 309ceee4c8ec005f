"""The low-communication algorithms under label skew and an emulated WAN: ``python -m geodml.study lowcomm``
(issue 67 item 8; the page of results is docs/lowcomm.md).

Every algorithm geodml has that saves communication -- BSP with compressed gradients (PowerSGD, QSGD,
int8, int4), Gaia, DGC, FedAvg, FedAdam / FedYogi / FedAdagrad, SCAFFOLD, DiLoCo, Streaming DiLoCo,
gossip (D-PSGD) and hierarchical FedAvg -- against BSP, at one compute budget, each at its paper's
setting and at one setting that saves more communication (:data:`ENTRIES`; the second for BSP's
codecs is a stronger compression). Decisions (tests/test_study_lowcomm.py checks the plan):

* **Data and placement.** Fashion-MNIST, McMahan et al.'s CNN (582,026 parameters at 28 x 28), K = 5
  partitions on the ``five-continents`` topology (one per continent: measured latencies, illustrative
  100 Mbit/s links), minibatch 20 per partition; ``iid`` and ``label`` (100% label skew, ``--partition
  label --skew 1``). The federated algorithms also run on ``dir``: 100 clients, Dirichlet alpha 0.1
  (``--partition dirichlet --alpha 0.1``), 10% of them per round, placed cyclically over the five
  continents (``five-continents-cyclic``); hierarchical FedAvg runs only there (with one partition per
  region it is FedAvg).
* **Budget.** ``--epochs`` (full: 4, 2,400 steps at K = 5) for every run, the same number of trainer
  steps (one minibatch per computing partition per step); seeds 0, 1, 2. Validation of the global model
  on the whole test set every ``EVAL_STEPS`` steps.
* **Compute time** is emulated, not measured: ``--compute-s-per-step`` (:data:`COMPUTE_S`), so the
  emulated clock (time-to-accuracy) depends on the traffic alone and not on this machine's load.
* **Learning rates.** Momentum SGD at ``--lr`` (0.02, momentum 0.9, geodml's defaults) for the
  algorithms that average; Gaia and DGC apply the *sum* of the partitions' updates (Quagmire Appendix
  A) and run at lr / K for the same effective step; DiLoCo's inner AdamW at 1e-3 with decoupled weight
  decay 0.1 (the paper's decay; its 4e-4 rate is for transformers); FedAdam / FedYogi / FedAdagrad at
  server lr 0.01 (a value inside Reddi et al.'s tuned range; they tune it per task).
* **Time to accuracy** is the emulated second of the first validation at or above BSP-iid's mean
  final accuracy minus 1 pp ("never" when a run does not get there); per cell the mean over the seeds
  that got there, with the count.
* **Bandwidth sweep**: each paper setting also runs at ``--wan-scale`` 0.1 and 10 (every link's
  bandwidth times 0.1 or 10) for the seeds of ``--sweep-seeds`` (default: 0): the weights and bytes do
  not depend on the scale (tested), only the emulated clock does.
* **Verdict rule** (one, for every claim): two means differ when |a - b| > max(1 pp, 2 SE) with SE =
  sqrt(sd_a^2 / n_a + sd_b^2 / n_b) over seeds; otherwise they match.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geodml.study import common
from geodml.study.common import StudyError, fmt, mean_sd, pm
from geodml.study.runner import Launcher, RunResult, RunSpec, torchrun_launcher

NAME = "lowcomm"
K = 5
CLIENTS, QUICK_CLIENTS, CLIENT_FRACTION = 100, 20, 0.1
FULL_EPOCHS, QUICK_STEPS = 4.0, 40
EVAL_STEPS, QUICK_EVAL_STEPS = 100, 10
COMPUTE_S = 0.05
"""Emulated seconds of one computed step (forward and backward of a minibatch of 20 through the CNN;
a datacenter GPU takes less, a CPU more: a stated, fixed value)."""
LR, LR_ADAMW, WEIGHT_DECAY_ADAMW, SERVER_LR_ADAPTIVE = 0.02, 1e-3, 0.1, 0.01
SCALES = (1.0, 0.1, 10.0)
TARGET_GAP = 0.01
"""Time to accuracy: BSP-iid's mean final accuracy minus 1 pp."""
SKEWS = {"iid": ("--partition", "iid"), "label": ("--partition", "label", "--skew", "1.0"),
         "dir": ("--partition", "dirichlet", "--alpha", "0.1", "--client-fraction", fmt(CLIENT_FRACTION))}
SKEW_LABEL = {"iid": "IID", "label": "100% label skew", "dir": "Dirichlet 0.1"}
PEAK_KEYS = ("wan_peak_bps_by_link", "peak_bps_by_link")
"""summary.json's per-link peak rate (bits/s), under the name geodml writes it."""
CONTROLLED = ("algo", "out", "dataset", "partition", "alpha", "skew", "model", "norm", "lr", "momentum", "weight_decay",
              "batch_size", "steps", "epochs", "eval_every", "eval_at", "log_every", "seed", "partitions", "topology",
              "wan", "wan_scale", "compute_s_per_step", "client_fraction", "iter_local", "rounds")


@dataclass(frozen=True)
class Entry:
    """One algorithm at one setting."""

    key: str
    label: str
    flags: tuple[str, ...]
    setting: str
    """'paper' (its paper's setting, the sweep runs it) or 'saving' (one that communicates less)."""
    paper: str
    """Where the setting comes from."""
    skews: tuple[str, ...] = ("iid", "label")
    lr: float | None = LR
    """--lr (None: the entry's flags set it)."""
    sampled: bool = True
    """On ``dir``, sample --client-fraction of the clients each round (False: every client, HierFAVG)."""


def _sum_lr() -> float:
    return LR / K


ENTRIES: tuple[Entry, ...] = (
    Entry("bsp", "BSP", ("--algo", "bsp"), "paper", "the baseline: gradients all-reduced every step"),
    Entry("powersgd-r2", "BSP + PowerSGD r2", ("--algo", "bsp", "--compress", "powersgd", "--compress-rank", "2"), "paper",
          "Vogels et al. 2019: rank 2"),
    Entry("powersgd-r1", "BSP + PowerSGD r1", ("--algo", "bsp", "--compress", "powersgd", "--compress-rank", "1"),
          "saving", "rank 1"),
    Entry("qsgd-s16", "BSP + QSGD s16", ("--algo", "bsp", "--compress", "qsgd", "--compress-levels", "16"), "paper",
          "Alistarh et al. 2017: 4-bit (16 levels)"),
    Entry("qsgd-s4", "BSP + QSGD s4", ("--algo", "bsp", "--compress", "qsgd", "--compress-levels", "4"), "saving",
          "2-bit (4 levels)"),
    Entry("int8", "BSP + int8", ("--algo", "bsp", "--compress", "int8"), "paper", "block int8 with per-block scales"),
    Entry("int4", "BSP + int4", ("--algo", "bsp", "--compress", "int4"), "saving", "block int4"),
    Entry("gaia-t0.1", "Gaia T0 10%", ("--algo", "gaia", "--t0", "0.1"), "paper", "Quagmire's 10%", lr=_sum_lr()),
    Entry("gaia-t0.2", "Gaia T0 20%", ("--algo", "gaia", "--t0", "0.2"), "saving", "20%", lr=_sum_lr()),
    Entry("dgc-0.999", "DGC 99.9%", ("--algo", "dgc", "--sparsity", "0.999"), "paper", "Lin et al.: 99.9%",
          lr=_sum_lr()),
    Entry("dgc-0.9999", "DGC 99.99%", ("--algo", "dgc", "--sparsity", "0.9999"), "saving", "99.99%", lr=_sum_lr()),
    Entry("fedavg-20", "FedAvg I20", ("--algo", "fedavg", "--iter-local", "20"), "paper", "Quagmire's Iter_Local 20",
          skews=("iid", "label", "dir")),
    Entry("fedavg-200", "FedAvg I200", ("--algo", "fedavg", "--iter-local", "200"), "saving", "Iter_Local 200",
          skews=("iid", "label", "dir")),
    *(Entry(f"fed{o}-20", f"Fed{o.capitalize()} I20", ("--algo", "fedavg", "--iter-local", "20", "--server-optimizer", o,
                                                         "--server-lr", fmt(SERVER_LR_ADAPTIVE)), "paper",
            "Reddi et al. 2021: beta 0.9, 0.99, tau 1e-3", skews=("iid", "label", "dir")) for o in ("adam", "yogi", "adagrad")),
    Entry("fedyogi-200", "FedYogi I200", ("--algo", "fedavg", "--iter-local", "200", "--server-optimizer", "yogi",
                                          "--server-lr", fmt(SERVER_LR_ADAPTIVE)), "saving", "Iter_Local 200",
          skews=("iid", "label", "dir")),
    Entry("scaffold-20", "SCAFFOLD I20", ("--algo", "scaffold", "--iter-local", "20", "--momentum", "0"), "paper",
          "Karimireddy et al. 2020: option II, plain local SGD", skews=("iid", "label", "dir")),
    Entry("scaffold-200", "SCAFFOLD I200", ("--algo", "scaffold", "--iter-local", "200", "--momentum", "0"), "saving",
          "Iter_Local 200", skews=("iid", "label", "dir")),
    Entry("diloco-500", "DiLoCo H500", ("--algo", "diloco", "--inner-steps", "500", "--lr", fmt(LR_ADAMW),
                                         "--weight-decay", fmt(WEIGHT_DECAY_ADAMW)), "paper",
          "Douillard et al. 2023: H 500, outer Nesterov 0.7 / 0.9, inner AdamW", skews=("iid", "label", "dir"), lr=None),
    Entry("diloco-100", "DiLoCo H100", ("--algo", "diloco", "--inner-steps", "100", "--lr", fmt(LR_ADAMW),
                                         "--weight-decay", fmt(WEIGHT_DECAY_ADAMW)), "saving",
          "H 100 (more outer steps in this budget: the paper's H is for 88k-step runs)", skews=("iid", "label", "dir"),
          lr=None),
    Entry("sdiloco-100", "Streaming DiLoCo H100", ("--algo", "streaming-diloco", "--inner-steps", "100", "--lr",
                                                    fmt(LR_ADAMW), "--weight-decay", fmt(WEIGHT_DECAY_ADAMW)), "paper",
          "Douillard et al. 2025: its defaults for fragments, tau, alpha 0.5, 4-bit", lr=None),
    Entry("gossip-ring-1", "Gossip ring p1", ("--algo", "gossip", "--graph", "ring"), "paper",
          "Lian et al. 2017: D-PSGD on a ring, mixing every step"),
    Entry("gossip-ring-10", "Gossip ring p10", ("--algo", "gossip", "--graph", "ring", "--gossip-every", "10"),
          "saving", "mixing every 10 steps"),
    Entry("hierfavg", "HierFAVG", ("--algo", "hierfavg",), "paper", "Liu et al. 2020: its defaults (every client "
          "every round: the paper samples none)", skews=("dir",), sampled=False),
)
"""The plan's algorithms and settings (module docstring)."""


@dataclass(frozen=True)
class LowcommRun:
    entry: Entry
    skew: str
    seed: int
    scale: float
    spec: RunSpec = field(compare=False)


# ---- arguments ---------------------------------------------------------------------------------

def build_parser() -> common.OneLineParser:
    p = common.make_parser(NAME, "The low-communication algorithms of 2017-2025 against BSP, Gaia, DGC and FedAvg "
                           "under label skew and an emulated WAN: accuracy, WAN bytes, peak link bandwidth and "
                           "time to accuracy (geodml/study/lowcomm.py, docs/lowcomm.md).",
                           "Flags after '--' go to every geodml run. Finished runs (summary.json or a committed "
                           "record) are reused.")
    p.add_argument("--epochs", type=float, help=f"training length of every run (default: full {fmt(FULL_EPOCHS)}; "
                   f"quick: {QUICK_STEPS} steps)")
    p.add_argument("--entries", type=lambda t: tuple(x for x in t.split(",") if x), metavar="KEY[,KEY...]",
                   help="only these algorithm settings (keys as --dry-run lists them; default: all)")
    p.add_argument("--sweep-seeds", type=common.seed_list, help="seeds of the bandwidth sweep (--wan-scale 0.1 and "
                   "10, paper settings only; default: 0; quick: none)")
    p.add_argument("--no-dirichlet", action="store_true", help=f"skip the {CLIENTS}-client Dirichlet runs")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    head, extra = common.split_extra(argv)
    args = build_parser().parse_args(head)
    args.geodml_args = extra
    quick = args.budget == "quick"
    if args.rounds is not None:
        raise StudyError("--rounds: every lowcomm run has the same budget in steps; use --epochs")
    args.dataset = args.dataset or ("digits" if quick else "fashion-mnist")
    args.seeds = args.seeds or ((0,) if quick else (0, 1, 2))
    args.sweep_seeds = args.sweep_seeds if args.sweep_seeds is not None else (() if quick else (0,))
    args.lr = args.lr if args.lr is not None else LR
    common.check_common(args)
    if args.epochs is not None and not (math.isfinite(args.epochs) and args.epochs > 0):
        raise StudyError(f"--epochs must be > 0, got {args.epochs}")
    known = [e.key for e in ENTRIES]
    unknown = [k for k in (args.entries or ()) if k not in known]
    if unknown:
        raise StudyError(f"--entries: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    common.check_extra_flags(extra, CONTROLLED)
    args.out = args.out or str(Path("runs") / f"study-{NAME}-{args.dataset}-{args.budget}")
    return args


# ---- plan --------------------------------------------------------------------------------------

def length_flags(args: argparse.Namespace) -> tuple[str, ...]:
    if args.budget == "quick" and args.epochs is None:
        return ("--steps", str(QUICK_STEPS), "--eval-every", str(QUICK_EVAL_STEPS), "--log-every", str(QUICK_EVAL_STEPS))
    epochs = FULL_EPOCHS if args.epochs is None else args.epochs
    return ("--epochs", fmt(epochs), "--eval-every", str(EVAL_STEPS), "--log-every", str(EVAL_STEPS))


def run_id(entry: Entry, skew: str, seed: int, scale: float) -> str:
    return f"{entry.key}-{skew}-s{seed}" + ("" if scale == 1.0 else f"-wan{fmt(scale)}")


def plan(args: argparse.Namespace) -> list[LowcommRun]:
    out = Path(args.out)
    entries = [e for e in ENTRIES if not args.entries or e.key in args.entries]
    runs: list[LowcommRun] = []
    for entry in entries:
        for skew in entry.skews:
            if skew == "dir" and args.no_dirichlet:
                continue
            clients = (QUICK_CLIENTS if args.budget == "quick" else CLIENTS) if skew == "dir" else K
            topology = "five-continents-cyclic" if skew == "dir" else "five-continents"
            lr = () if entry.lr is None else ("--lr", fmt(args.lr if entry.lr == LR else entry.lr * args.lr / LR))
            for seed in args.seeds:
                scales = SCALES if entry.setting == "paper" and seed in args.sweep_seeds else (1.0,)
                for scale in scales:
                    skew_flags = SKEWS[skew] if entry.sampled or skew != "dir" else SKEWS[skew][:-2]   # no --client-fraction
                    argv = (*entry.flags, "--dataset", args.dataset, "--model", "cnn", *lr, *skew_flags,
                            "--topology", topology, "--wan", "virtual", "--wan-scale", fmt(scale),
                            "--compute-s-per-step", fmt(COMPUTE_S), *length_flags(args), "--seed", str(seed),
                            *args.geodml_args)
                    rid = run_id(entry, skew, seed, scale)
                    runs.append(LowcommRun(entry, skew, seed, scale, RunSpec(rid, out / rid, argv, clients)))
    assert len({r.spec.run_id for r in runs}) == len(runs)
    return runs


# ---- report ------------------------------------------------------------------------------------

def read_evals(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, emulated_s, val_accuracy) of every validation in metrics.jsonl, in step order."""
    points = {}
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("val_accuracy"), (int, float)) and "emulated_s" in rec:
            points[int(rec["step"])] = (float(rec["emulated_s"]), float(rec["val_accuracy"]))
    return [(s, t, a) for s, (t, a) in sorted(points.items())]


def time_to(evals: list[tuple[int, float, float]], target: float) -> float | None:
    """The emulated second of the first validation at or above ``target`` (None: never)."""
    return next((t for _, t, a in evals if a >= target), None)


def peak_bps(summary: dict) -> float | None:
    """The highest per-link peak rate of the run (bits/s), when geodml reported one."""
    for key in PEAK_KEYS:
        by_link = summary.get(key)
        if isinstance(by_link, dict) and by_link:
            return float(max(by_link.values()))
    return None


def differ(a: tuple[float | None, float | None, int], b: tuple[float | None, float | None, int]) -> bool | None:
    """The verdict rule (module docstring): (mean, sd, n) pairs; None without data."""
    (ma, sa, na), (mb, sb, nb) = a, b
    if ma is None or mb is None or na == 0 or nb == 0:
        return None
    se = math.sqrt((sa or 0.0) ** 2 / na + (sb or 0.0) ** 2 / nb)
    return abs(ma - mb) > max(0.01, 2 * se)


def build_report(args: argparse.Namespace, runs: list[LowcommRun], results: list[RunResult]) -> dict:
    by_id = {r.spec.run_id: r for r in results}
    rows: list[dict[str, Any]] = []
    for run in runs:
        res = by_id[run.spec.run_id]
        s = res.summary if res.succeeded else None
        rows.append({"run_id": run.spec.run_id, "entry": run.entry.key, "label": run.entry.label, "skew": run.skew,
                     "seed": run.seed, "wan_scale": run.scale, "setting": run.entry.setting, "status": res.status,
                     "error": res.error, "dir": str(run.spec.out),
                     "final_accuracy": None if s is None else s.get("final_val_accuracy"),
                     "wan_bytes": None if s is None else s.get("wan_bytes_total"),
                     "peak_bps": None if s is None else peak_bps(s),
                     "emulated_s": None if s is None else s.get("emulated_seconds"),
                     "evals": [] if s is None else read_evals(run.spec.out)})
    base = [r["final_accuracy"] for r in rows if r["entry"] == "bsp" and r["skew"] == "iid" and r["wan_scale"] == 1.0
            and r["final_accuracy"] is not None]
    bsp_iid = mean_sd(base)[0] if base else None
    target = None if bsp_iid is None else bsp_iid - TARGET_GAP
    for r in rows:
        r["tta_s"] = None if target is None else time_to(r["evals"], target)
    cells: list[dict[str, Any]] = []
    for entry in ENTRIES:
        for skew in entry.skews:
            mine = [r for r in rows if r["entry"] == entry.key and r["skew"] == skew]
            if not mine:
                continue
            at1 = [r for r in mine if r["wan_scale"] == 1.0 and r["final_accuracy"] is not None]
            acc, sd = mean_sd([r["final_accuracy"] for r in at1])
            reached = [r["tta_s"] for r in at1 if r["tta_s"] is not None]
            cell: dict[str, Any] = {
                "entry": entry.key, "label": entry.label, "setting": entry.setting, "paper": entry.paper, "skew": skew,
                "seeds_ok": len(at1), "seeds": len([r for r in mine if r["wan_scale"] == 1.0]),
                "final_accuracy": acc, "final_accuracy_sd": sd,
                "wan_bytes": mean_sd([r["wan_bytes"] for r in at1 if r["wan_bytes"] is not None])[0],
                "peak_bps": mean_sd([r["peak_bps"] for r in at1 if r["peak_bps"] is not None])[0],
                "tta_s": mean_sd(reached)[0], "tta_reached": len(reached)}
            for scale in SCALES[1:]:
                sw = [r for r in mine if r["wan_scale"] == scale and r["final_accuracy"] is not None]
                hit = [r["tta_s"] for r in sw if r["tta_s"] is not None]
                cell[f"tta_s_wan{fmt(scale)}"] = mean_sd(hit)[0] if hit else None
                cell[f"tta_runs_wan{fmt(scale)}"] = len(sw)
            cells.append(cell)
    failed = [r["run_id"] for r in rows if r["status"] in ("failed", "timeout")]
    rep = {"study": NAME, "dataset": args.dataset, "budget": args.budget, "seeds": list(args.seeds),
           "clients": QUICK_CLIENTS if args.budget == "quick" else CLIENTS,
           "sweep_seeds": list(args.sweep_seeds), "length": list(length_flags(args)), "compute_s_per_step": COMPUTE_S,
           "lr": args.lr, "bsp_iid_accuracy": bsp_iid, "target_accuracy": target, "out": str(args.out),
           "geodml_args": list(args.geodml_args), "cells": cells, "rows": rows, "failed": failed}
    rep["claims"] = claims(rep)
    return rep


def _cell(rep: dict, entry: str, skew: str) -> dict | None:
    return next((c for c in rep["cells"] if c["entry"] == entry and c["skew"] == skew), None)


def _msn(c: dict | None) -> tuple[float | None, float | None, int]:
    return (None, None, 0) if c is None else (c["final_accuracy"], c["final_accuracy_sd"], c["seeds_ok"])


DILOCO_QUOTE_MATCH = ("\"DiLoCo on 8 workers performs as well as fully synchronous optimization while communicating "
                      "500 times less\" (Douillard et al. 2023, abstract)")
DILOCO_QUOTE_ROBUST = "\"DiLoCo exhibits great robustness to the data distribution of each worker\" (abstract)"


def claims(rep: dict) -> list[dict]:
    """The DiLoCo paper's claims that apply at this scale, under the one verdict rule."""
    out = []
    bsp = {s: _cell(rep, "bsp", s) for s in ("iid", "label")}
    for key in ("diloco-500", "diloco-100"):
        for skew in ("iid", "label"):
            d = _cell(rep, key, skew)
            diff = differ(_msn(d), _msn(bsp[skew]))
            if diff is None or d is None or bsp[skew] is None:
                verdict, evidence = "no data", ""
            else:
                gap = d["final_accuracy"] - bsp[skew]["final_accuracy"]
                ratio = (bsp[skew]["wan_bytes"] / d["wan_bytes"]) if d["wan_bytes"] else None
                verdict = "supported" if not diff or gap > 0 else "not supported"
                evidence = (f"{d['label']} {pm(d['final_accuracy'], d['final_accuracy_sd'])} vs BSP "
                            f"{pm(bsp[skew]['final_accuracy'], bsp[skew]['final_accuracy_sd'])} ({100 * gap:+.1f} pp, "
                            f"{'within' if not diff else 'beyond'} max(1 pp, 2 SE)); "
                            f"{'-' if ratio is None else f'{ratio:.0f}x'} fewer WAN bytes")
            out.append({"claim": f"{key}: matches synchronous training ({SKEW_LABEL[skew]})", "paper": DILOCO_QUOTE_MATCH,
                        "verdict": verdict, "evidence": evidence})
        iid, lab = _cell(rep, key, "iid"), _cell(rep, key, "label")
        diff = differ(_msn(iid), _msn(lab))
        if diff is None or iid is None or lab is None:
            out.append({"claim": f"{key}: robust to label skew", "paper": DILOCO_QUOTE_ROBUST, "verdict": "no data",
                        "evidence": ""})
        else:
            drop = iid["final_accuracy"] - lab["final_accuracy"]
            out.append({"claim": f"{key}: robust to label skew", "paper": DILOCO_QUOTE_ROBUST,
                        "verdict": "supported" if not diff or drop < 0 else "not supported",
                        "evidence": f"IID {pm(iid['final_accuracy'], iid['final_accuracy_sd'])}, 100% label skew "
                                    f"{pm(lab['final_accuracy'], lab['final_accuracy_sd'])} ({100 * -drop:+.1f} pp)"})
    return out


def _bytes(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e9:.3g} GB"


def _secs(v: float | None, reached: int | None = None, of: int | None = None) -> str:
    if v is None:
        return "never" if of else "-"
    return f"{v:,.0f} s" + ("" if reached is None or reached == of else f" ({reached}/{of})")


def format_markdown(rep: dict) -> str:
    target = rep["target_accuracy"]
    lines = [f"# lowcomm: low-communication algorithms on {rep['dataset']}, budget {rep['budget']}", "",
             f"K = {K} partitions on five-continents (Dirichlet: {rep['clients']} clients, {int(CLIENT_FRACTION * 100)}% per "
             f"round); {' '.join(rep['length'])}; emulated compute {rep['compute_s_per_step']:g} s per step; seeds "
             f"{', '.join(map(str, rep['seeds']))} (mean +- sd); bandwidth sweep at --wan-scale 0.1 and 10 for seeds "
             f"{', '.join(map(str, rep['sweep_seeds'])) or 'none'}. Time to accuracy: first validation at or above "
             + ("-" if target is None else f"{100 * target:.1f}% (BSP-IID's {100 * rep['bsp_iid_accuracy']:.1f}% - 1 pp)")
             + ", emulated seconds.", "",
             "| algorithm | setting | data | accuracy | WAN bytes | peak link rate | time to acc. | at 0.1x bw | at 10x bw |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in rep["cells"]:
        peak = "-" if c["peak_bps"] is None else f"{c['peak_bps'] / 1e6:.3g} Mbit/s"
        lines.append(f"| {c['label']} | {c['setting']}: {c['paper']} | {SKEW_LABEL[c['skew']]} | "
                     f"{pm(c['final_accuracy'], c['final_accuracy_sd'])} | {_bytes(c['wan_bytes'])} | {peak} | "
                     f"{_secs(c['tta_s'], c['tta_reached'], c['seeds_ok'])} | "
                     f"{_secs(c['tta_s_wan0.1'], None, c['tta_runs_wan0.1'])} | "
                     f"{_secs(c['tta_s_wan10'], None, c['tta_runs_wan10'])} |")
    lines += ["", "## The DiLoCo paper's claims at this scale", "",
              "Rule: two means differ when |a - b| > max(1 pp, 2 SE), SE = sqrt(sd_a^2/n_a + sd_b^2/n_b).", ""]
    for c in rep["claims"]:
        lines.append(f"- {c['claim']}: **{c['verdict']}**" + (f". {c['evidence']}." if c["evidence"] else ".")
                     + f" Paper: {c['paper']}.")
    lines += ["", "## Runs", "", "| run | status | accuracy | WAN bytes | time to acc. |", "|---|---|---|---|---|"]
    for r in rep["rows"]:
        acc = "-" if r["final_accuracy"] is None else f"{r['final_accuracy']:.4f}"
        lines.append(f"| {r['run_id']} | {r['status']} | {acc} | {_bytes(r['wan_bytes'])} | "
                     f"{_secs(r['tta_s'], None, 1 if r['final_accuracy'] is not None else 0)} |")
    for r in rep["rows"]:
        if r["status"] in ("failed", "timeout"):
            lines.append(f"\nFailed (excluded): {r['run_id']}: {r['error']}")
    return "\n".join(lines) + "\n"


RUN_FIELDS = ("run_id", "entry", "skew", "seed", "wan_scale", "setting", "status", "final_accuracy", "wan_bytes",
              "peak_bps", "emulated_s", "tta_s", "dir", "error")
CELL_FIELDS = ("entry", "label", "setting", "skew", "seeds_ok", "seeds", "final_accuracy", "final_accuracy_sd",
               "wan_bytes", "peak_bps", "tta_s", "tta_reached", "tta_s_wan0.1", "tta_s_wan10", "paper")


def write_csvs(rep: dict, out: Path) -> list[Path]:
    paths = []
    for name, fields, items in ((f"{NAME}.csv", RUN_FIELDS, rep["rows"]), (f"{NAME}_cells.csv", CELL_FIELDS, rep["cells"])):
        path = out / name
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            w.writeheader()
            for item in items:
                w.writerow({k: "" if item.get(k) is None else item[k] for k in fields})
        paths.append(path)
    return paths


def write_plots(rep: dict, out: Path) -> list[Path]:
    plt = common.matplotlib_pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for skew, marker in (("iid", "o"), ("label", "s"), ("dir", "^")):
        pts = [c for c in rep["cells"] if c["skew"] == skew and c["wan_bytes"] and c["final_accuracy"] is not None]
        if not pts:
            continue
        ax.scatter([c["wan_bytes"] for c in pts], [100 * c["final_accuracy"] for c in pts], marker=marker,
                   label=SKEW_LABEL[skew])
        for c in pts:
            ax.annotate(c["label"], (c["wan_bytes"], 100 * c["final_accuracy"]), fontsize=6)
    ax.set_xscale("log")
    ax.set_xlabel("WAN bytes (whole run)")
    ax.set_ylabel("final accuracy [%]")
    ax.legend(fontsize=7)
    fig.tight_layout()
    scatter = out / "accuracy_vs_bytes.png"
    fig.savefig(scatter, dpi=90)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5), sharey=True)
    for ax, skew in zip(axes, ("iid", "label")):
        for c in rep["cells"]:
            if c["skew"] != skew or c["setting"] != "paper":
                continue
            pts = [(s, c[f"tta_s_wan{fmt(s)}"] if s != 1.0 else c["tta_s"]) for s in sorted(SCALES)]
            pts = [(s, t) for s, t in pts if t is not None]
            if pts:
                ax.plot([100 * s for s, _ in pts], [t for _, t in pts], marker="o", label=c["label"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(SKEW_LABEL[skew], fontsize=9)
        ax.set_xlabel("link bandwidth [Mbit/s]")
    axes[0].set_ylabel("emulated time to accuracy [s]")
    axes[1].legend(fontsize=6)
    fig.tight_layout()
    sweep = out / "time_vs_bandwidth.png"
    fig.savefig(sweep, dpi=90)
    plt.close(fig)
    return [scatter, sweep]


def write_outputs(rep: dict, out: Path, *, plots: bool = True) -> tuple[str, list[Path]]:
    return common.write_outputs(NAME, rep, out, markdown=format_markdown, csvs=write_csvs,
                                plots=write_plots if plots else None)


# ---- entry point -------------------------------------------------------------------------------

def prepare(argv: list[str]) -> tuple[argparse.Namespace, list[LowcommRun]]:
    args = parse(argv)
    runs = plan(args)
    common.validate_specs([r.spec for r in runs])
    return args, runs


def main(argv: list[str] | None = None, *, launcher: Launcher = torchrun_launcher) -> int:
    """0: every run succeeded; 1: some run failed (reported); 2: bad arguments (nothing launched)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, runs = prepare(argv)
    except StudyError as exc:
        print(f"geodml.study {NAME}: error: {exc}", file=sys.stderr)
        return 2
    print(f"{NAME} study: {len(runs)} runs on {args.dataset} ({len({r.entry.key for r in runs})} algorithm settings), "
          f"seeds {','.join(map(str, args.seeds))}, into {args.out}", flush=True)
    return common.run_and_report(NAME, args, [r.spec for r in runs], launcher,
                                 lambda results: build_report(args, runs, results), write_outputs)
