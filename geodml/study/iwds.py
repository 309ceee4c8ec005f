"""IWDS, Imbalanced Weight Decay Sampling (Tang et al., "Data Resampling for Federated Learning with
Non-IID Labels", FTL-IJCAI'21; /work/shared/papers/iwds-imbalanced-weight-decay-sampling.txt):
``python -m geodml.study iwds [--budget quick|full]``.

What the paper shows (section "results"): test accuracy over communication rounds of FedAvg
(Figure 5: Fashion-MNIST, McMahan et al.'s CNN; Figure 4: CIFAR-10, VGG-9), FedProx (Figure 6)
and FedNova with momentum (Figure 7; both CIFAR-10/VGG-9 in the paper) with uniform sampling
against IWDS, 10 clients of which 5 take part in every round, on four partitions: LDA (Dirichlet)
alpha_d 0.5 and 0.1, LLT (label long-tail) alpha_l 0.9 and 0.99. Its claims: with LLT, IWDS
converges fastest and ends highest; with LDA, it converges faster and ends at a similar
accuracy. The text gives no number (the figures are not in the text file), so the report's paper
column quotes these claims with their figure.

This study runs all three algorithms on Fashion-MNIST with ``--model cnn`` (the issue: "All on
Fashion-MNIST"), per seed of ``--seeds`` (full: 0, 1, 2), every (algorithm, partition, sampler):
3 x 4 x 2 = 24 configurations, 72 runs at three seeds. Decisions (tests/test_study_iwds_vanlier.py;
docs/study.md lists them as deviations where the paper is silent or differs):

* **IWDS** is ``--iwds beta0,beta_m,rho --iwds-mode resample``: every local minibatch is drawn
  i.i.d. with p(k, i) proportional to w_{k,i,t} = (1 - beta_t) / (1 - beta_t ** N_{k,y_i}),
  beta_t = beta_m + (beta0 - beta_m) rho ** t per communication round t (geodml.algorithms.iwds).
  The paper gives no values; ``IWDS_PARAMS`` are the defaults of its first author's code base,
  which holds the paper's ``decay_imb`` sampler (github.com/wizard1203/GossipFL
  ``configs/default.py``: ``imbalance_beta`` 0.9999, ``imbalance_beta_min`` 0.8,
  ``imbalance_beta_decay_rate`` 0.992, decayed per global round).
* **Partitions.** LLT is ``--partition longtail --tail alpha_l`` (geodml.data.partition documents
  its source: the same code base's ``long-tail`` partition). LDA is ``--partition dirichlet``,
  whose alpha is Hsu et al.'s ``Dir(alpha p)`` over classes per client with equal client sizes;
  the authors' LDA (``hetero`` in the same loader) draws, per class, ``Dir(alpha_d 1)`` over the
  clients (unequal sizes). With 10 clients and 10 (equally frequent) classes the per-entry
  concentration is the same when geodml's alpha = 10 x alpha_d, so the study passes
  ``--alpha LDA_SCALE x alpha_d`` (``--lda-scale``, default 10; 1 passes alpha_d unchanged).
  Client sizes stay equal: a deviation. The settings ``hetero-ALPHA_D`` run the authors' own LDA
  instead (``--partition lda --alpha alpha_d``: geodml.data.partition documents it), whose client
  sizes differ.
* **Algorithms.** FedAvg and FedProx (``--prox-mu``, default 0.1: the same code base's
  ``fedprox_mu``) with ``--reset-momentum`` (a fresh local optimizer each round, as the authors'
  FedML-style trainer), FedNova with ``--fednova`` (it always resets). All with local momentum
  SGD (FedNova "with momentum acceleration", Figure 7): lr 0.01, momentum 0.9, weight decay 1e-4
  (the code base's ``wd``), batch 32 (its ``batch_size``); client sampling ``--client-fraction
  0.5`` (m = 5 of 10, the same seeded draw for every configuration of a seed).
* **Rounds.** ``--rounds`` (full 100) rounds of ``--local-steps`` (full: one local epoch of an
  average client, ceil(N_train / (10 x batch)) = 188 on Fashion-MNIST) steps, evaluated on the
  whole test set after every round (``--eval-every`` = the round). The paper gives neither.
  Every partition of the default settings has (nearly) 6,000 examples, so every participant takes
  the same number of local steps whether counted in steps or epochs: FedNova's normalization then has nothing to
  correct and FedNova equals FedAvg with a reset momentum buffer up to float rounding
  (geodml.algorithms.fednova); its runs measure that, not the paper's FedNova effect.
  ``--local-epochs E`` (E > 0) gives every participant E epochs of its own data per round instead
  (ceil(E n_k / batch) steps; geodml ``--local-epochs E --rounds R --eval-every-rounds 1``), so on
  the ``hetero`` partitions the participants take unequal local steps, the case FedNova
  normalizes; run ids then end in ``-eE`` and a round's length is its longest participant's.
* **Final accuracy** of a run: the mean of its last ``--final-rounds`` (full: 10) evaluated rounds
  (``FULL_FINAL_ROUNDS`` says why); the last round alone is reported beside it.
* **Convergence speed.** Per (algorithm, partition), the target T = ``--target-frac`` (0.9) x the
  better of the two samplers' seed-mean final accuracies; "rounds to T" = the first evaluated
  round at which the seed-mean test-accuracy curve reaches T (per seed in the run table); "mean
  acc" = the mean of the seed-mean curve over all rounds (the normalized area under it).
* **Claims.** LLT: IWDS reaches T in fewer rounds and ends higher (mean over seeds); LDA: fewer
  rounds and a final accuracy within ``--similar-pp`` (1.0) percentage points. Each verdict says
  whether the final-accuracy difference exceeds the larger of the two cells' seed standard
  deviations.
* **Paired by seed.** Seeds share their partition, client draws and initial model, so the report
  also compares runs seed by seed: IWDS - uniform per (algorithm, partition), and, when the study
  holds FedAvg, every other algorithm - FedAvg per sampler. Each on the final accuracy, the early
  accuracy (``EARLY_ROUNDS``: the mean over rounds 1-10) and the roughness (the mean absolute
  change of accuracy between consecutive rounds over the run's second half, rounds 51-100 of
  100): the mean difference +- its sd over seeds, how many seeds are above zero, and the
  two-sided paired t-test's p (scipy, which scikit-learn brings; none below two seeds or at zero
  spread).
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

NAME = "iwds"
PAPER_REF = "IWDS (Tang et al. 2021) Figures 5-7"
CLIENTS = 10
CLIENT_FRACTION = 0.5
"""The paper: "10 clients, and 5 clients will be chosen in every communication round"."""
ALGOS = ("fedavg", "fedprox", "fednova")
ALGO_LABEL = {"fedavg": "FedAvg", "fedprox": "FedProx", "fednova": "FedNova"}
FIGURE = {"fedavg": "Figure 5, Fashion-MNIST CNN", "fedprox": "Figure 6, CIFAR-10 VGG-9 in the paper",
          "fednova": "Figure 7, CIFAR-10 VGG-9 in the paper"}
SETTINGS = (("lda", 0.5), ("lda", 0.1), ("llt", 0.9), ("llt", 0.99))
"""The paper's four partitions: LDA alpha_d 0.5, 0.1; LLT alpha_l 0.9, 0.99. (``hetero`` settings: the
authors' LDA, on request.)"""
KINDS = ("lda", "hetero", "llt")
KIND_LABEL = {"lda": "LDA", "hetero": "LDA (authors')", "llt": "LLT"}
SAMPLERS = ("uniform", "iwds")
IWDS_PARAMS = (0.9999, 0.8, 0.992)
"""beta_0, beta_m, rho: the first author's code defaults (module docstring); the paper gives none."""
PROX_MU = 0.1
LDA_SCALE = 10.0
BATCH, LR, MOMENTUM, WEIGHT_DECAY = 32, 0.01, 0.9, 1e-4
FULL_ROUNDS, QUICK_ROUNDS, QUICK_LOCAL_STEPS = 100, 3, 2
FULL_FINAL_ROUNDS = 10
"""Rounds a run's final accuracy is averaged over (``--final-rounds``). With 5 of 10 clients per
round the global model's accuracy moves from round to round: at LDA 0.5 the last 10 rounds of a
run have a standard deviation of 0.7-1.6 pp, and one seed's round 100 sat 3.5 pp below its own
last-10 mean. The paper reads its figures' curves; a single last point is not that."""
EARLY_ROUNDS = 10
"""Rounds the early accuracy averages over (rounds 1-10): where the LDA claim's "converges faster"
shows in the paired comparison, beside the one round that reaches T."""
CONTROLLED = ("algo", "out", "dataset", "partition", "alpha", "tail", "client_size", "skew", "shards_per_partition",
              "entropy_steps", "model", "norm", "lr", "momentum", "weight_decay", "batch_size", "steps", "epochs",
              "iter_local", "local_epochs", "rounds", "eval_every_rounds", "client_fraction", "eval_every", "eval_at",
              "log_every", "seed", "iwds", "iwds_mode",
              "prox_mu", "fednova", "reset_momentum", "partitions", "fedir", "virtual_client_size", "server_momentum",
              "server_lr", "server_nesterov", "lr_milestones", "lr_schedule", "skewscout")
"""geodml flags (dests) the study sets or that would change what it compares; refused after '--'."""
PAPER_CLAIM = {"llt": "IWDS converges fastest and ends highest", "lda": "IWDS converges faster, similar final accuracy",
               "hetero": "IWDS converges faster, similar final accuracy"}


# ---- arguments ---------------------------------------------------------------------------------

def _algos(text: str) -> tuple[str, ...]:
    algos = tuple(dict.fromkeys(a for a in text.replace(" ", "").split(",") if a))
    if not algos or any(a not in ALGOS for a in algos):
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(ALGOS)}, got {text!r}")
    return algos


def _settings(text: str) -> tuple[tuple[str, float], ...]:
    out = []
    for item in (x for x in text.replace(" ", "").split(",") if x):
        kind, _, value = item.partition("-")
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        if kind not in KINDS or not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"expected settings such as lda-0.5,hetero-0.1,llt-0.99, got {item!r}")
        out.append((kind, v))
    if not out or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"expected distinct settings such as lda-0.5,llt-0.99, got {text!r}")
    return tuple(out)


def build_parser() -> common.OneLineParser:
    p = common.make_parser(NAME, f"{PAPER_REF}: FedAvg, FedProx and FedNova with uniform sampling against IWDS "
                           "resampling on LDA and LLT partitions of 10 clients (geodml/study/iwds.py, docs/study.md).",
                           "Flags after '--' go to every geodml run (e.g. -- --comm-timeout 300). Finished runs "
                           "(summary.json) are reused.")
    p.add_argument("--algos", type=_algos, default=ALGOS, help="subset of fedavg,fedprox,fednova")
    p.add_argument("--settings", type=_settings, default=SETTINGS,
                   help="partitions as lda-ALPHA_D / hetero-ALPHA_D / llt-ALPHA_L (default: the paper's "
                        "lda-0.5,lda-0.1,llt-0.9,llt-0.99; lda: Hsu et al.'s split at --lda-scale x alpha_d, equal "
                        "client sizes; hetero: the authors' own LDA, --partition lda, unequal sizes)")
    p.add_argument("--lda-scale", type=float, default=LDA_SCALE,
                   help="geodml --alpha = this x alpha_d (10: the authors' per-class Dir(alpha_d) over 10 clients; "
                        "1: alpha_d as Hsu et al.'s alpha)")
    p.add_argument("--iwds", default=",".join(fmt(b) for b in IWDS_PARAMS),
                   help="IWDS beta0,beta_m,rho (the first author's code defaults; the paper gives none)")
    p.add_argument("--prox-mu", type=float, default=PROX_MU, help="FedProx proximal weight mu")
    p.add_argument("--local-steps", type=int, help="local steps per round (default: full one local epoch of an average "
                   f"client, ceil(N_train / ({CLIENTS} x batch)); quick {QUICK_LOCAL_STEPS}); with --local-epochs only "
                   "the metrics' log interval")
    p.add_argument("--local-epochs", type=float, default=0.0,
                   help="E > 0: every participant trains E epochs of its own data per round (ceil(E n_k / batch) "
                        "steps, unequal on hetero partitions: what FedNova normalizes) instead of --local-steps; "
                        "run ids end in -eE (default 0: --local-steps)")
    p.add_argument("--batch-size", type=int, default=BATCH, help="local minibatch size")
    p.add_argument("--target-frac", type=float, default=0.9,
                   help="convergence target: this fraction of the better sampler's mean final accuracy")
    p.add_argument("--similar-pp", type=float, default=1.0,
                   help="LDA claim: final accuracies within this many percentage points are 'similar'")
    p.add_argument("--final-rounds", type=int,
                   help="a run's final accuracy: the mean of its last W evaluated rounds (one round moves by 1-4 pp "
                        f"as other clients take part; default full {FULL_FINAL_ROUNDS}, quick 1: the last round alone)")
    return p


def parse_iwds(text: str) -> tuple[float, float, float]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise StudyError(f"--iwds takes three numbers beta0,beta_m,rho, got {text!r}")
    b0, bm, rho = values
    if not (0 <= b0 < 1 and 0 <= bm < 1 and 0 < rho <= 1):
        raise StudyError(f"--iwds: need 0 <= beta0, beta_m < 1 and 0 < rho <= 1, got {text!r}")
    return b0, bm, rho


def parse(argv: list[str]) -> argparse.Namespace:
    head, extra = common.split_extra(argv)
    args = build_parser().parse_args(head)
    args.geodml_args = extra
    quick = args.budget == "quick"
    args.dataset = args.dataset or ("digits" if quick else "fashion-mnist")
    args.seeds = args.seeds or ((0,) if quick else (0, 1, 2))
    args.rounds = args.rounds if args.rounds is not None else (QUICK_ROUNDS if quick else FULL_ROUNDS)
    args.lr = args.lr if args.lr is not None else LR
    common.check_common(args)
    if args.batch_size < 1:
        raise StudyError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.local_steps is None:
        one_epoch = math.ceil(common.TRAIN_SIZES[args.dataset] / (CLIENTS * args.batch_size))  # an average client's
        args.local_steps = QUICK_LOCAL_STEPS if quick else one_epoch
    if args.local_steps < 1:
        raise StudyError(f"--local-steps must be >= 1, got {args.local_steps}")
    if not (math.isfinite(args.local_epochs) and args.local_epochs >= 0):
        raise StudyError(f"--local-epochs must be >= 0 (0: --local-steps), got {args.local_epochs}")
    if not (math.isfinite(args.lda_scale) and args.lda_scale > 0):
        raise StudyError(f"--lda-scale must be > 0, got {args.lda_scale}")
    for kind, value in args.settings:
        if kind in ("lda", "hetero") and not value > 0:
            raise StudyError(f"--settings: an LDA alpha_d must be > 0, got {fmt(value)}")
        if kind == "llt" and not 0 <= value <= 1:
            raise StudyError(f"--settings: an LLT alpha_l is a share in [0, 1], got {fmt(value)}")
    args.iwds = parse_iwds(args.iwds)
    if not (math.isfinite(args.prox_mu) and args.prox_mu > 0):
        raise StudyError(f"--prox-mu must be > 0 (FedProx), got {args.prox_mu}")
    if not (math.isfinite(args.target_frac) and 0 < args.target_frac <= 1):
        raise StudyError(f"--target-frac must be in (0, 1], got {args.target_frac}")
    if not (math.isfinite(args.similar_pp) and args.similar_pp >= 0):
        raise StudyError(f"--similar-pp must be >= 0, got {args.similar_pp}")
    args.final_rounds = common.final_rounds(args.final_rounds, rounds=args.rounds, quick=quick, full=FULL_FINAL_ROUNDS)
    common.check_extra_flags(extra, CONTROLLED)
    args.out = args.out or str(Path("runs") / f"study-{NAME}-{args.dataset}-{args.budget}")
    return args


# ---- plan --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class IwdsRun:
    algo: str
    sampler: str
    """'uniform' or 'iwds'."""
    partition: str
    """'lda', 'hetero' or 'llt'."""
    param: float
    """alpha_d (LDA) or alpha_l (LLT), the paper's value."""
    seed: int
    spec: RunSpec

    @property
    def setting(self) -> str:
        return setting_label(self.partition, self.param)

    @property
    def config(self) -> tuple[str, str, float]:
        return (self.algo, self.partition, self.param)


def setting_label(kind: str, value: float) -> str:
    return f"{KIND_LABEL[kind]} {fmt(value)}"


def partition_flags(args: argparse.Namespace, kind: str, value: float) -> list[str]:
    if kind == "llt":
        return ["--partition", "longtail", "--tail", fmt(value)]
    if kind == "hetero":
        return ["--partition", "lda", "--alpha", fmt(value)]
    return ["--partition", "dirichlet", "--alpha", fmt(round(args.lda_scale * value, 12))]


def algo_flags(args: argparse.Namespace, algo: str, sampler: str) -> list[str]:
    flags = {"fedavg": ["--reset-momentum"], "fedprox": ["--reset-momentum", "--prox-mu", fmt(args.prox_mu)],
             "fednova": ["--fednova"]}[algo]
    if sampler == "iwds":
        flags += ["--iwds", ",".join(fmt(b) for b in args.iwds), "--iwds-mode", "resample"]
    return flags


def length_flags(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """How long a run trains (flags before --client-fraction) and when it is validated (after the
    algorithm's flags; the order is the launch record that finished runs are reused by): R rounds of
    --local-steps, validated every round; or with --local-epochs E, R rounds of E local epochs each,
    validated at every round's end (step-based validation pushed past the run)."""
    local = str(args.local_steps)
    if args.local_epochs > 0:
        return (["--rounds", str(args.rounds), "--local-epochs", fmt(args.local_epochs)],
                ["--eval-every-rounds", "1", "--eval-every", str(10 ** 9), "--log-every", local])
    return (["--steps", str(args.rounds * args.local_steps), "--iter-local", local],
            ["--eval-every", local, "--log-every", local])


def plan(args: argparse.Namespace) -> list[IwdsRun]:
    """Every run, seeds outermost (a study cut short has whole seeds), unique run ids."""
    out = Path(args.out)
    suffix = f"-e{fmt(args.local_epochs)}" if args.local_epochs > 0 else ""
    length, validation = length_flags(args)
    runs = []
    for seed in args.seeds:
        for algo in args.algos:
            for kind, value in args.settings:
                for sampler in SAMPLERS:
                    rid = f"{algo}-{sampler}-{kind}-{fmt(value)}{suffix}-s{seed}"
                    argv = ("--algo", "fedavg", "--dataset", args.dataset, *partition_flags(args, kind, value),
                            "--model", "cnn", "--norm", "none", "--batch-size", str(args.batch_size), "--lr", fmt(args.lr),
                            "--momentum", fmt(MOMENTUM), "--weight-decay", fmt(WEIGHT_DECAY), *length,
                            "--client-fraction", fmt(CLIENT_FRACTION), *algo_flags(args, algo, sampler),
                            *validation, "--wan", "off", "--seed", str(seed), *args.geodml_args)
                    runs.append(IwdsRun(algo, sampler, kind, value, seed, RunSpec(rid, out / rid, argv, CLIENTS)))
    assert len({r.spec.run_id for r in runs}) == len(runs)
    return runs


# ---- report ------------------------------------------------------------------------------------

def rounds_to(curve: list[tuple[float, float]], target: float | None) -> float | None:
    """The first round whose accuracy reaches ``target`` (None: never, or no target)."""
    if target is None:
        return None
    return next((r for r, acc in curve if acc >= target - 1e-12), None)


def mean_curve(curves: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The seed-mean curve over the rounds every curve has."""
    if not curves:
        return []
    common_rounds = set.intersection(*(set(r for r, _ in c) for c in curves))
    return [(r, sum(dict(c)[r] for c in curves) / len(curves)) for r in sorted(common_rounds)]


def early_accuracy(curve: list[tuple[float, float]], rounds: int = EARLY_ROUNDS) -> float | None:
    """The mean accuracy over rounds 1..``rounds`` (those of them the curve has; None: none)."""
    accs = [a for r, a in curve if r <= rounds + 1e-9]
    return sum(accs) / len(accs) if accs else None


def roughness(curve: list[tuple[float, float]]) -> float | None:
    """The mean |acc_r - acc_(r-1)| over consecutive evaluated rounds of the curve's second half
    (its last ceil(n / 2) points: rounds 51-100 of 100, 49 changes); None below two such points."""
    half = [a for _, a in curve[len(curve) // 2:]]
    if len(half) < 2:
        return None
    return sum(abs(b - a) for a, b in zip(half, half[1:])) / (len(half) - 1)


PAIRED_MEASURES = ("final_accuracy", "early_accuracy", "roughness")


def paired_t_p(diffs: list[float]) -> float | None:
    """Two-sided p of the paired t-test that the mean difference is zero (n - 1 degrees of
    freedom); None below two differences or when they do not vary."""
    n = len(diffs)
    mean, sd = mean_sd(diffs)
    if n < 2 or mean is None or sd is None or sd <= 1e-12 * max(1.0, abs(mean)):  # equal up to rounding: no spread
        return None
    from scipy import stats  # scikit-learn's dependency: always installed with geodml
    return float(2.0 * stats.t.sf(abs(mean / (sd / math.sqrt(n))), n - 1))


def paired(minuend: list[dict], subtrahend: list[dict]) -> dict:
    """``minuend`` - ``subtrahend`` run rows, matched by seed (both finished), per measure: the
    per-seed differences, their mean and sd, how many are above zero, and the paired t-test's p."""
    base = {r["seed"]: r for r in subtrahend if r["final_accuracy"] is not None}
    pairs = [(r, base[r["seed"]]) for r in sorted(minuend, key=lambda r: r["seed"])
             if r["final_accuracy"] is not None and r["seed"] in base]
    out: dict[str, Any] = {"seeds": [a["seed"] for a, _ in pairs]}
    for key in PAIRED_MEASURES:
        both = [(a["seed"], a[key] - b[key]) for a, b in pairs if a[key] is not None and b[key] is not None]
        diffs = [d for _, d in both]
        mean, sd = mean_sd(diffs)
        out[key] = {"seeds": [seed for seed, _ in both], "diffs": diffs, "mean": mean, "sd": sd,
                    "above": sum(d > 0 for d in diffs), "p": paired_t_p(diffs)}
    return out


def paired_comparisons(args: argparse.Namespace, rows: list[dict]) -> list[dict]:
    """IWDS - uniform per (algorithm, partition); then, when the study holds FedAvg, each other
    algorithm - FedAvg per (partition, sampler)."""
    def pick(algo: str, kind: str, value: float, sampler: str) -> list[dict]:
        return [r for r in rows if (r["algo"], r["partition"], r["param"], r["sampler"]) == (algo, kind, value, sampler)]
    out: list[dict] = []
    for algo in args.algos:
        for kind, value in args.settings:
            out.append({"comparison": f"{ALGO_LABEL[algo]}: IWDS - uniform", "algo": algo, "partition": kind, "param": value,
                        "setting": setting_label(kind, value), "sampler": "",
                        **paired(pick(algo, kind, value, "iwds"), pick(algo, kind, value, "uniform"))})
    if "fedavg" in args.algos:
        for algo in (a for a in args.algos if a != "fedavg"):
            for kind, value in args.settings:
                for sampler in SAMPLERS:
                    out.append({"comparison": f"{ALGO_LABEL[algo]} - FedAvg", "algo": algo, "partition": kind,
                                "param": value, "setting": setting_label(kind, value), "sampler": sampler,
                                **paired(pick(algo, kind, value, sampler), pick("fedavg", kind, value, sampler))})
    return out


def build_report(args: argparse.Namespace, runs: list[IwdsRun], results: list[RunResult]) -> dict:
    by_id = {r.spec.run_id: r for r in results}
    rows: list[dict[str, Any]] = []
    for run in runs:
        res = by_id[run.spec.run_id]
        s = res.summary if res.succeeded else None
        points = common.read_curve(run.spec.out) if s else []
        # round r's validation: at step r x L, or with --local-epochs the r-th (rounds differ in length)
        curve = ([(float(r), acc) for r, (_, acc) in enumerate(points, 1)] if args.local_epochs > 0 else
                 [(step / args.local_steps, acc) for step, acc in points])
        last = None if s is None else s.get("final_val_accuracy")
        tail = [a for _, a in curve[-args.final_rounds:]]
        rows.append({"run_id": run.spec.run_id, "algo": run.algo, "sampler": run.sampler, "partition": run.partition,
                     "param": run.param, "setting": run.setting, "seed": run.seed, "status": res.status,
                     "error": res.error, "returncode": res.returncode, "dir": str(run.spec.out),
                     "geodml_partition": " ".join(partition_flags(args, run.partition, run.param)[1:]),
                     # no curve: the last round stands in only when it is the measure (--final-rounds 1)
                     "final_accuracy": (sum(tail) / len(tail)) if tail else (last if args.final_rounds == 1 else None),
                     "last_round_accuracy": last,
                     "final_val_loss": None if s is None else s.get("final_val_loss"),
                     "wall_s": None if s is None else s.get("wall_seconds"),
                     "mean_accuracy": (sum(a for _, a in curve) / len(curve)) if curve else None,
                     "early_accuracy": early_accuracy(curve), "roughness": roughness(curve),
                     "rounds": len(curve), "curve": curve, "target": None, "rounds_to_target": None})
    cells: list[dict[str, Any]] = []
    for algo in args.algos:
        for kind, value in args.settings:
            pair: dict[str, dict[str, Any]] = {}
            for sampler in SAMPLERS:
                mine = [r for r in rows if (r["algo"], r["partition"], r["param"], r["sampler"]) == (algo, kind, value, sampler)]
                ok = [r for r in mine if r["final_accuracy"] is not None]
                fm, fsd = mean_sd([r["final_accuracy"] for r in ok])
                lm, lsd = mean_sd([r["last_round_accuracy"] for r in ok if r["last_round_accuracy"] is not None])
                curve = mean_curve([r["curve"] for r in ok if r["curve"]])
                early = mean_sd([r["early_accuracy"] for r in ok if r["early_accuracy"] is not None])
                rough = mean_sd([r["roughness"] for r in ok if r["roughness"] is not None])
                pair[sampler] = {"algo": algo, "partition": kind, "param": value, "sampler": sampler,
                                 "early_mean": early[0], "early_sd": early[1], "roughness_mean": rough[0],
                                 "roughness_sd": rough[1],
                                 "setting": setting_label(kind, value), "seeds_ok": len(ok), "seeds": len(mine),
                                 "final_mean": fm, "final_sd": fsd, "last_round_mean": lm, "last_round_sd": lsd,
                                 "curve": curve,
                                 "mean_accuracy": (sum(a for _, a in curve) / len(curve)) if curve else None, "rows": mine}
            finals = [c["final_mean"] for c in pair.values() if c["final_mean"] is not None]
            target = args.target_frac * max(finals) if finals else None
            for c in pair.values():
                c["target"] = target
                c["rounds_to_target"] = rounds_to(c["curve"], target)
                for r in c["rows"]:
                    r["target"] = target
                    r["rounds_to_target"] = rounds_to(r["curve"], target) if r["curve"] else None
                reached = [r["rounds_to_target"] for r in c["rows"] if r["rounds_to_target"] is not None]
                c["seeds_reached"] = len(reached)
                c["rounds_mean"], c["rounds_sd"] = mean_sd(reached) if len(reached) == c["seeds_ok"] else (None, None)
            cells.append({"uniform": pair["uniform"], "iwds": pair["iwds"], "claim": claim(args, kind, pair)})
    failed = [r["run_id"] for r in rows if r["status"] in ("failed", "timeout")]
    return {"study": NAME, "paper": PAPER_REF, "dataset": args.dataset, "budget": args.budget, "seeds": list(args.seeds),
            "clients": CLIENTS, "client_fraction": CLIENT_FRACTION, "rounds": args.rounds, "local_steps": args.local_steps,
            "local_epochs": args.local_epochs,
            "batch_size": args.batch_size, "lr": args.lr, "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY,
            "iwds": list(args.iwds), "prox_mu": args.prox_mu, "lda_scale": args.lda_scale, "target_frac": args.target_frac,
            "similar_pp": args.similar_pp, "final_rounds": args.final_rounds, "geodml_args": list(args.geodml_args),
            "out": str(args.out),
            "cells": [{k: ({kk: vv for kk, vv in v.items() if kk != "rows"} if isinstance(v, dict) and "rows" in v else v)
                       for k, v in c.items()} for c in cells],
            "early_rounds": EARLY_ROUNDS, "paired": paired_comparisons(args, rows), "rows": rows, "failed": failed}


def claim(args: argparse.Namespace, kind: str, pair: dict) -> dict:
    """The paper's claim for this (algorithm, partition) and what the runs measured."""
    u, i = pair["uniform"], pair["iwds"]
    out: dict = {"paper": PAPER_CLAIM[kind], "verdict": "no data", "evidence": ""}
    if u["final_mean"] is None or i["final_mean"] is None:
        return out
    ru, ri = rounds_to(u["curve"], u["target"]), rounds_to(i["curve"], i["target"])
    inf = math.inf
    faster = (ri if ri is not None else inf) < (ru if ru is not None else inf)
    diff = i["final_mean"] - u["final_mean"]
    noise = max(u["final_sd"] or 0.0, i["final_sd"] or 0.0)
    beyond = abs(diff) > noise if noise > 0 else None
    noise_text = ("one seed: noise not measured" if beyond is None else
                  f"{'beyond' if beyond else 'within'} the seed sd {100 * noise:.1f} pp")

    def rtext(r):
        return f"round {fmt(r)}" if r is not None else "not reached"
    evidence = (f"T = {100 * u['target']:.1f}%: IWDS {rtext(ri)} vs uniform {rtext(ru)}; final IWDS "
                f"{pm(i['final_mean'], i['final_sd'])} vs uniform {pm(u['final_mean'], u['final_sd'])} "
                f"({100 * diff:+.1f} pp, {noise_text})")
    if args.final_rounds > 1 and u["last_round_mean"] is not None and i["last_round_mean"] is not None:
        evidence += (f"; the last round alone: IWDS {pm(i['last_round_mean'], i['last_round_sd'])} vs uniform "
                     f"{pm(u['last_round_mean'], u['last_round_sd'])} "
                     f"({100 * (i['last_round_mean'] - u['last_round_mean']):+.1f} pp)")
    if kind == "llt":  # lda and hetero: the LDA claim
        higher = diff > 0
        verdict = ("supported" if faster and higher else "not supported" if not faster and not higher
                   else "partly: faster, not higher" if faster else "partly: higher, not faster")
    else:
        similar = abs(diff) <= args.similar_pp / 100 + 1e-12
        verdict = ("supported" if faster and similar else "not supported" if not faster and not similar
                   else f"partly: faster, final differs by more than {fmt(args.similar_pp)} pp" if faster
                   else "partly: similar final, not faster")
    out.update(verdict=verdict, evidence=evidence, faster=faster, final_diff=diff, beyond_noise=beyond)
    return out


def _r(v) -> str:
    return "-" if v is None else fmt(v)


def _local_work(rep: dict) -> str:
    epochs = rep.get("local_epochs") or 0
    if epochs > 0:
        return f"{fmt(epochs)} local epoch(s) (ceil({fmt(epochs)} n_k / batch) steps per participant) of"
    return f"{rep['local_steps']} steps of"


def paired_text(m: dict) -> str:
    """'+2.5 +- 0.6 pp (3/3 above 0, p = 0.021)'; '-' without pairs."""
    if m["mean"] is None:
        return "-"
    sd = "" if m["sd"] is None else f" +- {100 * m['sd']:.2f}"
    p = "" if m["p"] is None else f", p = {m['p']:.2g}"
    return f"{100 * m['mean']:+.2f}{sd} pp ({m['above']}/{len(m['diffs'])} above 0{p})"


def format_markdown(rep: dict) -> str:
    b0, bm, rho = rep["iwds"]
    lines = [f"# iwds: {rep['paper']} on {rep['dataset']}, CNN, {rep['clients']} clients "
             f"({round(rep['client_fraction'] * rep['clients'])} per round), budget {rep['budget']}", "",
             f"Protocol: {rep['rounds']} rounds of {_local_work(rep)} local momentum SGD (batch {rep['batch_size']}, "
             f"lr {rep['lr']:g}, momentum {rep['momentum']:g}, weight decay {rep['weight_decay']:g}); IWDS = resampling with "
             f"p(k,i) ~ w_(k,i,t), beta0 {fmt(b0)}, beta_m {fmt(bm)}, rho {fmt(rho)} per round; FedProx mu "
             f"{fmt(rep['prox_mu'])}; LDA alpha_d as geodml --alpha {fmt(rep['lda_scale'])} x alpha_d (LDA (authors'): "
             f"--partition lda --alpha alpha_d); seeds "
             f"{', '.join(map(str, rep['seeds']))}. Accuracy: the global model on the whole test set after every round, "
             f"mean +- sd over seeds; a run's final accuracy is the mean of its last {rep['final_rounds']} round(s).", "",
             f"Convergence: T = {fmt(rep['target_frac'])} x the better sampler's mean final accuracy (per algorithm and "
             "partition); rounds to T = first round at which the seed-mean curve reaches T; mean acc = the seed-mean "
             "curve averaged over all rounds (normalized area under it).", "",
             "The paper's text gives no numbers (its Figures 4-7 are curves); the paper column quotes its claims. Its "
             "Figures 6 (FedProx) and 7 (FedNova) are CIFAR-10 / VGG-9; here every algorithm runs on "
             f"{rep['dataset']} with the CNN.", "",
             "| algorithm | partition | uniform final | IWDS final | IWDS - uniform | T | uniform rounds to T | "
             "IWDS rounds to T | uniform mean acc | IWDS mean acc | paper | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in rep["cells"]:
        u, i, cl = c["uniform"], c["iwds"], c["claim"]
        both = u["final_mean"] is not None and i["final_mean"] is not None
        diff = f"{100 * (i['final_mean'] - u['final_mean']):+.1f} pp" if both else "-"
        lines.append(f"| {ALGO_LABEL[u['algo']]} | {u['setting']} | {pm(u['final_mean'], u['final_sd'])} | "
                     f"{pm(i['final_mean'], i['final_sd'])} | {diff} | {pm(u['target'], None)} | "
                     f"{_r(u['rounds_to_target'])} | {_r(i['rounds_to_target'])} | {pm(u['mean_accuracy'], None)} | "
                     f"{pm(i['mean_accuracy'], None)} | {cl['paper']} ({FIGURE[u['algo']].split(',')[0]}) | {cl['verdict']} |")
    lines += ["", "## Claims: the measured evidence", ""]
    for c in rep["cells"]:
        u, cl = c["uniform"], c["claim"]
        lines.append(f"- {ALGO_LABEL[u['algo']]}, {u['setting']} (paper, {FIGURE[u['algo']]}: {cl['paper']}): "
                     f"**{cl['verdict']}**" + (f". {cl['evidence']}." if cl["evidence"] else "."))
    early = f"rounds 1-{rep['early_rounds']}"
    if rep["paired"]:
        lines += ["", "## Paired by seed", "",
                  f"Differences seed by seed (same partition, client draws and initial model): mean +- sd over seeds in "
                  f"percentage points, seeds above zero, two-sided paired t-test p. Final: the last {rep['final_rounds']} "
                  f"round(s); early: the mean over {early}; roughness: the mean change of accuracy between consecutive "
                  "rounds over each run's second half.", "",
                  f"| comparison | partition | sampler | seeds | final | early ({early}) | roughness |",
                  "|---|---|---|---|---|---|---|"]
        for c in rep["paired"]:
            lines.append(f"| {c['comparison']} | {c['setting']} | {c['sampler'] or '-'} | {len(c['seeds'])} | "
                         + " | ".join(paired_text(c[k]) for k in PAIRED_MEASURES) + " |")
    lines += ["", "## Runs", "", f"| run | algorithm | sampler | partition | geodml | seed | final acc (last "
              f"{rep['final_rounds']}) | last round | mean acc | {early} | roughness | rounds to T | status |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rep["rows"]:
        acc = "-" if r["final_accuracy"] is None else f"{r['final_accuracy']:.4f}"
        last = "-" if r["last_round_accuracy"] is None else f"{r['last_round_accuracy']:.4f}"
        status = r["status"] if r["status"] in ("ok", "reused") else f"{r['status'].upper()} (exit {r['returncode']})"
        lines.append(f"| {r['run_id']} | {ALGO_LABEL[r['algo']]} | {r['sampler']} | {r['setting']} | {r['geodml_partition']} | "
                     f"{r['seed']} | {acc} | {last} | {pm(r['mean_accuracy'], None)} | {pm(r['early_accuracy'], None)} | "
                     f"{pm(r['roughness'], None, digits=2, unit=' pp')} | {_r(r['rounds_to_target'])} | {status} |")
    for r in rep["rows"]:
        if r["status"] in ("failed", "timeout"):
            lines.append(f"\nFailed (excluded): {r['run_id']}: {r['error']}; stderr: {Path(r['dir']) / 'stderr.txt'}")
    return "\n".join(lines) + "\n"


RUN_FIELDS = ("run_id", "algo", "sampler", "partition", "param", "geodml_partition", "seed", "status", "final_accuracy",
              "last_round_accuracy", "final_val_loss", "mean_accuracy", "early_accuracy", "roughness", "rounds_to_target",
              "target", "rounds", "wall_s", "dir", "error")
CELL_FIELDS = ("algo", "partition", "param", "sampler", "seeds_ok", "seeds", "final_mean", "final_sd", "last_round_mean",
               "last_round_sd", "mean_accuracy", "early_mean", "early_sd", "roughness_mean", "roughness_sd",
               "target", "rounds_to_target", "rounds_mean", "rounds_sd", "seeds_reached", "paper", "verdict")
PAIRED_FIELDS = ("comparison", "algo", "partition", "param", "sampler", "seeds", "measure", "diffs", "mean", "sd", "above", "p")


CURVE_FIELDS = ("run_id", "algo", "sampler", "partition", "param", "seed", "round", "val_accuracy")


def write_csvs(rep: dict, out: Path) -> list[Path]:
    """NAME.csv (one row per run), NAME_cells.csv (one per cell and sampler), NAME_curves.csv
    (one per run and evaluated round: every curve the report rests on, so that a write-up can be
    rechecked without the run directories) and NAME_paired.csv (one per paired comparison and
    measure; the seeds that measure pairs and their differences, ';'-separated, in seed order)."""
    runs_csv, cells_csv, curves_csv = out / f"{NAME}.csv", out / f"{NAME}_cells.csv", out / f"{NAME}_curves.csv"
    paired_csv = out / f"{NAME}_paired.csv"
    with open(paired_csv, "w", newline="") as f:
        pw = csv.writer(f)
        pw.writerow(PAIRED_FIELDS)
        for c in rep["paired"]:
            for key in PAIRED_MEASURES:
                m = c[key]
                pw.writerow([c["comparison"], c["algo"], c["partition"], fmt(c["param"]), c["sampler"],
                            ";".join(map(str, m["seeds"])), key, ";".join(repr(d) for d in m["diffs"]),
                            *("" if m[k] is None else m[k] for k in ("mean", "sd", "above", "p"))])
    with open(runs_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RUN_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows([{k: ("" if r.get(k) is None else r[k]) for k in RUN_FIELDS} for r in rep["rows"]])
    with open(cells_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CELL_FIELDS, extrasaction="ignore")
        w.writeheader()
        for c in rep["cells"]:
            for sampler in SAMPLERS:
                row = {**c[sampler], "paper": c["claim"]["paper"], "verdict": c["claim"]["verdict"]}
                w.writerow({k: ("" if row.get(k) is None else row[k]) for k in CELL_FIELDS})
    with open(curves_csv, "w", newline="") as f:
        cw = csv.writer(f)
        cw.writerow(CURVE_FIELDS)
        for r in rep["rows"]:
            for rnd, acc in r["curve"]:
                cw.writerow([*(r[k] for k in CURVE_FIELDS[:6]), fmt(rnd), acc])
    return [runs_csv, cells_csv, curves_csv, paired_csv]


def write_plots(rep: dict, out: Path) -> list[Path]:
    """curves.png (seed-mean accuracy per round, one panel per algorithm and partition) and final.png (bars)."""
    plt = common.matplotlib_pyplot()
    if plt is None or not rep["cells"]:
        return []
    algos = list(dict.fromkeys(c["uniform"]["algo"] for c in rep["cells"]))
    settings = list(dict.fromkeys(c["uniform"]["setting"] for c in rep["cells"]))
    colors = {"uniform": "tab:blue", "iwds": "tab:red"}
    fig, axes = plt.subplots(len(algos), len(settings), figsize=(3.2 * len(settings), 2.6 * len(algos)), squeeze=False)
    for c in rep["cells"]:
        ax = axes[algos.index(c["uniform"]["algo"])][settings.index(c["uniform"]["setting"])]
        for sampler in SAMPLERS:
            cur = c[sampler]["curve"]
            if cur:
                ax.plot([r for r, _ in cur], [100 * a for _, a in cur], color=colors[sampler],
                        label=f"{sampler} ({c[sampler]['seeds_ok']} seeds)")
        if c["uniform"]["target"] is not None:
            ax.axhline(100 * c["uniform"]["target"], color="grey", lw=0.7, ls="--")
        ax.set_title(f"{ALGO_LABEL[c['uniform']['algo']]}, {c['uniform']['setting']}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    for ax in axes[-1]:
        ax.set_xlabel("communication round", fontsize=7)
    for row in axes:
        row[0].set_ylabel("test accuracy [%]", fontsize=7)
    fig.suptitle(f"iwds: {rep['dataset']}, {rep['clients']} clients, dashed: target T", fontsize=9)
    fig.tight_layout()
    curves = out / "curves.png"
    fig.savefig(curves, dpi=90)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(rep["cells"]) + 1.5), 3.4))
    labels = [f"{ALGO_LABEL[c['uniform']['algo']]}\n{c['uniform']['setting']}" for c in rep["cells"]]
    for k, sampler in enumerate(SAMPLERS):
        xs = [j + (k - 0.5) * 0.38 for j in range(len(rep["cells"]))]
        ys = [100 * (c[sampler]["final_mean"] or 0.0) for c in rep["cells"]]
        err = [100 * (c[sampler]["final_sd"] or 0.0) for c in rep["cells"]]
        ax.bar(xs, ys, 0.38, yerr=err, color=colors[sampler], label=sampler, capsize=2)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=6)
    ax.set_ylabel("final test accuracy [%] (mean +- sd)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    fig.tight_layout()
    final = out / "final.png"
    fig.savefig(final, dpi=90)
    plt.close(fig)
    return [curves, final]


def write_outputs(rep: dict, out: Path, *, plots: bool = True) -> tuple[str, list[Path]]:
    return common.write_outputs(NAME, rep, out, markdown=format_markdown, csvs=write_csvs,
                                plots=write_plots if plots else None)


# ---- entry point -------------------------------------------------------------------------------

def prepare(argv: list[str]) -> tuple[argparse.Namespace, list[IwdsRun]]:
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
    work = (f"{fmt(args.local_epochs)} local epoch(s)" if args.local_epochs > 0 else f"{args.local_steps} local steps")
    print(f"{NAME} study ({PAPER_REF}): {len(runs)} runs on {args.dataset}, {CLIENTS} clients, {args.rounds} rounds of "
          f"{work}, seeds {','.join(map(str, args.seeds))}, into {args.out}", flush=True)
    return common.run_and_report(NAME, args, [r.spec for r in runs], launcher,
                                 lambda results: build_report(args, runs, results), write_outputs)
