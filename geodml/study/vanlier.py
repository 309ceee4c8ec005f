"""van Lier 2018, "Robustness of Federated Averaging for Non-IID Data" (BSc thesis, Radboud University;
/work/shared/papers/vanlier2018-fedavg-noniid-dmoz.txt): ``python -m geodml.study vanlier``.

The thesis (Sections 3.1.3-3.2) gives 1,984 DMOZ topics one client each, places every page on the
client of its topic (the minimum-entropy distribution d_0, unbalanced clients), builds d_1..d_100
by moving every sample to a related client (or keeping it, with twice the weight) iteration by
iteration, and trains FedAvg (C = 0.1, E = 5, B = 64, multinomial logistic regression, Adam lr
0.001, 250 rounds) on d_0, d_5, d_10, d_25, d_50, d_75, d_100 and a random distribution d_iid,
against centralized training ("Distribution = none"), by test accuracy and ROC AUC (Figures
3.4, 3.5). Its claims: the score correlates strongly with the distribution (entropy, Figure 3.3:
-sum_{k,y} Pr(k, y) log Pr(k, y)); at d_50, d_75, d_100 and d_iid FedAvg beats centralized
training in accuracy, while centralized training has the best ROC AUC; beyond d_75 the
distributions hardly differ. The text gives no numbers (figures only), so the report's paper
column quotes these claims with their section and figure.

geodml's construction on Fashion-MNIST's label tree is ``--partition entropy --entropy-steps N``
(geodml.data.partition, EntropyPartitioner: its source and what differs from DMOZ). This study
runs, per seed of ``--seeds`` (full: 0, 1, 2), FedAvg on every d_N of ``--entropy-steps`` and
on d_iid (``--partition iid``), and centralized training: 9 configurations, 27 runs at three
seeds. Decisions (tests/test_study_iwds_vanlier.py; docs/study.md lists the deviations):

* **Clients.** ``--clients`` (full: the thesis's 1,984; 60,000 / 1,984 = 30.2 examples on
  average). FedAvg with client sampling runs on geodml's pool engine (geodml/pool.py: the
  process's partitions as state on one worker model), which ``--engine auto`` picks when the
  partitions outnumber the processes (``--processes``, default 1).
* **FedAvg.** ``--client-fraction 0.1``: m = floor(0.1 x 1,984) = 198 clients per round, the
  thesis code's ``round(C K)`` (its text says ceil, 199); the average over the round's
  participants weighted by n_k (its interpretation 1, Section 2.1). Local solver: momentum SGD
  (geodml has no Adam), lr ``--lr`` (0.01), momentum 0.9, no weight decay, the buffer reset
  every round (``--reset-momentum``: the thesis's code builds a fresh optimizer per client and
  round). Local work: ``--local-steps`` (full 5) steps of B = 64 for every participant, the
  thesis's step count for its average client (E = 5 epochs of ceil(30.2 / 64) = 1 minibatch);
  the thesis's clients take 5 x ceil(n_k / 64) steps, so its large clients take more. geodml's
  ``--local-epochs`` would give that, but its rounds then last as long as their longest
  participant (a run is specified in steps, not rounds) and it needs the threads engine, one
  thread per partition: not used (docs/study.md).
* **Centralized training** is ``--algo bsp`` on one partition holding the whole training set
  (``--partition iid``, one process): plain momentum SGD, same batch, lr and momentum, no
  weight decay. One "round" of it is as many minibatches as a FedAvg round computes (m x
  local steps), so the curves share the x-axis at equal gradient computations.
* **Entropy** of every run's distribution is the thesis's ``-sum Pr(k, y) log2 Pr(k, y)`` (bits;
  the thesis writes log without a base) of the run's own partitions.json label counts
  (geodml.data.partition.joint_entropy); the mean over seeds is reported.
* **Accuracy** is the run's final global model on the whole test set (summary.json); **ROC
  AUC** is computed by this report from that model (geodml.study.common: one-vs-rest macro of
  the softmax probabilities, and ``hard`` from argmax predictions, as the thesis's code could).
* **Claims.** (1) Spearman rank correlation of the distributions' mean entropy with FedAvg's
  mean final accuracy and ROC AUC; (2) FedAvg's accuracy minus centralized training's for the
  high-entropy distributions (d_N with N >= 50, d_iid); (3) FedAvg's ROC AUC minus centralized
  training's for every distribution; each verdict also names which differences exceed the seed
  standard deviation.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geodml.study import common
from geodml.study.common import StudyError, fmt, mean_sd, pm
from geodml.study.runner import Launcher, RunResult, RunSpec, torchrun_launcher

NAME = "vanlier"
PAPER_REF = "van Lier 2018 (BSc thesis) Section 3.2, Figures 3.3-3.5"
CLIENTS, QUICK_CLIENTS = 1984, 20
CLIENT_FRACTION = 0.1
BATCH = 64
LOCAL_EPOCHS = 5
ENTROPY_STEPS, QUICK_ENTROPY_STEPS = (0, 5, 10, 25, 50, 75, 100), (0, 5)
FULL_ROUNDS, QUICK_ROUNDS, QUICK_LOCAL_STEPS = 250, 3, 1
LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 0.0
HIGH_ENTROPY_STEPS = 50
"""The thesis: FedAvg beats centralized accuracy at d_50, d_75, d_100 and d_iid."""
MODELS = ("logreg", "mlp", "cnn")
CONTROLLED = ("algo", "out", "dataset", "partition", "alpha", "tail", "client_size", "skew", "shards_per_partition",
              "entropy_steps", "model", "norm", "lr", "momentum", "weight_decay", "batch_size", "steps", "epochs",
              "iter_local", "local_epochs", "client_fraction", "eval_every", "eval_at", "log_every", "seed", "iwds", "iwds_mode",
              "prox_mu", "fednova", "reset_momentum", "partitions", "fedir", "virtual_client_size", "server_momentum",
              "server_lr", "server_nesterov", "lr_milestones", "lr_schedule", "skewscout", "rounds", "eval_every_rounds")
PAPER_CLAIM = {
    "low": "lower scores at low entropy; the score correlates with the distribution (Section 3.2, Figure 3.4)",
    "d0": "lowest score, yet above the majority-class base classifier (Chapter 4, Figure 3.4)",
    "high": "accuracy above centralized training, ROC AUC below it (Section 3.2, Figures 3.4-3.5)",
    "iid": "the highest score after enough rounds; accuracy above centralized, ROC AUC below (Section 3.2)",
    "central": "the best ROC AUC of all (Section 3.2, Chapter 4)",
}


# ---- arguments ---------------------------------------------------------------------------------

def build_parser() -> common.OneLineParser:
    p = common.make_parser(NAME, f"{PAPER_REF}: FedAvg over distributions of rising label entropy against "
                           "centralized training, by accuracy and ROC AUC (geodml/study/vanlier.py, docs/study.md).",
                           "Flags after '--' go to every geodml run (e.g. -- --comm-timeout 300). Finished runs "
                           "(summary.json) are reused; ROC AUC is computed from each run's model.pt and cached there.")
    p.add_argument("--clients", type=int, help=f"FedAvg clients K (default: full {CLIENTS}, the thesis's; quick "
                   f"{QUICK_CLIENTS})")
    p.add_argument("--entropy-steps", type=common.int_list, help="distribution iterations d_N to run (default: full the "
                   f"thesis's {','.join(map(str, ENTROPY_STEPS))}; quick {','.join(map(str, QUICK_ENTROPY_STEPS))}); "
                   "d_iid and centralized training always run")
    p.add_argument("--client-fraction", type=float, default=CLIENT_FRACTION, help="FedAvg C (m = floor(C K))")
    p.add_argument("--local-steps", type=int, help=f"local steps per participant and round (default: full {LOCAL_EPOCHS}, "
                   f"the thesis's E = {LOCAL_EPOCHS} epochs of its average client; quick {QUICK_LOCAL_STEPS})")
    p.add_argument("--batch-size", type=int, default=BATCH, help="minibatch size (the thesis's B)")
    p.add_argument("--model", choices=MODELS, default="logreg",
                   help="logreg: the thesis's multinomial logistic regression; mlp, cnn: McMahan et al.'s networks")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    head, extra = common.split_extra(argv)
    args = build_parser().parse_args(head)
    args.geodml_args = extra
    quick = args.budget == "quick"
    args.dataset = args.dataset or ("digits" if quick else "fashion-mnist")
    args.seeds = args.seeds or ((0,) if quick else (0, 1, 2))
    args.rounds = args.rounds if args.rounds is not None else (QUICK_ROUNDS if quick else FULL_ROUNDS)
    args.lr = args.lr if args.lr is not None else LR
    args.clients = args.clients if args.clients is not None else (QUICK_CLIENTS if quick else CLIENTS)
    args.entropy_steps = args.entropy_steps or (QUICK_ENTROPY_STEPS if quick else ENTROPY_STEPS)
    args.local_steps = args.local_steps if args.local_steps is not None else (QUICK_LOCAL_STEPS if quick else LOCAL_EPOCHS)
    common.check_common(args)
    if args.clients < 10:
        raise StudyError(f"--clients must be >= 10 (the entropy construction gives every class at least one client), "
                         f"got {args.clients}")
    if args.clients > common.TRAIN_SIZES[args.dataset]:
        raise StudyError(f"--clients {args.clients} exceeds the {common.TRAIN_SIZES[args.dataset]} training examples "
                         f"of {args.dataset}")
    if not (math.isfinite(args.client_fraction) and 0 < args.client_fraction <= 1):
        raise StudyError(f"--client-fraction must be in (0, 1], got {args.client_fraction}")
    if args.local_steps < 1:
        raise StudyError(f"--local-steps must be >= 1, got {args.local_steps}")
    if args.batch_size < 1:
        raise StudyError(f"--batch-size must be >= 1, got {args.batch_size}")
    common.check_extra_flags(extra, CONTROLLED)
    args.out = args.out or str(Path("runs") / f"study-{NAME}-{args.dataset}-{args.budget}")
    return args


def participants(args: argparse.Namespace) -> int:
    from geodml.algorithms.fedavg import num_participants
    return num_participants(args.client_fraction, args.clients)


# ---- plan --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VanLierRun:
    kind: str
    """'entropy' (d_N), 'iid' (d_iid) or 'central'."""
    steps: int | None
    """N of d_N (None for d_iid and centralized)."""
    seed: int
    spec: RunSpec
    steps_per_round: int
    """Trainer steps per (round-equivalent): local steps for FedAvg, m x local steps centralized."""

    @property
    def label(self) -> str:
        return {"entropy": f"d_{self.steps}", "iid": "d_iid", "central": "central"}[self.kind]


def plan(args: argparse.Namespace) -> list[VanLierRun]:
    out, local, m = Path(args.out), args.local_steps, participants(args)
    common_flags = ("--dataset", args.dataset, "--model", args.model, "--norm", "none", "--batch-size", str(args.batch_size),
                    "--lr", fmt(args.lr), "--momentum", fmt(MOMENTUM), "--weight-decay", fmt(WEIGHT_DECAY))
    runs = []
    for seed in args.seeds:
        tail = ("--wan", "off", "--seed", str(seed), *args.geodml_args)
        fedavg = ("--algo", "fedavg", *common_flags, "--reset-momentum", "--client-fraction", fmt(args.client_fraction),
                  "--iter-local", str(local), "--steps", str(args.rounds * local), "--eval-every", str(local),
                  "--log-every", str(local))
        for n in args.entropy_steps:
            rid = f"fedavg-d{n}-s{seed}"
            argv = (*fedavg, "--partition", "entropy", "--entropy-steps", str(n), *tail)
            runs.append(VanLierRun("entropy", n, seed, RunSpec(rid, out / rid, argv, args.clients), local))
        rid = f"fedavg-iid-s{seed}"
        runs.append(VanLierRun("iid", None, seed, RunSpec(rid, out / rid, (*fedavg, "--partition", "iid", *tail),
                                                            args.clients), local))
        per_round = m * local
        rid = f"central-s{seed}"
        argv = ("--algo", "bsp", *common_flags, "--partition", "iid", "--steps", str(args.rounds * per_round),
                "--eval-every", str(per_round), "--log-every", str(per_round), *tail)
        runs.append(VanLierRun("central", None, seed, RunSpec(rid, out / rid, argv, 1), per_round))
    assert len({r.spec.run_id for r in runs}) == len(runs)
    return runs


# ---- report ------------------------------------------------------------------------------------

def paper_claim(kind: str, steps: int | None) -> str:
    if kind == "central":
        return PAPER_CLAIM["central"]
    if kind == "iid":
        return PAPER_CLAIM["iid"]
    if steps is not None and steps >= HIGH_ENTROPY_STEPS:
        return PAPER_CLAIM["high"]
    return PAPER_CLAIM["d0"] if steps == 0 else PAPER_CLAIM["low"]


def build_report(args: argparse.Namespace, runs: list[VanLierRun], results: list[RunResult], *,
                 loader: common.DatasetLoader = common.load_run_dataset) -> dict:
    import numpy as np

    from geodml.data.partition import joint_entropy
    by_id = {r.spec.run_id: r for r in results}
    datasets: dict = {}
    rows: list[dict[str, Any]] = []
    for run in runs:
        res = by_id[run.spec.run_id]
        s = res.summary if res.succeeded else None
        row: dict[str, Any] = {"run_id": run.spec.run_id, "distribution": run.label, "kind": run.kind, "entropy_steps": run.steps,
               "seed": run.seed, "clients": run.spec.nproc, "status": res.status, "error": res.error,
               "returncode": res.returncode, "dir": str(run.spec.out),
               "final_accuracy": None if s is None else s.get("final_val_accuracy"),
               "final_val_loss": None if s is None else s.get("final_val_loss"),
               "wall_s": None if s is None else s.get("wall_seconds"),
               "entropy_bits": None, "roc_auc": None, "roc_auc_hard": None, "model_accuracy": None,
               "majority_accuracy": None, "roc_error": None, "curve": []}
        if s is not None:
            counts = common.label_counts(run.spec.out)
            row["entropy_bits"] = None if counts is None else joint_entropy(np.asarray(counts))
            row["curve"] = [(step / run.steps_per_round, acc) for step, acc in common.read_curve(run.spec.out)]
            try:
                sc = common.run_roc_auc(run.spec.out, loader=loader, datasets=datasets)
                row.update(roc_auc=sc["roc_auc"], roc_auc_hard=sc["roc_auc_hard"], model_accuracy=sc["accuracy"],
                           majority_accuracy=sc.get("majority_accuracy"))
            except Exception as exc:  # a missing model.pt or dataset: reported, the rest of the report stands
                row["roc_error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    labels = list(dict.fromkeys(r.label for r in runs))
    dists: list[dict[str, Any]] = []
    for label in labels:
        mine = [r for r in rows if r["distribution"] == label]
        ok = [r for r in mine if r["final_accuracy"] is not None]
        d: dict[str, Any] = {"distribution": label, "kind": mine[0]["kind"], "entropy_steps": mine[0]["entropy_steps"],
             "seeds_ok": len(ok), "seeds": len(mine), "paper": paper_claim(mine[0]["kind"], mine[0]["entropy_steps"])}
        for key in ("entropy_bits", "final_accuracy", "roc_auc", "roc_auc_hard"):
            d[key], d[f"{key}_sd"] = mean_sd([r[key] for r in ok if r[key] is not None])
        curves = [r["curve"] for r in ok if r["curve"]]
        rounds = set.intersection(*(set(x for x, _ in c) for c in curves)) if curves else set()
        d["curve"] = [(x, sum(dict(c)[x] for c in curves) / len(curves)) for x in sorted(rounds)]
        dists.append(d)
    central = next((d for d in dists if d["kind"] == "central"), None)
    for d in dists:
        for key, out_key in (("final_accuracy", "acc_vs_central"), ("roc_auc", "auc_vs_central"),
                             ("roc_auc_hard", "auc_hard_vs_central")):
            both = central is not None and d[key] is not None and central[key] is not None and d["kind"] != "central"
            d[out_key] = d[key] - central[key] if both and central is not None else None
    majority = next((r["majority_accuracy"] for r in rows if r["majority_accuracy"] is not None), None)
    failed = [r["run_id"] for r in rows if r["status"] in ("failed", "timeout")]
    rep = {"study": NAME, "paper": PAPER_REF, "dataset": args.dataset, "budget": args.budget, "seeds": list(args.seeds),
           "clients": args.clients, "client_fraction": args.client_fraction, "participants": participants(args),
           "rounds": args.rounds, "local_steps": args.local_steps, "batch_size": args.batch_size, "lr": args.lr,
           "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY, "model": args.model, "majority_accuracy": majority,
           "geodml_args": list(args.geodml_args), "out": str(args.out), "distributions": dists, "rows": rows,
           "failed": failed}
    rep["claims"] = claims(rep)
    return rep


def _noise(d: dict, central: dict, key: str) -> float:
    return max(d.get(f"{key}_sd") or 0.0, central.get(f"{key}_sd") or 0.0)


def claims(rep: dict) -> list[dict]:
    """The thesis's three claims with the measured evidence (module docstring)."""
    dists = rep["distributions"]
    fed = [d for d in dists if d["kind"] != "central" and d["entropy_bits"] is not None]
    central = next((d for d in dists if d["kind"] == "central" and d["final_accuracy"] is not None), None)
    out = []
    xs = [d["entropy_bits"] for d in fed]
    accs, aucs = [d["final_accuracy"] for d in fed], [d["roc_auc"] for d in fed]
    rho_acc = common.spearman(xs, accs) if None not in accs else None
    rho_auc = common.spearman(xs, aucs) if None not in aucs else None
    if rho_acc is None:
        verdict = "no data (needs 3 distributions with results)"
    else:
        verdict = "supported" if rho_acc >= 0.7 and (rho_auc is None or rho_auc >= 0.7) else (
            "partly" if rho_acc > 0 else "not supported")
    out.append({"claim": "FedAvg's score rises with the distribution's entropy (strong correlation)",
                "paper": "Section 3.2, Figures 3.3-3.4; Chapter 4", "verdict": verdict,
                "evidence": "Spearman rank correlation of mean entropy with mean final accuracy "
                            f"{'-' if rho_acc is None else f'{rho_acc:+.2f}'}, with ROC AUC "
                            f"{'-' if rho_auc is None else f'{rho_auc:+.2f}'} over {len(fed)} distributions "
                            "(verdict: supported at >= +0.7 for both)"})
    high = [d for d in fed if d["kind"] == "iid" or (d["entropy_steps"] or 0) >= HIGH_ENTROPY_STEPS]
    if central is None or not high or any(d["acc_vs_central"] is None for d in high):
        out.append({"claim": "at high entropy FedAvg's accuracy is above centralized training's",
                    "paper": "Section 3.2 (d_50, d_75, d_100, d_iid), Chapter 4", "verdict": "no data", "evidence": ""})
    else:
        above = [d for d in high if d["acc_vs_central"] >= 0]
        parts = [f"{d['distribution']} {100 * d['acc_vs_central']:+.1f} pp"
                 + (" (within seed sd)" if abs(d["acc_vs_central"]) <= _noise(d, central, "final_accuracy") else "")
                 for d in high]
        out.append({"claim": "at high entropy FedAvg's accuracy is above centralized training's",
                    "paper": "Section 3.2 (d_50, d_75, d_100, d_iid), Chapter 4",
                    "verdict": "supported" if len(above) == len(high) else "partly" if above else "not supported",
                    "evidence": f"FedAvg - centralized accuracy: {', '.join(parts)} (centralized "
                                f"{pm(central['final_accuracy'], central['final_accuracy_sd'])})"})
    if central is None or central["roc_auc"] is None or not fed or any(d["auc_vs_central"] is None for d in fed):
        out.append({"claim": "centralized training has the best ROC AUC", "paper": "Section 3.2, Chapter 4",
                    "verdict": "no data", "evidence": ""})
    else:
        below = [d for d in fed if d["auc_vs_central"] < 0]
        hard = [d for d in fed if d["auc_hard_vs_central"] is not None and d["auc_hard_vs_central"] < 0]
        parts = [f"{d['distribution']} {d['auc_vs_central']:+.4f}" for d in fed]
        out.append({"claim": "centralized training has the best ROC AUC", "paper": "Section 3.2, Chapter 4",
                    "verdict": "supported" if len(below) == len(fed) else "partly" if below else "not supported",
                    "evidence": f"FedAvg - centralized ROC AUC (probabilities): {', '.join(parts)} (centralized "
                                f"{pm(central['roc_auc'], central['roc_auc_sd'], scale=1, digits=4, unit='')}); from "
                                f"argmax predictions (the thesis code's) centralized is above {len(hard)} of {len(fed)}"})
    return out


def format_markdown(rep: dict) -> str:
    m, k = rep["participants"], rep["clients"]
    maj = rep["majority_accuracy"]
    lines = [f"# vanlier: {rep['paper']} on {rep['dataset']}, {rep['model']}, {k} clients, budget {rep['budget']}", "",
             f"FedAvg: {k} clients, m = {m} per round, {rep['rounds']} rounds of {rep['local_steps']} local momentum-SGD "
             f"steps (batch {rep['batch_size']}, lr {rep['lr']:g}, momentum {rep['momentum']:g}, reset every round, weight "
             f"decay {rep['weight_decay']:g}). Centralized: one partition holding all data, the same solver, "
             f"{m * rep['local_steps']} steps per round-equivalent. Seeds {', '.join(map(str, rep['seeds']))}; mean +- sd "
             "over seeds. Entropy: -sum Pr(k,y) log2 Pr(k,y) of the run's partitions (bits). ROC AUC: one-vs-rest macro of "
             "the final global model's softmax probabilities on the test set (hard: of its argmax predictions)."
             + (f" Majority-class base classifier: accuracy {100 * maj:.1f}%, ROC AUC 0.5." if maj is not None else ""), "",
             "The thesis's text gives no numbers (Figures 3.3-3.5 are curves); the paper column quotes its claims.", "",
             "| distribution | entropy [bits] | accuracy | vs central | ROC AUC | vs central | ROC AUC (hard) | paper |",
             "|---|---|---|---|---|---|---|---|"]
    for d in rep["distributions"]:
        ent = "-" if d["kind"] == "central" or d["entropy_bits"] is None else (
            f"{d['entropy_bits']:.3f}" + (f" +- {d['entropy_bits_sd']:.3f}" if d["entropy_bits_sd"] else ""))
        dacc = "-" if d["acc_vs_central"] is None else f"{100 * d['acc_vs_central']:+.1f} pp"
        dauc = "-" if d["auc_vs_central"] is None else f"{d['auc_vs_central']:+.4f}"
        lines.append(f"| {d['distribution']} | {ent} | {pm(d['final_accuracy'], d['final_accuracy_sd'])} | {dacc} | "
                     f"{pm(d['roc_auc'], d['roc_auc_sd'], scale=1, digits=4, unit='')} | {dauc} | "
                     f"{pm(d['roc_auc_hard'], d['roc_auc_hard_sd'], scale=1, digits=4, unit='')} | {d['paper']} |")
    lines += ["", "## Claims: the measured evidence", ""]
    for c in rep["claims"]:
        lines.append(f"- {c['claim']} (paper: {c['paper']}): **{c['verdict']}**"
                     + (f". {c['evidence']}." if c["evidence"] else "."))
    lines += ["", "## Runs", "", "| run | distribution | clients | seed | entropy [bits] | accuracy | ROC AUC | ROC AUC (hard) "
              "| status |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rep["rows"]:
        acc = "-" if r["final_accuracy"] is None else f"{r['final_accuracy']:.4f}"
        ent = "-" if r["entropy_bits"] is None else f"{r['entropy_bits']:.3f}"
        auc = "-" if r["roc_auc"] is None else f"{r['roc_auc']:.4f}"
        hard = "-" if r["roc_auc_hard"] is None else f"{r['roc_auc_hard']:.4f}"
        status = r["status"] if r["status"] in ("ok", "reused") else f"{r['status'].upper()} (exit {r['returncode']})"
        lines.append(f"| {r['run_id']} | {r['distribution']} | {r['clients']} | {r['seed']} | {ent} | {acc} | {auc} | {hard} | "
                     f"{status} |")
    for r in rep["rows"]:
        if r["roc_error"]:
            lines.append(f"\nROC AUC not computed for {r['run_id']}: {r['roc_error']}")
        if r["status"] in ("failed", "timeout"):
            lines.append(f"\nFailed (excluded): {r['run_id']}: {r['error']}; stderr: {Path(r['dir']) / 'stderr.txt'}")
    return "\n".join(lines) + "\n"


RUN_FIELDS = ("run_id", "distribution", "entropy_steps", "seed", "clients", "status", "entropy_bits", "final_accuracy",
              "roc_auc", "roc_auc_hard", "model_accuracy", "final_val_loss", "wall_s", "dir", "error", "roc_error")
DIST_FIELDS = ("distribution", "entropy_steps", "seeds_ok", "seeds", "entropy_bits", "entropy_bits_sd", "final_accuracy",
               "final_accuracy_sd", "acc_vs_central", "roc_auc", "roc_auc_sd", "auc_vs_central", "roc_auc_hard",
               "roc_auc_hard_sd", "auc_hard_vs_central", "paper")


def write_csvs(rep: dict, out: Path) -> list[Path]:
    runs_csv, dist_csv = out / f"{NAME}.csv", out / f"{NAME}_distributions.csv"
    for path, fields, rows in ((runs_csv, RUN_FIELDS, rep["rows"]), (dist_csv, DIST_FIELDS, rep["distributions"])):
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            w.writeheader()
            w.writerows([{k: ("" if r.get(k) is None else r[k]) for k in fields} for r in rows])
    return [runs_csv, dist_csv]


def write_plots(rep: dict, out: Path) -> list[Path]:
    """curves.png (seed-mean accuracy per round, centralized dashed) and entropy.png (accuracy, ROC AUC vs entropy)."""
    plt = common.matplotlib_pyplot()
    dists = rep["distributions"]
    if plt is None or not dists:
        return []
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    cmap = plt.get_cmap("viridis")
    fed = [d for d in dists if d["kind"] != "central"]
    for j, d in enumerate(dists):
        if not d["curve"]:
            continue
        style = dict(color="black", ls="--") if d["kind"] == "central" else dict(color=cmap(j / max(1, len(fed) - 1)))
        ax.plot([x for x, _ in d["curve"]], [100 * a for _, a in d["curve"]], lw=1, label=d["distribution"], **style)
    ax.set_xlabel("round (centralized: the same number of minibatches)")
    ax.set_ylabel("test accuracy [%]")
    ax.set_title(f"vanlier: FedAvg, {rep['clients']} clients, {rep['dataset']} ({rep['budget']})", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    curves = out / "curves.png"
    fig.savefig(curves, dpi=90)
    plt.close(fig)

    central = next((d for d in dists if d["kind"] == "central"), None)
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.4))
    for ax, key, label, scale in ((axes[0], "final_accuracy", "final test accuracy [%]", 100.0),
                                  (axes[1], "roc_auc", "ROC AUC (one-vs-rest macro)", 1.0)):
        pts = [d for d in fed if d["entropy_bits"] is not None and d[key] is not None]
        ax.errorbar([d["entropy_bits"] for d in pts], [scale * d[key] for d in pts],
                    yerr=[scale * (d[f"{key}_sd"] or 0.0) for d in pts], fmt="o-", ms=3, capsize=2, label="FedAvg")
        for d in pts:
            ax.annotate(d["distribution"], (d["entropy_bits"], scale * d[key]), fontsize=6, xytext=(2, 3),
                        textcoords="offset points")
        if central is not None and central[key] is not None:
            ax.axhline(scale * central[key], color="black", ls="--", lw=0.8, label="centralized")
        ax.set_xlabel("entropy -sum Pr(k,y) log2 Pr(k,y) [bits]")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.tight_layout()
    entropy = out / "entropy.png"
    fig.savefig(entropy, dpi=90)
    plt.close(fig)
    return [curves, entropy]


def write_outputs(rep: dict, out: Path, *, plots: bool = True) -> tuple[str, list[Path]]:
    return common.write_outputs(NAME, rep, out, markdown=format_markdown, csvs=write_csvs,
                                plots=write_plots if plots else None)


# ---- entry point -------------------------------------------------------------------------------

def prepare(argv: list[str]) -> tuple[argparse.Namespace, list[VanLierRun]]:
    args = parse(argv)
    runs = plan(args)
    common.validate_specs([r.spec for r in runs])
    return args, runs


def main(argv: list[str] | None = None, *, launcher: Launcher = torchrun_launcher,
         loader: common.DatasetLoader = common.load_run_dataset) -> int:
    """0: every run succeeded; 1: some run failed (reported); 2: bad arguments (nothing launched)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, runs = prepare(argv)
    except StudyError as exc:
        print(f"geodml.study {NAME}: error: {exc}", file=sys.stderr)
        return 2
    print(f"{NAME} study ({PAPER_REF}): {len(runs)} runs on {args.dataset}, {args.clients} clients (m = "
          f"{participants(args)} per round), {args.rounds} rounds, seeds {','.join(map(str, args.seeds))}, into {args.out}",
          flush=True)
    return common.run_and_report(NAME, args, [r.spec for r in runs], launcher,
                                 lambda results: build_report(args, runs, results, loader=loader), write_outputs)
