"""Hsu, Qi & Brown 2019 and 2020 from real runs: ``python -m geodml.study hsu2019|hsu2020 [--budget quick|full]``.

Both studies federate 100 clients on Fashion-MNIST (the real data here; the papers used CIFAR-10,
iNaturalist and Google Landmarks) through geodml.study.runner (finished runs are reused, failures
are reported and excluded, never hidden), and write ``NAME.md`` (tables: mean +- std over seeds,
the papers' numbers beside ours, the measured evidence per claim), ``NAME.csv`` (one row per run),
``NAME.json`` and PNGs into the study directory. ``--dry-run`` prints the plan, its run count and
an estimate of its machine time, and launches nothing.

``hsu2019`` -- "Measuring the effects of non-identical data distribution for federated visual
classification" (Hsu et al. 2019):

* Population (Section 3; the sampling of Hsu et al. 2020, Appendix B): 100 clients x 500
  examples, class mix ``q ~ Dir(alpha p)``, drawn without replacement (``--partition dirichlet
  --client-size 500``), alpha in {100, 10, 1, 0.5, 0.2, 0.1, 0.05, 0} (Hsu et al. 2020, Appendix
  B.1, the CIFAR-10 list: the 2019 paper's "8 values"; 0 = one class per client).
* FedAvg (Section 4): report goal C in {0.05, 0.1, 0.2, 0.4} (``--client-fraction``), E = 1, B = 64,
  weight decay 0.004, no learning-rate decay, plain SGD on the clients (``--momentum 0``: McMahan et
  al.'s FedAvg; the paper names no client momentum), the paper's CIFAR CNN (``--model cifar-cnn``).
  All clients hold 500 examples, so E = 1 is exactly ceil(500 / 64) = 8 local steps for every
  participant: the study passes ``--iter-local 8`` (not ``--local-epochs 1``) so that geodml's pool
  engine runs it (8 x 64 = 512 examples: the sampler wraps 12 into the next pass).
* FedAvgM (Section 4.2): server learning rate 1.0, Nesterov server momentum beta in {0.7, 0.9, 0.97,
  0.99, 0.997} (beta = 0 is FedAvg itself, run once), at a fixed effective learning rate
  ``eta_eff = eta / (1 - beta)`` (Figure 6): the client rate is ``eta = eta_eff (1 - beta)``.
* Learning rates: the paper searches eta in {1e-4, 3e-4, ..., 0.1, 0.3} (8 values, 5 populations
  each) per cell. Here the grid is in eta_eff, three half-decade points 0.03, 0.1, 0.3 by default
  (``--lrs``; FedAvg's cells may take their own grid, ``--fedavg-lrs``): the same spacing as the
  paper's grid, around plain SGD's usual rate for this network on 28x28 images; the paper's 8 rates
  x 5 populations per cell (FedAvgM: x 6 betas) would be 8x (FedAvg) to 14x (FedAvgM) more runs
  than ours (see docs/study.md for the run counts). A cell whose best rate (or beta) is at an end
  of its grid is flagged "(edge)": its tuning may be truncated; a cell that ran one rate is flagged
  "(one rate)": its rate was not tuned.
* Tuning protocol: each cell's grid (FedAvg: eta_eff; FedAvgM: beta x eta_eff) is run at the first
  ``--tune-seeds`` seeds (default 1); the setting with the best mean final accuracy is then run at
  the remaining seeds, and the cell reports mean +- std over all its seeds at that setting (the
  tuning seed included, so slightly optimistic; ``--tune-seeds`` = the number of seeds is the
  paper's own protocol: every rate averaged over every population, then the best).
* Budget: ``--rounds`` (full: 100, 1% of the paper's 10,000 rounds; Fashion-MNIST trains much
  faster than CIFAR-10, still the accuracies are short-budget ones); FedAvgM runs at the report goals
  ``--momentum-fractions`` (default 0.05, the setting the paper's Section 4.2 quotes); ``--fedavg-only``
  runs no FedAvgM cell (Figure 2 alone).
* Final accuracy of a run (hsu2019 and hsu2020's FedIR): the mean of the global model's accuracy after
  each of its last ``--final-rounds`` rounds (full: 10, FULL_FINAL_ROUNDS; geodml's ``--eval-at``), not
  the last round alone; the paper reads its final values off the learning curves and does not say more.

``hsu2020`` -- "Federated visual classification with real-world data distribution" (Hsu et al. 2020):

* FedIR (Section 5.2, evaluated in Section 6.2 on iNaturalist/Landmarks user splits): FedAvg and
  FedAvgM with and without ``--fedir`` on hsu2019's Dirichlet population (alpha ``--fedir-alphas``),
  report goal 10 (C = 0.1), E = 1 (8 steps), client lr 0.01 (Section 6.5), FedAvgM beta 0.9 with
  server lr 1 (the text we have lost the momentum's value; 0.9 is the middle of hsu2019's grid),
  plain (non-Nesterov) server momentum as Section 5.1's update rule (``--server-nesterov`` to
  change). Note: with one class per client (alpha = 0) FedIR's self-normalized weights are constant
  within every minibatch, so FedIR is FedAvg there; alpha = 0 is therefore not in the default grid.
* FedVC (Section 5.3, Table 2): a population of imbalanced clients -- 100 clients whose sizes follow
  Zipf's rank-size law (``--size-zipf 1``: the r-th largest holds floor(3000 / r) examples, 30 to
  3000, 15,519 in all; 3000 is iNaturalist-Geo-3k's cap, whose clients "take up to 46 (3000/64)
  local steps", Section 6.3), class mix Dir(alpha = 1) -- 10 clients per round, B = 64, with FedVC
  (``--virtual-client-size 256``: the published paper's N_VC; the text we have lost the symbol) or
  without (E = 1: ``--local-epochs 1``, ceil(n_k / 64) steps, a round lasting as long as its
  longest participant). Budgets: the paper's round budgets 1k/2.5k/5k and batch budgets
  10k/25k/50k, scaled by ``--vc-rounds`` / 5000 (full 200: 40/100/200 rounds, 400/1000/2000
  batches). A "batch" is one local step of the round's longest participant (Section 6.3): geodml's
  trainer step. Volatility: the accuracy drawdown (the sum of the falls between consecutive points)
  over ``--curve-points`` equally spaced round budgets.
* The FedAvg-without-FedVC runs are evaluated only at round ends: geodml evaluates a run mid-round
  as the average of every partition's current weights (stale and half-trained ones included;
  geodml/trainer.py), which is no model of the server. Their rounds have unequal lengths, so the study
  computes each seed's population and round lengths from geodml's own code
  (geodml.preflight.load_and_partition, FedAvg.select_partitions / local_steps_of): one run per algorithm
  and seed lasts the longest budget and is evaluated exactly at every budget's round end
  (``--eval-at``). FedVC rounds are ceil(256/64) = 4 steps, so one run per seed, evaluated at
  multiples of 4 steps, serves every budget.

Tests: tests/test_study_hsu.py. Run counts, time estimates and every deviation: docs/study.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from geodml.config import DATASETS
from geodml.cores import usable_cores
from geodml.study import common
from geodml.study.common import StudyError, final_rounds, fmt, matplotlib_pyplot, mean_sd, seed_list
from geodml.study.runner import Launcher, RunResult, RunSpec, finite_floats, read_summary, torchrun_launcher

# ---- the papers' settings and numbers (quoted from the papers' text, with where) ----------------------

H19_ALPHAS = (100.0, 10.0, 1.0, 0.5, 0.2, 0.1, 0.05, 0.0)
"""Hsu et al. 2020 Appendix B.1 (CIFAR-10); Hsu et al. 2019 Section 3 "8 values for alpha"."""
H19_FRACTIONS = (0.05, 0.1, 0.2, 0.4)
"""Report goal C, Hsu et al. 2019 Section 4 (5, 10, 20 and 40 of the 100 clients)."""
H19_BETAS = (0.7, 0.9, 0.97, 0.99, 0.997)
"""Server momentum, Section 4.2 (its grid also has 0: FedAvg, run as such)."""
H19_WEIGHT_DECAY = 0.004
"""Section 4 (and Hsu et al. 2020's CIFAR runs use the same network; their value was lost in our text)."""
H19_ROUNDS = 10_000
H19_LR_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
"""The client learning rates the paper searches (Section 4)."""
H19_CENTRALIZED = 86.0
"""Section 4.2: the centralized CIFAR-10 baseline (TensorFlow tutorial)."""
H19_MOST_SKEWED = (30.1, 76.9)
"""Abstract: FedAvg -> FedAvgM accuracy "in the most skewed settings" (CIFAR-10)."""
H19_S42_TEXT = "E=1, C=0.05: FedAvgM stays above 75%, FedAvg falls to around 35% (Section 4.2, Figure 5)"

H20_CENTRALIZED = {"CIFAR-10": 86.16, "iNaturalist": 57.90, "Landmarks-User-160k": 67.05}
"""Table 1."""
H20_TABLE2: dict[tuple[str, str, bool], tuple[float, ...]] = {
    # Table 2, report goal 10: Acc@Round 1k, 2.5k, 5k and Acc@Batch 10k, 25k, 50k, in %.
    ("iNaturalist-Geo-3k", "fedavg", False): (47.0, 47.9, 48.7, 37.8, 44.4, 46.5),
    ("iNaturalist-Geo-3k", "fedavgm", False): (47.2, 50.4, 45.0, 42.5, 47.1, 44.9),
    ("iNaturalist-Geo-3k", "fedavg", True): (37.4, 46.2, 52.8, 46.2, 53.1, 55.5),
    ("iNaturalist-Geo-3k", "fedavgm", True): (49.7, 54.8, 56.7, 54.8, 56.7, 57.1),
    ("iNaturalist-User-120k", "fedavg", False): (34.7, 39.7, 41.3, 37.8, 39.8, 42.9),
    ("iNaturalist-User-120k", "fedavgm", False): (31.9, 39.2, 41.3, 32.3, 41.6, 43.4),
    ("iNaturalist-User-120k", "fedavg", True): (31.3, 39.7, 43.9, 39.7, 48.9, 52.8),
    ("iNaturalist-User-120k", "fedavgm", True): (37.9, 43.7, 49.1, 43.7, 47.4, 54.6),
}
H20_TABLE2_ROUNDS = (1000, 2500, 5000)
H20_TABLE2_BATCHES = (10_000, 25_000, 50_000)
H20_FEDIR: dict[tuple[str, str], tuple[float, float]] = {
    # accuracy in % at 5k rounds, report goal 10, (without FedIR, with FedIR)
    ("Landmarks-User-160k, all layers (Table 4)", "fedavg"): (49.7, 51.7),
    ("Landmarks-User-160k, all layers (Table 4)", "fedavgm"): (53.7, 53.5),
    ("iNaturalist-User-120k, with FedVC (Table 3)", "fedavg"): (43.9, 47.5),
    ("iNaturalist-User-120k, with FedVC (Table 3)", "fedavgm"): (49.1, 47.0),
}
H20_GEO3K_MAX_STEPS = 46
"""Section 6.3: iNaturalist-Geo-3k clients "can take up to 46 (i.e. 3000/64) local steps"."""
H20_LR = 0.01
"""Section 6.5: client learning rate (constant)."""

ALGO_LABEL = {"fedavg": "FedAvg", "fedavgm": "FedAvgM"}
MODELS = ("cifar-cnn", "cnn")
TEST_SIZE = {"digits": 359, "fashion-mnist": 10_000, "mnist": 10_000, "cifar10": 10_000}
PIXELS = {"digits": 64, "fashion-mnist": 784, "mnist": 784, "cifar10": 3072}
STEP_S = {"cifar-cnn": 0.13, "cnn": 0.025}
"""Seconds per client step (forward + backward of one 64-example minibatch of 28x28 images) on one core, measured
on the 2-core machine this study was written on while another benchmark ran (docs/study.md: 0.22 and 0.03), divided
by the compiled max-pool and LRN's speed-up per training step (1.68x and 1.22x, ``python -m geodml.bench layers``,
docs/performance.md); for estimates only."""
EVAL_S = {"cifar-cnn": 11.3, "cnn": 2.5}
"""Seconds per 10,000 28x28 test images evaluated, measured likewise (20 and 3.5 s, divided by 1.77x and 1.41x)."""

PARTITION_EVAL_EXAMPLES = 500
"""Test rows each partition's own final model is scored on (geodml --partition-eval-examples). The hsu
studies report the global model only; at the end of a run geodml also scores every distinct model the
clients hold (the round snapshots of their last participation: about 40 at C = 0.05), which on the
whole test set was 19% (hsu2019) and 27% (hsu2020) of the estimated study time; summary.json still gets every client's
accuracy, on these rows."""

FULL_FINAL_ROUNDS = 10
"""Rounds a run's final accuracy is averaged over (``--final-rounds``, full budget). With 5 or 10 of the 100
clients per round the global model moves by several points from one round to the next, so one evaluation
after the last round is a noisy measure, and tuning on it picks noise; geodml evaluates the global model
after each of these rounds too (``--eval-at``), which costs FULL_FINAL_ROUNDS - 1 more test-set passes per run."""

# flags the studies set themselves; refused after "--"
CONTROLLED = ("algo", "out", "dataset", "partition", "alpha", "client_size", "size_zipf", "model", "lr", "steps",
              "epochs", "batch_size", "momentum", "weight_decay", "seed", "client_fraction", "iter_local",
              "local_epochs", "server_momentum", "server_lr", "server_nesterov", "fedir", "virtual_client_size",
              "eval_every", "eval_at", "log_every", "partitions", "partition_eval_examples", "rounds", "eval_every_rounds")


@dataclass(frozen=True)
class Protocol:
    """The population and client training of one budget."""

    clients: int
    client_size: int
    batch: int

    @property
    def iter_local(self) -> int:
        """E = 1 local epoch of an equal-size client: ceil(n / B) steps."""
        return math.ceil(self.client_size / self.batch)


FULL = Protocol(clients=100, client_size=500, batch=64)
"""Hsu et al. 2019 Section 3/4: 100 clients x 500 examples, B = 64 (8 local steps per epoch)."""
QUICK = Protocol(clients=20, client_size=50, batch=16)
"""digits (1,438 training images): 20 clients x 50, B = 16 (4 local steps): the machinery, not the science."""


@dataclass(frozen=True)
class Run:
    """One planned run and the coordinates the tables use."""

    spec: RunSpec
    part: str
    """hsu2019: 'fedavg' | 'fedavgm'; hsu2020: 'fedir' | 'fedvc' (FedVC) | 'e1' (E = 1, without FedVC)."""
    algo: str
    """'fedavg' or 'fedavgm' (server momentum)."""
    seed: int
    lr: float
    """The client learning rate eta passed as --lr."""
    alpha: float
    fraction: float
    eta_eff: float | None = None
    beta: float = 0.0
    fedir: bool = False
    fedvc: bool = False
    rounds: int = 0
    steps: int = 0
    eval_every: int = 0
    client_steps: int = 0
    """Local steps of all participants over the run (the compute)."""
    eval_images: int = 0
    """Images the run evaluates (periodic and final global evaluations, the final per-partition ones), an estimate."""
    final_steps: tuple[int, ...] = ()
    """The steps (round ends) whose evaluations the run's final accuracy averages; empty or one: the last evaluation."""
    budget_steps: tuple[tuple[int, int], ...] = ()
    """hsu2020's E = 1 runs: (rounds r, step S(r)) of every round budget the run evaluates (--eval-at, and the end)."""

    @property
    def run_id(self) -> str:
        return self.spec.run_id


def eta_for(eta_eff: float, beta: float) -> float:
    """The client rate at effective rate eta_eff = eta / (1 - beta) (Hsu et al. 2019, Figure 6)."""
    return float(f"{eta_eff * (1.0 - beta):.12g}")


# ---- arguments -----------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise StudyError(message)


def _algo_list(text: str) -> tuple[str, ...]:
    algos = tuple(a for a in text.replace(" ", "").split(",") if a)
    if not algos or any(a not in ALGO_LABEL for a in algos) or len(set(algos)) != len(algos):
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of fedavg,fedavgm, got {text!r}")
    return algos


def _base_parser(name: str, description: str) -> _Parser:
    p = _Parser(prog=f"python -m geodml.study {name}", description=description,
                formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                epilog="Flags after '--' go to every geodml run (e.g. -- --threads 2). Finished runs (summary.json) are "
                       "reused, so an interrupted study resumes. Details, run counts and time estimates: docs/study.md.")
    p.add_argument("--budget", choices=("quick", "full"), default="full",
                   help="quick: digits, 20 tiny clients, a few rounds (checks the machinery); full: the paper's protocol on "
                        "fashion-mnist at the round budget below")
    p.add_argument("--dataset", choices=DATASETS, default=None, help="default: digits for quick, fashion-mnist for full")
    p.add_argument("--model", choices=MODELS, default="cifar-cnn",
                   help="cifar-cnn: the papers' CIFAR CNN (two 5x5x64 convolutions, fc 384, fc 192); cnn: McMahan et al.'s "
                        "MNIST CNN, about 7x cheaper (not the papers')")
    p.add_argument("--seeds", type=seed_list, help="populations and initializations (default: quick 0, full 0,1,2)")
    p.add_argument("--processes", type=int, default=1,
                   help="processes R hosting each run's 100 partitions (results do not depend on R; 1 is the cheapest: "
                        "one engine in one process, one core per run; use --jobs for parallelism)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time")
    p.add_argument("--run-timeout", type=float, default=12 * 3600.0, help="seconds before a run is killed and reported")
    p.add_argument("--out", help=f"study directory (default runs/study-{name}-DATASET-BUDGET)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    common.add_checkpoint_every(p)
    common.add_dry_run(p)
    common.add_only(p)
    p.add_argument("--keep-partition-models", action="store_true",
                   help="keep every run's rank*/model.pt (up to one per partition, 5.5 MB each for cifar-cnn); by default "
                        "they are deleted when a run ends (the reports read summary.json and metrics.jsonl)")
    return p


def _split_argv(argv: list[str]) -> tuple[list[str], tuple[str, ...]]:
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], tuple(argv[cut + 1:])
    return argv, ()


def _finish_common(name: str, args: argparse.Namespace, extra: tuple[str, ...]) -> None:
    """Defaults by budget and the checks every hsu study shares (StudyError on bad input)."""
    args.name, args.geodml_args = name, extra
    args.protocol = QUICK if args.budget == "quick" else FULL
    args.dataset = args.dataset or ("digits" if args.budget == "quick" else "fashion-mnist")
    args.seeds = args.seeds if args.seeds is not None else ((0,) if args.budget == "quick" else (0, 1, 2))
    if args.jobs < 1:
        raise StudyError(f"--jobs must be >= 1, got {args.jobs}")
    if not 1 <= args.processes <= args.protocol.clients:
        raise StudyError(f"--processes must be in 1..{args.protocol.clients} (the partitions), got {args.processes}")
    if not (math.isfinite(args.run_timeout) and args.run_timeout > 0):
        raise StudyError(f"--run-timeout must be > 0, got {args.run_timeout}")
    if args.out is None:
        args.out = str(Path("runs") / f"study-{name}-{args.dataset}-{args.budget}")
    common.check_extra_flags(extra, CONTROLLED)


def _positive(name: str, values: Iterable[float]) -> None:
    bad = [v for v in values if not v > 0]
    if bad:
        raise StudyError(f"{name} must be > 0, got {fmt(bad[0])}")


def _fractions(name: str, values: Iterable[float], clients: int) -> None:
    for c in values:
        if not 0 < c <= 1:
            raise StudyError(f"{name} must be fractions in (0, 1], got {fmt(c)}")
        if math.floor(c * clients + 1e-9) < 1:
            raise StudyError(f"{name} {fmt(c)} selects no client of {clients} (floor(C K) = 0)")


# ---- shared pieces of a plan ---------------------------------------------------------------------------

def base_flags(args: argparse.Namespace, seed: int) -> list[str]:
    """What every run of an hsu study shares: data, network, client optimizer (plain SGD), seed."""
    p = args.protocol
    return ["--algo", "fedavg", "--dataset", args.dataset, "--model", args.model, "--batch-size", str(p.batch),
            "--momentum", "0", "--weight-decay", fmt(H19_WEIGHT_DECAY), "--seed", str(seed),
            "--comm-timeout", "3600", "--partition-eval-examples", str(partition_eval_rows(args.dataset))]


def partition_eval_rows(dataset: str) -> int:
    return min(PARTITION_EVAL_EXAMPLES, TEST_SIZE.get(dataset, 10_000))


def server_flags(algo: str, beta: float, *, nesterov: bool) -> list[str]:
    if algo == "fedavg":
        return []
    return ["--server-momentum", fmt(beta), "--server-lr", "1", *(["--server-nesterov"] if nesterov else [])]


def num_selected(fraction: float, clients: int) -> int:
    from geodml.algorithms.fedavg import num_participants
    return num_participants(fraction, clients)


def distinct_snapshots(clients: int, m: int, rounds: int, seed: int) -> int:
    """How many different models the partitions hold at the end (each the global model of the round after its
    last participation, or the initial one): the final per-partition evaluations geodml makes (an estimate for
    FedVC's size-proportional selection, exact for uniform selection on one process)."""
    from geodml.algorithms.fedavg import select_round  # geodml's own seeded draw (lazy: --help stays light)

    last = np.full(clients, -1)
    for t in range(rounds):
        last[list(select_round(seed, t, clients, m))] = t
    return len(set(last.tolist()))


def eval_images(args: argparse.Namespace, *, steps: int, eval_every: int, m: int, rounds: int, seed: int,
                population: int, extra_evals: int = 0) -> int:
    """Images evaluated: every ``eval_every`` steps, at the end and ``extra_evals`` more times (--eval-at) on the
    test set, then each distinct partition model on the PARTITION_EVAL_EXAMPLES rows and each partition's model on
    its own data (geodml's end-of-run report)."""
    test = TEST_SIZE.get(args.dataset, 10_000)
    periodic = steps // eval_every + (0 if steps % eval_every == 0 else 1) + extra_evals
    return (periodic * test + distinct_snapshots(args.protocol.clients, m, rounds, seed) * partition_eval_rows(args.dataset)
            + population)


def final_rounds_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--final-rounds", type=int, help="a run's final accuracy is the mean of the global model's "
                   f"accuracy after each of its last W rounds (default: quick 1, full {FULL_FINAL_ROUNDS} or --rounds if "
                   "fewer; 1: the last evaluation only); geodml evaluates those rounds too (--eval-at)")


def tail_steps(args: argparse.Namespace, *, steps_per_round: int, every: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the steps whose evaluations a run's final accuracy averages: the last --final-rounds round ends; those of
    them the periodic evaluation, every ``every`` steps and at the end, misses: geodml's --eval-at)."""
    final = tuple(r * steps_per_round for r in range(args.rounds - args.final_rounds + 1, args.rounds + 1))
    return final, tuple(x for x in final[:-1] if x % every)


def eval_at_flags(steps: Sequence[int]) -> list[str]:
    return ["--eval-at", ",".join(map(str, steps))] if steps else []


def core_seconds(args: argparse.Namespace, runs: Sequence[Run]) -> tuple[float, float]:
    """(training, evaluation) core-seconds of ``runs`` from the per-step and per-eval times measured (STEP_S, EVAL_S)."""
    scale = PIXELS.get(args.dataset, 784) / 784
    train = sum(r.client_steps for r in runs) * STEP_S[args.model] * scale * args.protocol.batch / 64
    evals = sum(r.eval_images for r in runs) / 10_000 * EVAL_S[args.model] * scale
    return train, evals


def estimate_text(args: argparse.Namespace, runs: Sequence[Run], cores: int | None = None) -> str:
    """The --dry-run / start-of-study estimate. Each run is one single-threaded process (OMP_NUM_THREADS=1), so the
    wall time divides the core-hours by min(--jobs, cores): more jobs than this machine's cores run no faster."""
    train, evals = core_seconds(args, runs)
    total_h = (train + evals) / 3600
    cores = cores or usable_cores()
    parallel = min(args.jobs, cores)
    return (f"{len(runs)} runs, {sum(r.client_steps for r in runs):,} client steps; estimated "
            f"{total_h:,.1f} core-hours ({train / 3600:,.1f} training, {evals / 3600:,.1f} evaluation) at "
            f"{STEP_S[args.model]} s per 64-example step and {EVAL_S[args.model]} s per 10,000 test images of {args.model} "
            f"(measured on a loaded 2-core machine, docs/study.md): ~{total_h / parallel:,.1f} h with --jobs {args.jobs} "
            f"on {'' if parallel == cores else f'{parallel} of '}this machine's {cores} core{'s' if cores > 1 else ''}, if free")


def _finished_wall_s(run: Run) -> float | None:
    """A finished run's measured run time (summary.json's wall_seconds), or None (not finished, or no usable time)."""
    s = read_summary(run.spec.out)
    wall = None if s is None else s.get("wall_seconds")
    if isinstance(wall, bool) or not isinstance(wall, (int, float)) or not math.isfinite(wall) or wall <= 0:
        return None
    return float(wall)


def pace_text(args: argparse.Namespace, runs: Sequence[Run]) -> str:
    """The measured pace of the runs already finished in the study directory against the estimate (STEP_S and EVAL_S
    are one machine's; another runs faster or slower), and the other runs' time at that pace; '' when none has
    finished. Wall time, not core time: each finished run was timed at the concurrency it ran with."""
    done: list[tuple[Run, float]] = []
    todo: list[Run] = []
    for r in runs:
        wall = _finished_wall_s(r)
        if wall is None:
            todo.append(r)
        else:
            done.append((r, wall))
    est_s = sum(core_seconds(args, [r for r, _ in done]))
    if not done or est_s <= 0:
        return ""
    wall_s = sum(w for _, w in done)
    ratio = wall_s / est_s
    left_h = sum(core_seconds(args, todo)) * ratio / 3600
    n = len(done)
    return (f"{n} of these runs {'has' if n == 1 else 'have'} finished in {args.out}, in {wall_s / 3600:,.2f} h of run "
            f"time (summed over runs), {ratio:.2f}x the estimate for {'it' if n == 1 else 'them'}; at that pace the other "
            f"{len(todo)} (to run, running elsewhere or failed) take ~{left_h / args.jobs:,.1f} h with --jobs {args.jobs}")


def prune_partition_models(result: RunResult) -> None:
    """Delete a finished run's per-partition model files (rank*/model.pt), keep the global model.pt and the rest."""
    if not result.succeeded:
        return
    for path in Path(result.spec.out).glob("rank*/model.pt"):
        try:
            path.unlink()
        except OSError:
            pass


def prune_hook(args: argparse.Namespace) -> Callable[[RunResult], None] | None:
    """What each run's end triggers: deleting its partition models, unless --keep-partition-models."""
    return None if args.keep_partition_models else prune_partition_models


def execute(args: argparse.Namespace, runs: list[Run], launcher: Launcher) -> list[RunResult]:
    """Run (or reuse) ``runs`` (common.run_specs), pruning partition models as each ends (prune_hook)."""
    return common.run_specs(args, [r.spec for r in runs], launcher, on_result=prune_hook(args))


def run_only(name: str, args: argparse.Namespace, pool: list[Run], total: int, launcher: Launcher, *,
             later_note: str = "") -> int:
    """common.run_only over the specs of ``pool`` (of a plan of ``total`` runs), pruning as execute does."""
    return common.run_only(name, args, [r.spec for r in pool], launcher, total=total, later_note=later_note,
                           on_result=prune_hook(args))


# ---- results -------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    """A run with its result: final accuracy and evaluation curve (step, accuracy)."""

    run: Run
    status: str
    accuracy: float | None = None
    """The final accuracy: the mean over the run's ``final_steps`` evaluations (one or none: the last evaluation)."""
    last_round_accuracy: float | None = None
    """The last evaluation alone (summary.json's final_val_accuracy; val_loss is that evaluation's too)."""
    val_loss: float | None = None
    wall_s: float | None = None
    error: str | None = None
    curve: list[tuple[int, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.accuracy is not None


def outcomes(runs: Sequence[Run], results: Sequence[RunResult], *, curves: bool = False) -> list[Outcome]:
    from geodml.runs import ReportError, load_run
    by_id = {r.spec.run_id: r for r in results}
    out = []
    for run in runs:
        res = by_id.get(run.run_id)
        if res is None:
            out.append(Outcome(run, "not run"))
            continue
        s = res.summary if res.succeeded else None
        acc = None if s is None else s.get("final_val_accuracy")
        last = acc if isinstance(acc, (int, float)) else None
        o = Outcome(run, res.status, accuracy=last, last_round_accuracy=last,
                    val_loss=None if s is None else s.get("final_val_loss"),
                    wall_s=None if s is None else s.get("wall_seconds"), error=res.error)
        if (curves or len(run.final_steps) > 1) and o.ok:
            try:
                o.curve = [(int(e["step"]), float(e["val_accuracy"])) for e in load_run(run.spec.out).evals]
            except (ReportError, KeyError, ValueError):
                o.curve = []
        if len(run.final_steps) > 1 and o.ok:
            tail = [a for step in run.final_steps if (a := _acc_at(o.curve, step)) is not None]
            o.accuracy = statistics.fmean(tail) if len(tail) == len(run.final_steps) else None
            if o.accuracy is None:
                o.status, o.error = "incomplete", (f"metrics.jsonl holds {len(tail)} of the {len(run.final_steps)} "
                                                   f"evaluations the final accuracy averages (steps {run.final_steps}); "
                                                   "delete the run's directory to run it again")
        out.append(o)
    return out


FAILED = ("failed", "timeout", "incomplete")
"""Outcome statuses excluded from every table and listed as failed."""


def pct(values: Sequence[float], planned: int | None = None) -> str:
    """'85.1 ± 0.3' (percent, mean ± sample std over seeds), '85.1' for one value, '-' for none; '(n=2/3)' when
    runs are missing."""
    m, s = mean_sd(values)
    if m is None:
        return "-"
    text = f"{100 * m:.1f}" + ("" if s is None else f" ± {100 * s:.1f}")
    return text + (f" (n={len(values)}/{planned})" if planned is not None and len(values) < planned else "")


def pp(values: Sequence[float], *, sign: bool = True) -> str:
    """A difference in percentage points, mean +- std: '+12.3 ± 1.0 pp' ('12.3 ± 1.0 pp' without the sign)."""
    m, s = mean_sd(values)
    if m is None:
        return "-"
    return (f"{100 * m:+.1f}" if sign else f"{100 * m:.1f}") + ("" if s is None else f" ± {100 * s:.1f}") + " pp"


CSV_FIELDS = ("run_id", "part", "algo", "fedir", "fedvc", "alpha", "fraction", "beta", "eta_eff", "lr", "seed", "rounds",
              "steps", "status", "accuracy", "last_round_accuracy", "val_loss", "wall_s", "dir", "error")


def rows(outs: Sequence[Outcome]) -> list[dict[str, Any]]:
    return [{"run_id": o.run.run_id, "part": o.run.part, "algo": o.run.algo, "fedir": o.run.fedir, "fedvc": o.run.fedvc,
             "alpha": o.run.alpha, "fraction": o.run.fraction, "beta": o.run.beta, "eta_eff": o.run.eta_eff,
             "lr": o.run.lr, "seed": o.run.seed, "rounds": o.run.rounds, "steps": o.run.steps, "status": o.status,
             "accuracy": o.accuracy, "last_round_accuracy": o.last_round_accuracy, "val_loss": o.val_loss, "wall_s": o.wall_s,
             "dir": str(o.run.spec.out), "error": o.error} for o in outs]


def write_csv(table: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in table:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})


def runs_table(outs: Sequence[Outcome]) -> list[str]:
    lines = ["| run | part | algorithm | alpha | C | beta | eta_eff | lr | seed | rounds | steps | accuracy | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in outs:
        r = o.run
        name = ALGO_LABEL[r.algo] + (" + FedIR" if r.fedir else "") + (" + FedVC" if r.fedvc else "")
        acc = "-" if o.accuracy is None else f"{o.accuracy:.4f}"
        lines.append(f"| {r.run_id} | {r.part} | {name} | {fmt(r.alpha)} | {fmt(r.fraction)} | {fmt(r.beta)} | "
                     f"{'-' if r.eta_eff is None else fmt(r.eta_eff)} | {r.lr:g} | {r.seed} | {r.rounds} | {r.steps} | "
                     f"{acc} | {o.status} |")
    for o in outs:
        if o.status in FAILED:
            lines.append(f"\nFailed (excluded from every table): {o.run.run_id}: {o.error}; "
                         f"stderr: {Path(o.run.spec.out) / 'stderr.txt'}")
    return lines


def write_report(name: str, out: Path, text: str, report: dict, table: list[dict[str, Any]]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    write_csv(table, out / f"{name}.csv")
    return [out / f"{name}.md", out / f"{name}.csv", out / f"{name}.json"]


def final_text(args: argparse.Namespace) -> str:
    """How a run's final accuracy is measured, for the reports."""
    if args.final_rounds == 1:
        return "the global model after the last round"
    return (f"the mean of the global model's accuracy after each of the last {args.final_rounds} rounds; "
            "the CSV's last_round_accuracy column has the last round alone")


def alpha_label(alpha: float) -> str:
    return fmt(alpha)


# =========================================================================================================
# hsu2019
# =========================================================================================================

def parse_2019(argv: list[str]) -> argparse.Namespace:
    head, extra = _split_argv(argv)
    p = _base_parser("hsu2019", "Hsu et al. 2019: FedAvg over Dirichlet alpha and report goal C (Figure 2), FedAvgM's "
                     "server momentum at a fixed effective learning rate (Figures 5, 6), on 100 clients x 500 examples.")
    p.add_argument("--rounds", type=int, help="communication rounds per run (default: quick 3, full 100; the paper: 10,000)")
    p.add_argument("--eval-rounds", type=int, help="rounds between evaluations of the global model (default rounds/10)")
    p.add_argument("--alphas", type=finite_floats, help="Dirichlet alphas (default: quick 100,0; full 100,10,1,0.5,0.2,0.1,"
                   "0.05,0)")
    p.add_argument("--fractions", type=finite_floats, help="FedAvg report goals C (default: quick 0.1,0.2; full "
                   "0.05,0.1,0.2,0.4)")
    p.add_argument("--momentum-fractions", type=finite_floats, help="report goals C of the FedAvgM cells (default: quick "
                   "0.1, full 0.05)")
    p.add_argument("--betas", type=finite_floats, help="FedAvgM server momenta, Nesterov with server lr 1 as the paper's "
                   "implementation (default: quick 0.9, full 0.7,0.9,0.97,0.99,0.997)")
    p.add_argument("--fedavg-only", action="store_true", help="FedAvg cells alone (the paper's Figure 2), no FedAvgM: "
                   "neither --momentum-fractions nor --betas may be given")
    p.add_argument("--lrs", type=finite_floats, help="effective learning rates eta_eff = eta/(1-beta) of every cell's grid "
                   "(FedAvg's too unless --fedavg-lrs; default: quick 0.05,0.2; full 0.03,0.1,0.3)")
    p.add_argument("--fedavg-lrs", type=finite_floats, help="FedAvg's own rate grid, when it differs from --lrs (default: "
                   "--lrs). Every FedAvgM cell still brings its FedAvg cell at the same C; this lets an extension of "
                   "FedAvgM's grid pair with FedAvg's known best rate instead of rerunning FedAvg where it diverges")
    p.add_argument("--tune-seeds", type=int, default=1, help="seeds (the first of --seeds) every grid point runs at; the "
                   "best setting of a cell then runs at the other seeds")
    final_rounds_arg(p)
    args = p.parse_args(head)
    _finish_common("hsu2019", args, extra)
    quick = args.budget == "quick"
    args.rounds = args.rounds if args.rounds is not None else (3 if quick else 100)
    args.alphas = args.alphas or ((100.0, 0.0) if quick else H19_ALPHAS)
    args.fractions = args.fractions or ((0.1, 0.2) if quick else H19_FRACTIONS)
    if args.fedavg_only:
        if args.momentum_fractions is not None or args.betas is not None:
            raise StudyError("--fedavg-only runs no FedAvgM cell: drop --momentum-fractions and --betas")
        args.momentum_fractions, args.betas = (), ()
    else:
        args.momentum_fractions = args.momentum_fractions if args.momentum_fractions is not None else \
            ((0.1,) if quick else (0.05,))
        args.betas = args.betas or ((0.9,) if quick else H19_BETAS)
    args.lrs = args.lrs or ((0.05, 0.2) if quick else (0.03, 0.1, 0.3))
    args.fedavg_lrs = args.fedavg_lrs or args.lrs
    if args.rounds < 1:
        raise StudyError(f"--rounds must be >= 1, got {args.rounds}")
    args.final_rounds = final_rounds(args.final_rounds, rounds=args.rounds, quick=args.budget == "quick",
                                     full=FULL_FINAL_ROUNDS)
    args.eval_rounds = args.eval_rounds if args.eval_rounds is not None else max(1, args.rounds // 10)
    if args.eval_rounds < 1:
        raise StudyError(f"--eval-rounds must be >= 1, got {args.eval_rounds}")
    if any(not a >= 0 for a in args.alphas):
        raise StudyError("--alphas must be >= 0 (0: one class per client)")
    _fractions("--fractions", args.fractions, args.protocol.clients)
    _fractions("--momentum-fractions", args.momentum_fractions, args.protocol.clients)
    if any(not 0 < b < 1 for b in args.betas):
        raise StudyError("--betas must be in (0, 1) (beta = 0 is FedAvg, which every cell runs)")
    _positive("--lrs", args.lrs)
    _positive("--fedavg-lrs", args.fedavg_lrs)
    if not 1 <= args.tune_seeds <= len(args.seeds):
        raise StudyError(f"--tune-seeds must be in 1..{len(args.seeds)} (the number of --seeds), got {args.tune_seeds}")
    return args


def run_2019(args: argparse.Namespace, algo: str, alpha: float, fraction: float, eta_eff: float, beta: float,
             seed: int) -> Run:
    p = args.protocol
    it = p.iter_local
    lr = eta_for(eta_eff, beta)
    steps, every = args.rounds * it, args.eval_rounds * it
    final, extra = tail_steps(args, steps_per_round=it, every=every)
    slug = "fedavg" if algo == "fedavg" else f"fedavgm-b{fmt(beta)}"
    run_id = f"{slug}-lr{fmt(eta_eff)}-a{fmt(alpha)}-c{fmt(fraction)}-s{seed}"
    argv = (*base_flags(args, seed), "--partition", "dirichlet", "--alpha", fmt(alpha), "--client-size", str(p.client_size),
            "--client-fraction", fmt(fraction), "--iter-local", str(it), "--lr", fmt(lr),
            *server_flags(algo, beta, nesterov=True),
            "--steps", str(steps), "--eval-every", str(every), *eval_at_flags(extra), "--log-every", str(it), *args.geodml_args)
    m = num_selected(fraction, p.clients)
    return Run(RunSpec(run_id, Path(args.out) / run_id, argv, p.clients), part=algo, algo=algo, seed=seed, lr=lr,
               alpha=alpha, fraction=fraction, eta_eff=eta_eff, beta=beta, rounds=args.rounds, steps=steps,
               eval_every=every, client_steps=steps * m, final_steps=final,
               eval_images=eval_images(args, steps=steps, eval_every=every, m=m, rounds=args.rounds, seed=seed,
                                       population=p.clients * p.client_size, extra_evals=len(extra)))


CellKey = tuple[str, float, float]
"""(algorithm, alpha, C)."""
Setting = tuple[float, float]
"""(beta, eta_eff)."""


def cells_2019(args: argparse.Namespace) -> dict[CellKey, list[Setting]]:
    """Each cell's grid: FedAvg at every (alpha, C) over eta_eff; FedAvgM at every (alpha, momentum C) over beta x eta_eff."""
    cells: dict[CellKey, list[Setting]] = {}
    for alpha in args.alphas:
        for c in dict.fromkeys((*args.fractions, *args.momentum_fractions)):  # FedAvgM's C always has its FedAvg cell
            cells[("fedavg", alpha, c)] = [(0.0, e) for e in args.fedavg_lrs]
        for c in args.momentum_fractions:
            cells[("fedavgm", alpha, c)] = [(b, e) for b in args.betas for e in args.lrs]
    return cells


def plan_2019_tuning(args: argparse.Namespace) -> list[Run]:
    return [run_2019(args, algo, alpha, c, eta, beta, seed)
            for (algo, alpha, c), grid in cells_2019(args).items() for seed in args.seeds[:args.tune_seeds]
            for beta, eta in grid]


def choose_2019(args: argparse.Namespace, tuning: Sequence[Outcome]) -> dict[CellKey, Setting]:
    """Each cell's setting with the best mean final accuracy over the tuning seeds (ties: the earlier grid point;
    settings with a failed tuning run are excluded). Cells without any successful setting are absent."""
    chosen: dict[CellKey, Setting] = {}
    for key, grid in cells_2019(args).items():
        best: tuple[float, Setting] | None = None
        for setting in grid:
            accs = [o.accuracy for o in tuning if _key(o.run) == key and (o.run.beta, o.run.eta_eff) == setting]
            if len(accs) < args.tune_seeds or any(a is None for a in accs):
                continue
            mean = statistics.fmean(a for a in accs if a is not None)
            if best is None or mean > best[0]:
                best = (mean, setting)
        if best is not None:
            chosen[key] = best[1]
    return chosen


def _key(run: Run) -> CellKey:
    return (run.algo, run.alpha, run.fraction)


def plan_2019_confirm(args: argparse.Namespace, chosen: dict[CellKey, Setting]) -> list[Run]:
    return [run_2019(args, algo, alpha, c, eta, beta, seed)
            for (algo, alpha, c), (beta, eta) in chosen.items() for seed in args.seeds[args.tune_seeds:]]


@dataclass
class CellResult:
    key: CellKey
    setting: Setting | None
    by_seed: dict[int, float]
    """The accuracy of each finished run at the chosen setting, by seed (for gains paired per seed)."""
    planned: int
    edge: bool
    """The chosen eta_eff (or FedAvgM's beta) is at an end of its grid: the tuning may be truncated."""
    grid: dict[Setting, list[float | None]]
    """Every grid point's accuracies at the tuning seeds (None: failed)."""

    @property
    def accs(self) -> list[float]:
        return list(self.by_seed.values())

    @property
    def one_rate(self) -> bool:
        """The cell's eta_eff grid has one point: its rate was not tuned at all (an edge on both sides)."""
        return len({eta for _, eta in self.grid}) == 1


def cell_results(args: argparse.Namespace, outs: Sequence[Outcome], chosen: dict[CellKey, Setting]) -> dict[CellKey, CellResult]:
    res: dict[CellKey, CellResult] = {}
    tune = set(args.seeds[:args.tune_seeds])
    for key, grid in cells_2019(args).items():
        table: dict[Setting, list[float | None]] = {s: [] for s in grid}
        for o in outs:
            if _key(o.run) == key and o.run.seed in tune:
                table[(o.run.beta, float(o.run.eta_eff or 0.0))].append(o.accuracy)
        setting = chosen.get(key)
        done = {o.run.seed: o.accuracy for o in outs if setting is not None and _key(o.run) == key
                and (o.run.beta, o.run.eta_eff) == setting and o.accuracy is not None}
        etas, betas = sorted({e for _, e in grid}), sorted({b for b, _ in grid})  # the cell's own grid (FedAvg: beta 0 only)
        edge = setting is not None and ((len(etas) > 1 and setting[1] in (etas[0], etas[-1]))
                                        or (len(betas) > 1 and setting[0] in (betas[0], betas[-1])))
        res[key] = CellResult(key, setting, done, len(args.seeds), edge, table)
    return res


def _cell_text(c: CellResult | None, *, with_setting: bool = True) -> str:
    if c is None:
        return ""
    if c.setting is None:
        return "FAILED"
    beta, eta = c.setting
    what = (f"lr {fmt(eta)}" if c.key[0] == "fedavg" else f"β {fmt(beta)}, η_eff {fmt(eta)}") + _marks(c)
    return pct(c.accs, c.planned) + (f" [{what}]" if with_setting else "")


def _marks(c: CellResult) -> str:
    """The tuning caveats of a cell's chosen setting, as the report's legend explains them."""
    return (" (edge)" if c.edge else "") + (" (one rate)" if c.one_rate else "")


def paper_2019(algo: str, alpha: float, c: float) -> str:
    """The paper's text numbers for a cell (CIFAR-10, 10,000 rounds); '' where the text has none (Figure 2's values
    are in the figure only)."""
    if alpha == 0 and c == 0.05:
        return ("≈35 (§4.2); 30.1 (abstract, 'most skewed')" if algo == "fedavg"
                else ">75 (§4.2); 76.9 (abstract, 'most skewed')")
    return ""


def _paired_gain(lo: dict[int, float], hi: dict[int, float]) -> tuple[float, str]:
    """hi - lo (accuracies per seed): paired per seed over the common seeds, '+3.7 ± 1.7 pp (3 seeds)'; without a
    common seed the difference of the means, '+3.7 pp (means)'. Returns (the mean gain, its text)."""
    common = sorted(set(lo) & set(hi))
    if common:
        gains = [hi[s] - lo[s] for s in common]
        return statistics.fmean(gains), f"{pp(gains)} ({len(common)} seed{'s' if len(common) > 1 else ''})"
    gain = statistics.fmean(hi.values()) - statistics.fmean(lo.values())
    return gain, f"{100 * gain:+.1f} pp (means)"


def _c_returns(alphas: list[float], fracs: list[float], accs: Callable[[CellKey], dict[int, float] | None]) -> list[str]:
    """Claim 2's evidence (FedAvg, best lr per cell; ``accs`` gives a cell's accuracy per seed): the gain of each step up
    in C per alpha, paired per seed, and per doubling of C where a step is not one doubling (the paper's C grid
    doubles: 0.05, 0.1, 0.2, 0.4); whether each step gains less per doubling than the one before (diminishing
    returns); and the gain over the widest C range that the most identical and the most skewed alpha both ran, side
    by side (marginal for identical data)."""
    out = ["2. **Increasing C yields diminishing returns, the gain especially marginal for identically distributed "
           "clients (Section 4.1, Figure 2).**"]
    known = {a: {c: v for c in fracs if (v := accs(("fedavg", a, c)))} for a in alphas}
    for a in alphas:
        ks = list(known[a].items())
        if len(ks) < 2:
            continue
        parts, per_doubling = [], []
        for (c0, lo), (c1, hi) in zip(ks, ks[1:]):
            gain, text = _paired_gain(lo, hi)
            doublings = math.log2(c1 / c0)
            per_doubling.append(gain / doublings)
            parts.append(f"{fmt(c0)} -> {fmt(c1)} {text}"
                         + ("" if math.isclose(doublings, 1.0) else f" = {100 * gain / doublings:+.1f} pp per doubling"))
        text = ", ".join(parts)
        if len(per_doubling) >= 2:
            smaller = sum(1 for g0, g1 in zip(per_doubling, per_doubling[1:]) if g1 < g0)
            text += f"; per doubling of C, a step gains less than the one before in {smaller} of {len(per_doubling) - 1} pairs"
        out.append(f"   - alpha={fmt(a)}: gain per step up in C: {text}")
    ident, skew = (alphas[0], alphas[-1]) if len(alphas) >= 2 else (None, None)
    if ident is not None:
        common = sorted(known[ident].keys() & known[skew].keys())
        if len(common) >= 2:
            lo, hi = common[0], common[-1]
            g_id, t_id = _paired_gain(known[ident][lo], known[ident][hi])
            g_sk, t_sk = _paired_gain(known[skew][lo], known[skew][hi])
            out.append(f"   - C {fmt(lo)} -> {fmt(hi)}: alpha={fmt(ident)} {t_id} vs alpha={fmt(skew)} {t_sk}; "
                       f"smaller for the more identical clients: {'yes' if g_id < g_sk else 'no'}")
    return out


def claims_2019(args: argparse.Namespace, cells: dict[CellKey, CellResult]) -> list[str]:
    """The measured evidence per claim of the paper (a human writes the verdict)."""
    out: list[str] = []

    def mean(key: CellKey) -> float | None:
        c = cells.get(key)
        return None if c is None or not c.accs else statistics.fmean(c.accs)

    alphas = sorted(args.alphas, reverse=True)   # identical -> skewed
    fracs = sorted(args.fractions)
    out.append("1. **Accuracy falls as alpha goes to 0 and as C shrinks (FedAvg, best lr per cell; Figure 2).**")
    for c in fracs:
        accs = [(a, mean(("fedavg", a, c))) for a in alphas]
        known = [(a, m) for a, m in accs if m is not None]
        if len(known) >= 2:
            falls = sum(1 for (_, x), (_, y) in zip(known, known[1:]) if y < x)
            out.append(f"   - C={fmt(c)}: alpha {fmt(known[0][0])} -> {fmt(known[-1][0])}: {100 * known[0][1]:.1f}% -> "
                       f"{100 * known[-1][1]:.1f}% ({100 * (known[-1][1] - known[0][1]):+.1f} pp); accuracy falls at "
                       f"{falls} of {len(known) - 1} steps towards smaller alpha")
    for a in alphas:
        accs2 = [(c, mean(("fedavg", a, c))) for c in fracs]
        known2 = [(c, m) for c, m in accs2 if m is not None]
        if len(known2) >= 2:
            falls = sum(1 for (_, x), (_, y) in zip(known2, known2[1:]) if y > x)
            out.append(f"   - alpha={fmt(a)}: C {fmt(known2[-1][0])} -> {fmt(known2[0][0])}: {100 * known2[-1][1]:.1f}% -> "
                       f"{100 * known2[0][1]:.1f}% ({100 * (known2[0][1] - known2[-1][1]):+.1f} pp); accuracy is lower at "
                       f"the smaller C in {falls} of {len(known2) - 1} steps")
    out += _c_returns(alphas, fracs, lambda key: cells[key].by_seed if key in cells else None)
    out.append("3. **Server momentum recovers much of the loss in the most skewed settings (Figure 5; the paper: "
               f"30.1% -> 76.9%, abstract; {H19_S42_TEXT}).**")
    if not args.momentum_fractions:
        out.append("   - not measured: --fedavg-only ran no FedAvgM cell")
    for c in sorted(args.momentum_fractions):
        ref = mean(("fedavg", alphas[0], c))
        for a in alphas[-2:][::-1]:
            f_, m_ = cells.get(("fedavg", a, c)), cells.get(("fedavgm", a, c))
            if f_ is None or m_ is None or not f_.accs or not m_.accs:
                continue
            gain, gain_text = _paired_gain(f_.by_seed, m_.by_seed)
            lost = None if ref is None else ref - statistics.fmean(f_.accs)
            share = f"; recovers {100 * gain / lost:.0f}% of FedAvg's loss to alpha={fmt(alphas[0])}" if lost and lost > 0 else ""
            out.append(f"   - C={fmt(c)}, alpha={fmt(a)}: FedAvg {pct(f_.accs)}% -> FedAvgM {pct(m_.accs)}%: "
                       f"{gain_text}{share}")
    out.append("4. **The best hyper-parameters move with alpha (Figures 4, 6): the chosen setting per cell, and the margin of "
               "the best grid point over the runner-up at the tuning seeds.**")
    for algo, fr in (("fedavg", fracs), ("fedavgm", sorted(args.momentum_fractions))):
        for c in fr:
            parts = []
            for a in alphas:
                cr = cells.get((algo, a, c))
                if cr is None or cr.setting is None:
                    continue
                means = sorted((statistics.fmean(v) for v in (
                    [x for x in accs if x is not None] for accs in cr.grid.values()) if v), reverse=True)
                margin = f", margin {100 * (means[0] - means[1]):.1f} pp" if len(means) > 1 else ""
                what = f"lr {fmt(cr.setting[1])}" if algo == "fedavg" else f"β {fmt(cr.setting[0])}/η_eff {fmt(cr.setting[1])}"
                parts.append(f"alpha {fmt(a)}: {what}{_marks(cr)}{margin}")
            if parts:
                distinct = len({cells[(algo, a, c)].setting for a in alphas
                                if (algo, a, c) in cells and cells[(algo, a, c)].setting is not None})
                out.append(f"   - {ALGO_LABEL[algo]} C={fmt(c)}: {distinct} distinct best settings over {len(parts)} alphas: "
                           + "; ".join(parts))
    return out


def markdown_2019(args: argparse.Namespace, cells: dict[CellKey, CellResult], outs: Sequence[Outcome],
                  claims: list[str]) -> str:
    p = args.protocol
    alphas = sorted(args.alphas, reverse=True)
    lines = [f"# hsu2019: Hsu, Qi & Brown 2019 on {args.dataset}, budget {args.budget}", "",
             f"{p.clients} clients x {p.client_size} examples, class mix Dir(alpha p) drawn without replacement; E = 1 "
             f"(= {p.iter_local} local steps of B = {p.batch}, --iter-local), plain client SGD, weight decay "
             f"{fmt(H19_WEIGHT_DECAY)}, {args.model}; {args.rounds} rounds per run (the paper: {H19_ROUNDS:,}); "
             f"learning rates: the eta_eff grid {', '.join(fmt(x) for x in args.lrs)}"
             + ("" if tuple(args.fedavg_lrs) == tuple(args.lrs)
                else f" (FedAvg's: {', '.join(fmt(x) for x in args.fedavg_lrs)})") + " (the paper: eta in "
             f"{{1e-4, 3e-4, ..., 0.3}}), tuned at seed(s) {', '.join(map(str, args.seeds[:args.tune_seeds]))}, "
             f"the best then run at {', '.join(map(str, args.seeds[args.tune_seeds:])) or 'no other seed'}. "
             f"Cells: final top-1 test accuracy in % ({final_text(args)}), mean ± std over seeds at the chosen "
             "setting [setting]; "
             "(edge): the best eta_eff (FedAvgM: or beta) is at an end of its grid, so the tuning may be truncated; "
             "(one rate): the cell ran one eta_eff, so its rate was not tuned.", "",
             "The paper's numbers are CIFAR-10 after 10,000 rounds; its per-cell values are in Figures 2 and 5 only "
             f"(not in the text), so the paper columns quote what the text states. Centralized CIFAR-10: "
             f"{H19_CENTRALIZED}% (§4.2).", "",
             "## Figure 2: FedAvg over alpha and report goal C", "",
             "| C \\ alpha | " + " | ".join(alpha_label(a) for a in alphas) + " |",
             "|---|" + "---|" * len(alphas)]
    for c in sorted(args.fractions):
        lines.append(f"| {fmt(c)} | " + " | ".join(_cell_text(cells.get(("fedavg", a, c))) for a in alphas) + " |")
    for c in sorted(args.momentum_fractions):
        lines += ["", f"## Figure 5: FedAvg vs FedAvgM (Nesterov, server lr 1), C = {fmt(c)}", "",
                  "| alpha | FedAvg | FedAvgM | gain, paired per seed | paper FedAvg | paper FedAvgM |",
                  "|---|---|---|---|---|---|"]
        for a in alphas:
            f_, m_ = cells.get(("fedavg", a, c)), cells.get(("fedavgm", a, c))
            gain = "-"
            if f_ is not None and m_ is not None and f_.accs and m_.accs:
                gain = _paired_gain(f_.by_seed, m_.by_seed)[1]
            lines.append(f"| {alpha_label(a)} | {_cell_text(f_)} | {_cell_text(m_)} | {gain} | "
                         f"{paper_2019('fedavg', a, c)} | {paper_2019('fedavgm', a, c)} |")
        lines += ["", f"## Figure 6: FedAvgM sensitivity, C = {fmt(c)} (accuracy % at the tuning seeds; rows beta, columns "
                  "eta_eff; the paper plots alpha = 1)", ""]
        for a in alphas:
            cr = cells.get(("fedavgm", a, c))
            if cr is None:
                continue
            etas = list(dict.fromkeys(e for _, e in cr.grid))
            lines += [f"alpha = {alpha_label(a)}:", "", "| beta \\ eta_eff | " + " | ".join(fmt(e) for e in etas) + " |",
                      "|---|" + "---|" * len(etas)]
            for beta in dict.fromkeys(b for b, _ in cr.grid):
                cells_text = []
                for e in etas:
                    accs = cr.grid.get((beta, e), [])
                    ok = [x for x in accs if x is not None]
                    mark = " ◀" if cr.setting == (beta, e) else ""
                    cells_text.append(("FAILED" if accs and len(ok) < len(accs) else pct(ok)) + mark)
                lines.append(f"| {fmt(beta)} | " + " | ".join(cells_text) + " |")
            lines.append("")
    lines += ["", "## Claims: the measured evidence", "", *claims, "", "## Runs", "", *runs_table(outs)]
    return "\n".join(lines) + "\n"


def plots_2019(args: argparse.Namespace, cells: dict[CellKey, CellResult], out: Path) -> list[Path]:
    plt = matplotlib_pyplot()
    if plt is None:
        return []
    alphas = sorted(args.alphas, reverse=True)
    xs = list(range(len(alphas)))
    paths = []

    def series(algo: str, c: float) -> tuple[list[int], list[float], list[float]]:
        pts = [(i, cells[(algo, a, c)].accs) for i, a in enumerate(alphas) if (algo, a, c) in cells and cells[(algo, a, c)].accs]
        return ([i for i, _ in pts], [100 * statistics.fmean(v) for _, v in pts],
                [100 * (mean_sd(v)[1] or 0.0) for _, v in pts])

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for c in sorted(args.fractions):
        x, y, e = series("fedavg", c)
        ax.errorbar(x, y, yerr=e, marker="o", capsize=2, label=f"C={fmt(c)}")
    ax.set_xticks(xs)
    ax.set_xticklabels([alpha_label(a) for a in alphas])
    ax.set_xlabel("Dirichlet alpha (identical -> one class per client)")
    ax.set_ylabel("test accuracy [%]")
    ax.set_ylim(0, 100)
    ax.set_title(f"hsu2019 Figure 2: FedAvg, best lr per cell ({args.dataset}, {args.rounds} rounds)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "fig2_fedavg.png")
    fig.savefig(paths[-1], dpi=90)
    plt.close(fig)

    mf = sorted(args.momentum_fractions)
    if mf:
        fig, axes = plt.subplots(1, len(mf), figsize=(5.2 * len(mf), 3.8), squeeze=False)
        for ax, c in zip(axes[0], mf):
            for algo, style in (("fedavg", "o-"), ("fedavgm", "s-")):
                x, y, e = series(algo, c)
                ax.errorbar(x, y, yerr=e, fmt=style, capsize=2, label=f"geodml {ALGO_LABEL[algo]}")
            if c == 0.05 and 0.0 in alphas:
                i = alphas.index(0.0)
                ax.plot([i], [H19_MOST_SKEWED[0]], "x", color="tab:blue", label="paper FedAvg (CIFAR-10)")
                ax.plot([i], [H19_MOST_SKEWED[1]], "x", color="tab:orange", label="paper FedAvgM (CIFAR-10)")
            ax.axhline(H19_CENTRALIZED, color="grey", lw=0.8, ls="--", label="paper centralized (CIFAR-10)")
            ax.set_xticks(xs)
            ax.set_xticklabels([alpha_label(a) for a in alphas])
            ax.set_ylim(0, 100)
            ax.set_xlabel("Dirichlet alpha")
            ax.set_title(f"Figure 5: C={fmt(c)}", fontsize=9)
        axes[0][0].set_ylabel("test accuracy [%]")
        axes[0][0].legend(fontsize=6)
        fig.tight_layout()
        paths.append(out / "fig5_fedavgm.png")
        fig.savefig(paths[-1], dpi=90)
        plt.close(fig)

        c = mf[0]
        panels = [a for a in alphas if ("fedavgm", a, c) in cells]
        if panels:
            fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels) + 1, 3.2), squeeze=False, sharey=True)
            for ax, a in zip(axes[0], panels):
                cr = cells[("fedavgm", a, c)]
                for beta in dict.fromkeys(b for b, _ in cr.grid):
                    pts = [(e, statistics.fmean([x for x in v if x is not None])) for (b, e), v in cr.grid.items()
                           if b == beta and v and all(x is not None for x in v)]
                    if pts:
                        ax.plot([e for e, _ in pts], [100 * y for _, y in pts], "o-", ms=3, label=f"β={fmt(beta)}")
                ax.set_xscale("log")
                etas = sorted({e for _, e in cr.grid})   # within a decade matplotlib labels only minor ticks, overlapping
                ax.set_xticks(etas, [fmt(e) for e in etas], fontsize=7)
                ax.minorticks_off()
                ax.set_title(f"alpha={alpha_label(a)}", fontsize=8)
                ax.set_xlabel("η_eff", fontsize=7)
            axes[0][0].set_ylabel("test accuracy [%]")
            axes[0][0].legend(fontsize=6)
            fig.suptitle(f"Figure 6: FedAvgM sensitivity, C={fmt(c)} (tuning seeds)", fontsize=9)
            fig.tight_layout()
            paths.append(out / "fig6_sensitivity.png")
            fig.savefig(paths[-1], dpi=90)
            plt.close(fig)
    return paths


def hsu2019(argv: list[str] | None = None, *, launcher: Launcher = torchrun_launcher) -> int:
    """0: every run succeeded; 1: some run failed (reported); 2: bad arguments (nothing launched)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_2019(argv)
        tuning = plan_2019_tuning(args)
        common.validate_specs([r.spec for r in tuning])
    except StudyError as exc:
        print(f"geodml.study hsu2019: error: {exc}", file=sys.stderr)
        return 2
    grids = cells_2019(args)
    later = plan_2019_confirm(args, {key: grid[0] for key, grid in grids.items()})  # the count and cost, whichever setting wins
    summaries = [read_summary(r.spec.out) for r in tuning] if later else []
    tuned = all(s is not None for s in summaries)  # else `later` holds placeholders, not the real run ids
    if later and tuned:  # the tuning has finished: plan the real confirmation runs
        done = [RunResult(r.spec, "reused", summary=s, returncode=0) for r, s in zip(tuning, summaries)]
        later = plan_2019_confirm(args, choose_2019(args, outcomes(tuning, done)))
    print(f"hsu2019 study: {len(tuning)} tuning runs ({len(grids)} cells x their grids x {args.tune_seeds} seed(s)), then "
          f"{len(later)} runs at the chosen settings; {args.dataset}, budget {args.budget}, into {args.out}", flush=True)
    print("estimate: " + estimate_text(args, [*tuning, *later]), flush=True)
    if pace := pace_text(args, [*tuning, *later]):
        print("pace: " + pace, flush=True)
    if args.only:
        return run_only("hsu2019", args, [*tuning, *later] if tuned else tuning, len(tuning) + len(later), launcher,
                        later_note="" if tuned else f"the {len(later)} runs at the chosen settings are planned once "
                                                    "every tuning run has finished")
    if args.dry_run:
        common.print_plan([r.spec for r in tuning])
        return 0
    res1 = execute(args, tuning, launcher)
    chosen = choose_2019(args, outcomes(tuning, res1))
    confirm = plan_2019_confirm(args, chosen)
    try:
        common.validate_specs([r.spec for r in confirm])
    except StudyError as exc:
        print(f"geodml.study hsu2019: error: {exc}", file=sys.stderr)
        return 2
    res2 = execute(args, confirm, launcher) if confirm else []
    outs = outcomes([*tuning, *confirm], [*res1, *res2])
    cells = cell_results(args, outs, chosen)
    claims = claims_2019(args, cells)
    text = markdown_2019(args, cells, outs, claims)
    report = {"study": "hsu2019", "paper": "Hsu, Qi & Brown 2019", "budget": args.budget, "dataset": args.dataset,
              "model": args.model, "rounds": args.rounds, "final_rounds": args.final_rounds, "seeds": list(args.seeds),
              "tune_seeds": args.tune_seeds,
              "lrs": list(args.lrs), "fedavg_lrs": list(args.fedavg_lrs), "betas": list(args.betas), "out": str(args.out),
              "cells": [{"algo": k[0], "alpha": k[1], "fraction": k[2], "beta": None if c.setting is None else c.setting[0],
                         "eta_eff": None if c.setting is None else c.setting[1], "accuracies": c.accs, "edge": c.edge,
                         "one_rate": c.one_rate}
                        for k, c in cells.items()],
              "claims": claims, "failed": [o.run.run_id for o in outs if o.status in FAILED],
              "runs": rows(outs)}
    out = Path(args.out)
    paths = write_report("hsu2019", out, text, report, report["runs"])
    if not args.no_plots:
        paths += plots_2019(args, cells, out)
    print("\n" + "\n".join(claims) + "\n\nwritten: " + ", ".join(str(x) for x in paths), flush=True)
    if report["failed"]:
        print(f"{len(report['failed'])} run(s) failed: {', '.join(report['failed'])}", file=sys.stderr)
    return 1 if report["failed"] else 0


# =========================================================================================================
# hsu2020
# =========================================================================================================

@dataclass(frozen=True)
class VCBudget:
    """The FedVC experiment's budgets (Table 2 scaled by rounds / 5000)."""

    rounds: int
    curve_points: int

    @property
    def table_rounds(self) -> tuple[int, ...]:
        return tuple(round(self.rounds * r / H20_TABLE2_ROUNDS[-1]) for r in H20_TABLE2_ROUNDS)

    @property
    def table_batches(self) -> tuple[int, ...]:
        return tuple(round(self.rounds * b / H20_TABLE2_ROUNDS[-1]) for b in H20_TABLE2_BATCHES)

    @property
    def curve_rounds(self) -> tuple[int, ...]:
        return tuple(self.rounds * j // self.curve_points for j in range(1, self.curve_points + 1))


def parse_2020(argv: list[str]) -> argparse.Namespace:
    head, extra = _split_argv(argv)
    p = _base_parser("hsu2020", "Hsu et al. 2020: FedIR (importance reweighting) on hsu2019's Dirichlet population, and FedVC "
                     "(virtual clients) on imbalanced clients: Table 2's accuracy at round and batch budgets, and volatility.")
    p.add_argument("--parts", default="fedir,fedvc", help="which experiments: fedir, fedvc or both")
    p.add_argument("--algos", type=_algo_list, default=("fedavg", "fedavgm"), help="server optimizers: fedavg, fedavgm")
    p.add_argument("--lr", type=float, default=H20_LR, help="client learning rate (the paper, Section 6.5: 0.01)")
    p.add_argument("--server-momentum", type=float, default=0.9, help="FedAvgM's beta (server lr 1)")
    p.add_argument("--server-nesterov", action="store_true", help="Nesterov server momentum (hsu2019's; the 2020 paper's "
                   "Section 5.1 writes plain momentum)")
    p.add_argument("--fraction", type=float, default=None, help="report goal C (default: full 0.1 = the paper's 10 clients "
                   "per round; quick 0.2)")
    p.add_argument("--fedir-alphas", type=finite_floats, help="FedIR: Dirichlet alphas (default: quick 1,0.1; full 100,1,"
                   "0.2,0.05)")
    p.add_argument("--rounds", type=int, help="FedIR: rounds per run (default: quick 3, full 100)")
    final_rounds_arg(p)
    p.add_argument("--vc-rounds", type=int, help="FedVC: the largest round budget, Table 2's 5k rounds scaled (default: "
                   "quick 10, full 200; batch budgets are 10x the round budgets, as the paper's)")
    p.add_argument("--curve-points", type=int, help="FedVC: round budgets of the learning curves (default: quick 2, full 10)")
    p.add_argument("--vc-alpha", type=float, default=1.0, help="FedVC population: Dirichlet alpha of the class mix")
    p.add_argument("--vc-size-max", type=int, help="FedVC population: the largest client's examples (default: quick 200, "
                   "full 3000 = iNaturalist-Geo-3k's cap)")
    p.add_argument("--vc-zipf", type=float, default=1.0, help="FedVC population: Zipf exponent S of the client sizes "
                   "(size of the r-th largest = size-max / r^S)")
    p.add_argument("--virtual-client-size", type=int, help="FedVC's N_VC (default: quick 64, full 256, the paper's)")
    args = p.parse_args(head)
    _finish_common("hsu2020", args, extra)
    quick = args.budget == "quick"
    args.parts = tuple(x for x in args.parts.replace(" ", "").split(",") if x)
    if not args.parts or any(x not in ("fedir", "fedvc") for x in args.parts):
        raise StudyError(f"--parts must be fedir, fedvc or fedir,fedvc, got {','.join(args.parts) or 'nothing'}")
    args.fraction = args.fraction if args.fraction is not None else (0.2 if quick else 0.1)
    _fractions("--fraction", (args.fraction,), args.protocol.clients)
    args.fedir_alphas = args.fedir_alphas or ((1.0, 0.1) if quick else (100.0, 1.0, 0.2, 0.05))
    args.rounds = args.rounds if args.rounds is not None else (3 if quick else 100)
    args.vc_rounds = args.vc_rounds if args.vc_rounds is not None else (10 if quick else 200)
    args.curve_points = args.curve_points if args.curve_points is not None else (2 if quick else 10)
    args.vc_size_max = args.vc_size_max if args.vc_size_max is not None else (200 if quick else 3000)
    args.virtual_client_size = args.virtual_client_size if args.virtual_client_size is not None else (64 if quick else 256)
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise StudyError(f"--lr must be > 0, got {args.lr}")
    if not 0 < args.server_momentum < 1:
        raise StudyError(f"--server-momentum must be in (0, 1), got {args.server_momentum}")
    if any(not a >= 0 for a in args.fedir_alphas):
        raise StudyError("--fedir-alphas must be >= 0")
    if args.rounds < 1:
        raise StudyError(f"--rounds must be >= 1, got {args.rounds}")
    args.final_rounds = final_rounds(args.final_rounds, rounds=args.rounds, quick=args.budget == "quick",
                                     full=FULL_FINAL_ROUNDS)
    if args.curve_points < 1 or args.vc_rounds < 1 or args.vc_rounds % args.curve_points:
        raise StudyError(f"--vc-rounds ({args.vc_rounds}) must be a positive multiple of --curve-points ({args.curve_points})")
    if args.vc_rounds % 10:
        raise StudyError(f"--vc-rounds must be a multiple of 10 (Table 2's budgets are 1/5, 1/2 and all of it), "
                         f"got {args.vc_rounds}")
    if not args.vc_alpha >= 0 or not (math.isfinite(args.vc_zipf) and args.vc_zipf > 0):
        raise StudyError("--vc-alpha must be >= 0 and --vc-zipf > 0")
    if args.vc_size_max < 1 or args.virtual_client_size < 1:
        raise StudyError("--vc-size-max and --virtual-client-size must be >= 1")
    args.vc = VCBudget(args.vc_rounds, args.curve_points)
    return args


def _ir_slug(algo: str, fedir: bool) -> str:
    return algo + ("-fedir" if fedir else "")


def run_fedir(args: argparse.Namespace, algo: str, alpha: float, fedir: bool, seed: int) -> Run:
    p = args.protocol
    it = p.iter_local
    steps, every = args.rounds * it, max(1, args.rounds // 10) * it
    final, extra = tail_steps(args, steps_per_round=it, every=every)
    run_id = f"ir-{_ir_slug(algo, fedir)}-a{fmt(alpha)}-s{seed}"
    argv = (*base_flags(args, seed), "--partition", "dirichlet", "--alpha", fmt(alpha), "--client-size", str(p.client_size),
            "--client-fraction", fmt(args.fraction), "--iter-local", str(it), "--lr", fmt(args.lr),
            *server_flags(algo, args.server_momentum, nesterov=args.server_nesterov), *(["--fedir"] if fedir else []),
            "--steps", str(steps), "--eval-every", str(every), *eval_at_flags(extra), "--log-every", str(it), *args.geodml_args)
    m = num_selected(args.fraction, p.clients)
    return Run(RunSpec(run_id, Path(args.out) / run_id, argv, p.clients), part="fedir", algo=algo, seed=seed, lr=args.lr,
               alpha=alpha, fraction=args.fraction, beta=args.server_momentum if algo == "fedavgm" else 0.0, fedir=fedir,
               rounds=args.rounds, steps=steps, eval_every=every, client_steps=steps * m, final_steps=final,
               eval_images=eval_images(args, steps=steps, eval_every=every, m=m, rounds=args.rounds, seed=seed,
                                       population=p.clients * p.client_size, extra_evals=len(extra)))


def plan_fedir(args: argparse.Namespace) -> list[Run]:
    return [run_fedir(args, algo, alpha, fedir, seed) for alpha in args.fedir_alphas for algo in args.algos
            for fedir in (False, True) for seed in args.seeds]


def population_flags(args: argparse.Namespace) -> list[str]:
    return ["--partition", "dirichlet", "--alpha", fmt(args.vc_alpha), "--client-size", str(args.vc_size_max),
            "--size-zipf", fmt(args.vc_zipf), "--client-fraction", fmt(args.fraction)]


def population_sizes(args: argparse.Namespace, seed: int) -> np.ndarray:
    """The imbalanced population's client sizes for ``seed``, computed as every run of it computes them
    (geodml.preflight.load_and_partition: the dataset and the seeded partitioner)."""
    from geodml.cli import parse_config
    from geodml.preflight import load_and_partition
    cfg = parse_config([*base_flags(args, seed), *population_flags(args), "--data-cache", "off"])
    _, parts = load_and_partition(cfg, args.protocol.clients)
    return np.array([len(x) for x in parts], dtype=np.int64)


@dataclass(frozen=True)
class Rounds:
    """FedAvg with E = 1 on a population: round t's length (the longest participant's ceil(n_k / B) steps) and
    its participants' local steps, from geodml's own FedAvg code."""

    ends: tuple[int, ...]
    """ends[r] = S(r): trainer steps ("batches") after r rounds; ends[0] = 0."""
    work: tuple[int, ...]
    """work[r]: the participants' local steps summed over the first r rounds."""

    def rounds_within(self, batches: int) -> int:
        """The most rounds that end within ``batches`` steps."""
        return max(r for r, s in enumerate(self.ends) if s <= batches)


def e1_rounds(sizes: np.ndarray, m: int, seed: int, batch: int, *, until_rounds: int, until_steps: int) -> Rounds:
    from geodml.algorithms.fedavg import local_steps, select_round
    k = len(sizes)
    ends, work = [0], [0]
    t = 0
    while t < until_rounds or ends[-1] <= until_steps:
        steps = [local_steps(int(sizes[r]), 1.0, batch) for r in select_round(seed, t, k, m)]
        ends.append(ends[-1] + max(steps))
        work.append(work[-1] + sum(steps))
        t += 1
    return Rounds(tuple(ends), tuple(work))


def vc_points(args: argparse.Namespace) -> tuple[int, list[int]]:
    """(steps per FedVC round, the FedVC run's evaluation steps): every round budget's end, every batch budget
    rounded down to a round end."""
    per = math.ceil(args.virtual_client_size / args.protocol.batch)
    rounds = sorted(set(args.vc.curve_rounds) | set(args.vc.table_rounds))
    pts = sorted({per * r for r in rounds} | {per * (b // per) for b in args.vc.table_batches})
    return per, [x for x in pts if x > 0]


def plan_fedvc(args: argparse.Namespace, sizes: dict[int, np.ndarray] | None = None) -> list[Run]:
    """FedVC runs and the E = 1 runs without FedVC, one of each per algorithm and seed. An E = 1 run lasts the
    longest round budget and is evaluated at the end of every shorter one (--eval-at S(r)): the curve points,
    Table 2's rounds, and the rounds within each batch budget. Its global model after r rounds is the one a run
    stopped there ends with (client selection and data order depend on (seed, round), never on --steps:
    tests/test_study_hsu.py checks it), so one run stands for a run per budget. ``sizes``: the population per
    seed (computed from the data when not given)."""
    p = args.protocol
    m = num_selected(args.fraction, p.clients)
    per, pts = vc_points(args)
    every = reduce(math.gcd, pts)
    runs = []
    for seed in args.seeds:
        n = sizes[seed] if sizes is not None else population_sizes(args, seed)
        total = int(n.sum())
        for algo in args.algos:
            steps = max(pts)
            run_id = f"vc-{algo}-fedvc-s{seed}"
            argv = (*base_flags(args, seed), *population_flags(args), "--virtual-client-size", str(args.virtual_client_size),
                    "--lr", fmt(args.lr), *server_flags(algo, args.server_momentum, nesterov=args.server_nesterov),
                    "--steps", str(steps), "--eval-every", str(every), "--log-every", str(per), *args.geodml_args)
            runs.append(Run(RunSpec(run_id, Path(args.out) / run_id, argv, p.clients), part="fedvc", algo=algo, seed=seed,
                            lr=args.lr, alpha=args.vc_alpha, fraction=args.fraction,
                            beta=args.server_momentum if algo == "fedavgm" else 0.0, fedvc=True, rounds=steps // per,
                            steps=steps, eval_every=every, client_steps=steps * m,
                            eval_images=eval_images(args, steps=steps, eval_every=every, m=m, rounds=steps // per,
                                                    seed=seed, population=total)))
        rs = e1_rounds(n, m, seed, p.batch, until_rounds=args.vc.rounds, until_steps=max(args.vc.table_batches))
        within = {rs.rounds_within(b) for b in args.vc.table_batches}
        budgets = sorted((set(args.vc.curve_rounds) | set(args.vc.table_rounds) | within) - {0})
        last, steps = budgets[-1], rs.ends[budgets[-1]]
        at = [rs.ends[r] for r in budgets[:-1]]
        for algo in args.algos:
            run_id = f"vc-{algo}-e1-s{seed}"
            argv = (*base_flags(args, seed), *population_flags(args), "--local-epochs", "1", "--lr", fmt(args.lr),
                    *server_flags(algo, args.server_momentum, nesterov=args.server_nesterov),
                    "--steps", str(steps), "--eval-every", str(steps), *eval_at_flags(at), *args.geodml_args)
            runs.append(Run(RunSpec(run_id, Path(args.out) / run_id, argv, p.clients), part="e1", algo=algo, seed=seed,
                            lr=args.lr, alpha=args.vc_alpha, fraction=args.fraction,
                            beta=args.server_momentum if algo == "fedavgm" else 0.0, rounds=last, steps=steps,
                            eval_every=steps, client_steps=rs.work[last],
                            budget_steps=tuple((r, rs.ends[r]) for r in budgets),
                            eval_images=eval_images(args, steps=steps, eval_every=steps, m=m, rounds=last, seed=seed,
                                                    population=total, extra_evals=len(at))))
    return runs


def plan_2020(args: argparse.Namespace, sizes: dict[int, np.ndarray] | None = None) -> list[Run]:
    return [*(plan_fedir(args) if "fedir" in args.parts else []), *(plan_fedvc(args, sizes) if "fedvc" in args.parts else [])]


def _acc_at(curve: list[tuple[int, float]], step: int) -> float | None:
    return next((a for s, a in curve if s == step), None)


def drawdown(points: Sequence[float]) -> float:
    """The sum of the falls between consecutive points of a learning curve (0 for a curve that never falls)."""
    return sum(max(0.0, a - b) for a, b in zip(points, points[1:]))


def _outcome(outs: Sequence[Outcome], part: str, algo: str, seed: int) -> Outcome | None:
    """hsu2020's one run of ``part`` ('fedvc' or 'e1') for an algorithm and seed."""
    return next((o for o in outs if o.run.part == part and o.run.algo == algo and o.run.seed == seed), None)


def vc_seed(args: argparse.Namespace, outs: Sequence[Outcome], algo: str, fedvc: bool, seed: int) -> dict[str, float]:
    """One seed's 'round r' / 'batch b' accuracies and 'drawdown' (keys missing where the run is)."""
    per, _ = vc_points(args)
    o = _outcome(outs, "fedvc" if fedvc else "e1", algo, seed)
    curve = [] if o is None or not o.ok else o.curve
    if fedvc:
        ends = {r: per * r for r in {*args.vc.table_rounds, *args.vc.curve_rounds}}
        fits = {b: per * (b // per) for b in args.vc.table_batches}
    else:
        ends = {} if o is None else dict(o.run.budget_steps)
        # without FedVC, batch budget b: the longest round budget that ends within b batches
        fits = {b: max((x for x in ends.values() if x <= b), default=None) for b in args.vc.table_batches}
    d: dict[str, float] = {}
    for key, step in [*((f"round {r}", ends.get(r)) for r in args.vc.table_rounds),
                      *((f"batch {b}", fits[b]) for b in args.vc.table_batches)]:
        if step is not None and (v := _acc_at(curve, step)) is not None:
            d[key] = v
    pts = [None if r not in ends else _acc_at(curve, ends[r]) for r in args.vc.curve_rounds]
    if all(x is not None for x in pts):
        d["drawdown"] = drawdown([x for x in pts if x is not None])
    return d


VCSeeds = dict[tuple[str, bool, int], dict[str, float]]
"""vc_seed's values per (algorithm, FedVC, seed)."""


def vc_seeds(args: argparse.Namespace, outs: Sequence[Outcome]) -> VCSeeds:
    return {(algo, fedvc, seed): vc_seed(args, outs, algo, fedvc, seed)
            for algo in args.algos for fedvc in (False, True) for seed in args.seeds}


def fedvc_table(args: argparse.Namespace, per_seed: VCSeeds) -> dict[tuple[str, bool], dict[str, list[float]]]:
    """Per (algorithm, FedVC): 'round r' / 'batch b' accuracies and 'drawdown', one value per seed that has it."""
    res: dict[tuple[str, bool], dict[str, list[float]]] = {}
    for algo in args.algos:
        for fedvc in (False, True):
            d: dict[str, list[float]] = {}
            for seed in args.seeds:
                for key, v in per_seed[(algo, fedvc, seed)].items():
                    d.setdefault(key, []).append(v)
            res[(algo, fedvc)] = d
    return res


def fedvc_gains(args: argparse.Namespace, per_seed: VCSeeds) -> dict[tuple[str, str], list[float]]:
    """Per (algorithm, 'round r' / 'batch b' / 'drawdown'): FedVC minus without, per seed that has both."""
    res: dict[tuple[str, str], list[float]] = {}
    for algo in args.algos:
        for seed in args.seeds:
            off, on = per_seed[(algo, False, seed)], per_seed[(algo, True, seed)]
            for key in off.keys() & on.keys():
                res.setdefault((algo, key), []).append(on[key] - off[key])
    return res


Gains = dict[tuple[str, float], tuple[list[float], list[float], list[float]]]


def fedir_gains(args: argparse.Namespace, outs: Sequence[Outcome]) -> Gains:
    """Per (algorithm, alpha): (accuracies without FedIR, with FedIR, paired gains per seed)."""
    res = {}
    for algo in args.algos:
        for alpha in args.fedir_alphas:
            def acc(fedir: bool, seed: int) -> float | None:
                return next((o.accuracy for o in outs if o.run.part == "fedir" and o.run.algo == algo
                             and o.run.alpha == alpha and o.run.fedir == fedir and o.run.seed == seed), None)
            off = [a for s in args.seeds if (a := acc(False, s)) is not None]
            on = [a for s in args.seeds if (a := acc(True, s)) is not None]
            gains = [b - a for s in args.seeds if (a := acc(False, s)) is not None and (b := acc(True, s)) is not None]
            res[(algo, alpha)] = (off, on, gains)
    return res


def claims_2020(args: argparse.Namespace, gains: dict, vc: dict, vc_gains: dict[tuple[str, str], list[float]]) -> list[str]:
    out: list[str] = []
    if "fedir" in args.parts:
        out.append("1. **FedIR helps in the more non-identical cases (Section 6.2; there on iNaturalist/Landmarks user splits; "
                   "here the paired per-seed gain, FedIR - without, on the Dirichlet population).**")
        for algo in args.algos:
            parts = [f"alpha {fmt(a)}: {pp(gains[(algo, a)][2])}" for a in sorted(args.fedir_alphas, reverse=True)
                     if gains[(algo, a)][2]]
            means = [(a, statistics.fmean(gains[(algo, a)][2])) for a in sorted(args.fedir_alphas, reverse=True)
                     if gains[(algo, a)][2]]
            trend = ""
            if len(means) >= 2:
                trend = (f"; most skewed minus least skewed gain: {100 * (means[-1][1] - means[0][1]):+.1f} pp")
            if parts:
                out.append(f"   - {ALGO_LABEL[algo]}: " + "; ".join(parts) + trend)
        out.append("   - paper (5k rounds, report goal 10, FedIR gain): " + "; ".join(
            f"{ALGO_LABEL[a]} {d}: {v[1] - v[0]:+.1f} pp" for (d, a), v in H20_FEDIR.items()))
    if "fedvc" in args.parts:
        out.append("2. **FedVC gives higher accuracy at fixed round and batch budgets on imbalanced clients (Table 2): "
                   "without -> with FedVC, and the paired per-seed difference.**")
        for algo in args.algos:
            off, on = vc.get((algo, False), {}), vc.get((algo, True), {})
            parts = []
            for key in [f"round {r}" for r in args.vc.table_rounds] + [f"batch {b}" for b in args.vc.table_batches]:
                if off.get(key) and on.get(key):
                    paired = vc_gains.get((algo, key), [])
                    parts.append(f"{key}: {pct(off[key])} -> {pct(on[key])} (paired {pp(paired)}, higher in "
                                 f"{sum(g > 0 for g in paired)} of {len(paired)} seeds)")
            if parts:
                out.append(f"   - {ALGO_LABEL[algo]}: " + "; ".join(parts))
        out.append("3. **FedVC decreases the volatility of the learning curves (Figure 6): accuracy drawdown (sum of falls "
                   f"between the {args.vc.curve_points} curve points, pp, mean ± std over seeds).**")
        for algo in args.algos:
            off, on = vc.get((algo, False), {}), vc.get((algo, True), {})
            if off.get("drawdown") or on.get("drawdown"):
                paired = vc_gains.get((algo, "drawdown"), [])
                out.append(f"   - {ALGO_LABEL[algo]}: without FedVC {pp(off.get('drawdown', []), sign=False)}, "
                           f"with FedVC {pp(on.get('drawdown', []), sign=False)}; lower with FedVC in "
                           f"{sum(g < 0 for g in paired)} of {len(paired)} seeds")
    return out


def population_text(args: argparse.Namespace, sizes: dict[int, np.ndarray]) -> str:
    if not sizes:
        return ""
    n = next(iter(sizes.values()))
    b = args.protocol.batch
    return (f"Imbalanced population (seed {next(iter(sizes))}): {len(n)} clients, {int(n.sum()):,} examples, sizes "
            f"{int(n.max())} (largest) / {int(np.median(n))} (median) / {int(n.min())} (smallest), E = 1 local steps "
            f"{math.ceil(n.max() / b)} / {math.ceil(np.median(n) / b)} / {math.ceil(n.min() / b)} "
            f"(iNaturalist-Geo-3k: up to {H20_GEO3K_MAX_STEPS}, Section 6.3); Zipf exponent {fmt(args.vc_zipf)}, class mix "
            f"Dir(alpha = {fmt(args.vc_alpha)}), N_VC = {args.virtual_client_size}.")


def markdown_2020(args: argparse.Namespace, outs: Sequence[Outcome], gains: dict, vc: dict, claims: list[str],
                  sizes: dict[int, np.ndarray]) -> str:
    p = args.protocol
    lines = [f"# hsu2020: Hsu, Qi & Brown 2020 on {args.dataset}, budget {args.budget}", "",
             f"Client SGD lr {fmt(args.lr)} (§6.5), B = {p.batch}, weight decay {fmt(H19_WEIGHT_DECAY)}, {args.model}, "
             f"C = {fmt(args.fraction)} ({num_selected(args.fraction, p.clients)} clients per round); FedAvgM: server "
             f"momentum {fmt(args.server_momentum)}{' (Nesterov)' if args.server_nesterov else ''}, server lr 1. Accuracy: "
             f"final top-1 test accuracy in % (FedIR: {final_text(args)}), mean ± std over seeds "
             f"{', '.join(map(str, args.seeds))}. The paper's numbers are from other datasets (iNaturalist, Landmarks, "
             "pretrained MobileNetV2, 1k-5k rounds): compare directions, not levels.", ""]
    if "fedir" in args.parts:
        lines += [f"## FedIR on the Dirichlet population ({p.clients} x {p.client_size}, {args.rounds} rounds; Section 6.2)",
                  "", "| alpha | " + " | ".join(f"{ALGO_LABEL[a]} | + FedIR | gain (paired)" for a in args.algos) + " |",
                  "|---|" + "---|---|---|" * len(args.algos)]
        for alpha in sorted(args.fedir_alphas, reverse=True):
            cells = []
            for algo in args.algos:
                off, on, g = gains[(algo, alpha)]
                cells += [pct(off, len(args.seeds)), pct(on, len(args.seeds)), pp(g)]
            lines.append(f"| {fmt(alpha)} | " + " | ".join(cells) + " |")
        lines += ["", "Paper (accuracy % at 5k rounds, report goal 10; without -> with FedIR):", "",
                  "| data | algorithm | without | with FedIR | gain |", "|---|---|---|---|---|"]
        for (data, algo), (a, b) in H20_FEDIR.items():
            lines.append(f"| {data} | {ALGO_LABEL[algo]} | {a} | {b} | {b - a:+.1f} pp |")
    if "fedvc" in args.parts:
        rr, bb = args.vc.table_rounds, args.vc.table_batches
        lines += ["", "## FedVC on imbalanced clients (Table 2, budgets scaled by "
                  f"{args.vc.rounds}/{H20_TABLE2_ROUNDS[-1]})", "", population_text(args, sizes), "",
                  "Acc@Batch: a batch is a local step of the round's longest participant; without FedVC, the accuracy "
                  "after the last round that ends within the budget. Drawdown: the sum of accuracy falls between the "
                  f"{args.vc.curve_points} learning-curve points (rounds {', '.join(map(str, args.vc.curve_rounds))}).", "",
                  "| method | FedVC | " + " | ".join(f"Acc@Round {r}" for r in rr) + " | "
                  + " | ".join(f"Acc@Batch {b}" for b in bb) + " | drawdown pp |",
                  "|---|---|" + "---|" * (len(rr) + len(bb) + 1)]
        for algo in args.algos:
            for fedvc in (False, True):
                d = vc.get((algo, fedvc), {})
                cells = [pct(d.get(f"round {r}", []), len(args.seeds)) for r in rr]
                cells += [pct(d.get(f"batch {b}", []), len(args.seeds)) for b in bb]
                cells.append(pp(d.get("drawdown", []), sign=False).removesuffix(" pp"))
                lines.append(f"| {ALGO_LABEL[algo]} | {'✓' if fedvc else '✗'} | " + " | ".join(cells) + " |")
        lines += ["", "Paper, Table 2 (report goal 10; Acc@Round 1k, 2.5k, 5k; Acc@Batch 10k, 25k, 50k; centralized "
                  f"{H20_CENTRALIZED['iNaturalist']}%):", "",
                  "| data | method | FedVC | " + " | ".join(f"@Round {r}" for r in H20_TABLE2_ROUNDS) + " | "
                  + " | ".join(f"@Batch {b}" for b in H20_TABLE2_BATCHES) + " |", "|---|---|---|" + "---|" * 6]
        for (data, algo, fedvc), v in H20_TABLE2.items():
            lines.append(f"| {data} | {ALGO_LABEL[algo]} | {'✓' if fedvc else '✗'} | " + " | ".join(f"{x}" for x in v) + " |")
    lines += ["", "## Claims: the measured evidence", "", *claims, "", "## Runs", "", *runs_table(outs)]
    return "\n".join(lines) + "\n"


COLORS = {("fedavg", False): "tab:blue", ("fedavg", True): "tab:cyan", ("fedavgm", False): "tab:red",
          ("fedavgm", True): "tab:orange"}


def plots_2020(args: argparse.Namespace, outs: Sequence[Outcome], gains: dict, out: Path) -> list[Path]:
    plt = matplotlib_pyplot()
    if plt is None:
        return []
    paths = []
    if "fedir" in args.parts:
        alphas = sorted(args.fedir_alphas, reverse=True)
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        for algo in args.algos:
            pts = [(i, gains[(algo, a)][2]) for i, a in enumerate(alphas) if gains[(algo, a)][2]]
            ax.errorbar([i for i, _ in pts], [100 * statistics.fmean(g) for _, g in pts],
                        yerr=[100 * (mean_sd(g)[1] or 0.0) for _, g in pts], marker="o", capsize=2, label=ALGO_LABEL[algo])
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(len(alphas)))
        ax.set_xticklabels([fmt(a) for a in alphas])
        ax.set_xlabel("Dirichlet alpha")
        ax.set_ylabel("FedIR gain [pp]")
        ax.set_title(f"hsu2020: FedIR - without, paired per seed ({args.rounds} rounds)", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(out / "fedir_gain.png")
        fig.savefig(paths[-1], dpi=90)
        plt.close(fig)
    if "fedvc" in args.parts:
        per, _ = vc_points(args)
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
        for algo in args.algos:
            for fedvc in (False, True):
                label = f"{ALGO_LABEL[algo]}{' + FedVC' if fedvc else ''}"
                for seed in args.seeds:
                    if fedvc:
                        o = _outcome(outs, "fedvc", algo, seed)
                        pts = [] if o is None else [(s / per, s, a) for s, a in o.curve]
                    else:
                        o = _outcome(outs, "e1", algo, seed)
                        at = {} if o is None else dict(o.curve)
                        pts = [(r, s, at[s]) for r, s in (() if o is None else o.run.budget_steps) if s in at]
                    if not pts:
                        continue
                    kw: dict[str, Any] = {"label": label if seed == args.seeds[0] else None, "alpha": 0.8, "lw": 1,
                                          "ls": "-" if fedvc else "--", "marker": "" if fedvc else "o", "ms": 3,
                                          "color": COLORS[(algo, fedvc)]}
                    axes[0].plot([x for x, _, _ in pts], [100 * a for _, _, a in pts], **kw)
                    axes[1].plot([s for _, s, _ in pts], [100 * a for _, _, a in pts], **kw)
        axes[0].set_xlabel("rounds")
        axes[1].set_xlabel("batches (local steps of each round's longest participant)")
        axes[0].set_ylabel("test accuracy [%]")
        for ax in axes:
            ax.set_ylim(0, 100)
        axes[0].legend(fontsize=7)
        fig.suptitle("hsu2020: FedVC vs E = 1 on imbalanced clients (every seed; without FedVC: at the round budgets' ends)",
                     fontsize=9)
        fig.tight_layout()
        paths.append(out / "fedvc_curves.png")
        fig.savefig(paths[-1], dpi=90)
        plt.close(fig)
    return paths


def hsu2020(argv: list[str] | None = None, *, launcher: Launcher = torchrun_launcher,
            sizes: dict[int, np.ndarray] | None = None) -> int:
    """0: every run succeeded; 1: some run failed (reported); 2: bad arguments (nothing launched).
    ``sizes``: the FedVC population per seed, for tests (default: computed from the data)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_2020(argv)
        if "fedvc" in args.parts and sizes is None:
            try:
                sizes = {seed: population_sizes(args, seed) for seed in args.seeds}
            except ValueError as exc:  # no dataset, or more examples than it has (DatasetError is a ValueError)
                raise StudyError(f"the FedVC population: {exc}") from None
        runs = plan_2020(args, sizes)
        common.validate_specs([r.spec for r in runs])
    except StudyError as exc:
        print(f"geodml.study hsu2020: error: {exc}", file=sys.stderr)
        return 2
    sizes = sizes or {}
    print(f"hsu2020 study: {len(runs)} runs ({', '.join(args.parts)}), {args.dataset}, budget {args.budget}, into {args.out}",
          flush=True)
    if sizes:
        print(population_text(args, sizes), flush=True)
    print("estimate: " + estimate_text(args, runs), flush=True)
    if pace := pace_text(args, runs):
        print("pace: " + pace, flush=True)
    if args.only:
        return run_only("hsu2020", args, runs, len(runs), launcher)
    if args.dry_run:
        common.print_plan([r.spec for r in runs])
        return 0
    results = execute(args, runs, launcher)
    outs = outcomes(runs, results, curves=True)
    gains = fedir_gains(args, outs) if "fedir" in args.parts else {}
    per_seed = vc_seeds(args, outs) if "fedvc" in args.parts else {}
    vc = fedvc_table(args, per_seed) if per_seed else {}
    vc_gains = fedvc_gains(args, per_seed) if per_seed else {}
    claims = claims_2020(args, gains, vc, vc_gains)
    text = markdown_2020(args, outs, gains, vc, claims, sizes)
    report = {"study": "hsu2020", "paper": "Hsu, Qi & Brown 2020", "budget": args.budget, "dataset": args.dataset,
              "model": args.model, "seeds": list(args.seeds), "parts": list(args.parts), "out": str(args.out),
              "final_rounds": args.final_rounds,
              "fedir": [{"algo": k[0], "alpha": k[1], "without": v[0], "with": v[1], "gains": v[2]} for k, v in gains.items()],
              "fedvc": [{"algo": k[0], "fedvc": k[1], **v} for k, v in vc.items()],
              "fedvc_gains": [{"algo": a, "budget": key, "gains": g} for (a, key), g in vc_gains.items()],
              "population_sizes": {str(k): v.tolist() for k, v in sizes.items()},
              "claims": claims, "failed": [o.run.run_id for o in outs if o.status in FAILED],
              "runs": rows(outs)}
    out = Path(args.out)
    paths = write_report("hsu2020", out, text, report, report["runs"])
    if not args.no_plots:
        paths += plots_2020(args, outs, gains, out)
    print("\n" + "\n".join(claims) + "\n\nwritten: " + ", ".join(str(x) for x in paths), flush=True)
    if report["failed"]:
        print(f"{len(report['failed'])} run(s) failed: {', '.join(report['failed'])}", file=sys.stderr)
    return 1 if report["failed"] else 0


