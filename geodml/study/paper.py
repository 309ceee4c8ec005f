"""The Quagmire paper's studies from real runs: ``python -m geodml.study NAME [--budget quick|full]``.

Each study is a list of runs (torchrun subprocesses through geodml.study.runner: finished runs
are reused, failures are reported and excluded, never hidden) and one report: ``NAME.md`` (a
figure-style pivot table and the per-run table), ``NAME.csv`` (one row per run), ``NAME.json``
and PNGs (``accuracy.png``: bars with the "-x pp" loss relative to BSP-IID as in the paper's
figures; ``accuracy_vs_wan_bytes.png``: the eval curves of every successful run).

* ``noniid``   -- Quagmire Figure 1: BSP, Gaia (T0=10%), FedAvg (Iter_Local=20), DGC
  (E_warm=8 paper epochs, scaled to the budget), IID vs 100% non-IID (label skew).
* ``norm``     -- Figure 5: BN vs GN (group size 2) under every algorithm, IID vs non-IID.
* ``skew``     -- Figure 6: GN at 20/40/60/80% non-IID (and IID as the reference).
* ``brn``      -- Table 9: BN- vs BRN-LeNet under BSP, K = 2, IID vs non-IID.
* ``hparams``  -- Tables 6-8: each algorithm's knob grid (``KNOB.grid``), IID vs non-IID; the table shows the
  savings over BSP beside each accuracy, and ``knobs.png`` plots accuracy over each grid.
* ``skewscout``-- Figure 8: Oracle (geodml.study.oracle) and SkewScout savings over BSP with Gaia
  at each skew level, against the BSP-IID accuracy target.
* ``dirichlet``-- Hsu et al. 2019 Figures 2/5: FedAvg vs FedAvgM over the Dirichlet alpha.

The network is ``--model``: ``lenet`` (the authors' Caffe LeNet, geodml.models.lenet, the
default), ``resnet20`` (with BatchNorm where the figure's network is un-normalized, as Figure 1's)
or ``cnn`` (McMahan et al. 2017's CNN, what every study before issue 21 ran, then under the name
"LeNet"). Cells are labelled by the network: LeNet / BN-LeNet / GN-LeNet / GN2g-LeNet (2 groups),
CNN / BN-CNN ..., BN-ResNet-20 ...

Reports of the un-normalized network (``noniid``, ``hparams``) carry the paper's CIFAR-10 LeNet
number of the same cell (``PAPER_LENET_CIFAR10``, Tables 6-8) in extra columns, so the comparison
is in the report itself (beside a ``cnn`` study it is the paper's LeNet next to another network).

Decisions (documented in docs/study.md, tested in tests/test_study.py):

* **Learning rate per algorithm** (``--lr-rule``, ``lr_for``). The paper uses one eta for every
  algorithm, and its BSP applies eta x the *sum* of the K partitions' gradients (the released
  parameter server: lr x sum). geodml's BSP averages, so ``paper`` (the default) runs BSP at
  K x eta and Gaia, DGC and FedAvg at eta; ``--lr`` is eta. The rule studies used before issue 21
  is kept for their reports: ``divide`` (``--lr`` is BSP's rate; Gaia and DGC at lr/K, FedAvg at
  lr, i.e. K times the paper's relative step) and ``same`` (every algorithm at lr). The lr of
  every run is in the table.
* **Seeds** (``--seeds``, full default 0,1,2): every cell runs once per seed (``--seed`` moves the
  partition assignment, the initialization and the minibatch order); tables and bars give the
  mean and standard deviation over the seeds that succeeded, the per-run table every run.
* **Which accuracy** (``run_accuracy``). ``accuracy`` is what the released code reports: every
  worker tests the model it holds and the result scripts average the workers' accuracies
  (non_iid_dml apps/caffe/get_cifar_result.py divides the summed "#0: accuracy" lines by
  NUM_WORKER; under Gaia, DGC and FedAvg each worker reads its own data center's replica). Here it
  is the mean of summary.json's ``per_rank_val_accuracy``, each partition's own model on the whole
  test set (the released code tests each on a 1/K slice). ``global_accuracy`` beside it is
  ``final_val_accuracy``: the global model, the average of the partitions' weights (Gaia, DGC)
  and of their BatchNorm statistics (every algorithm), which can hide a partition's model
  specializing. For BSP and FedAvg without BatchNorm (the last step is an average) the two are
  the same model; with BatchNorm each partition keeps its own running statistics.
* **Budgets.** ``quick``: digits-sized, ``--steps`` (default 10) per run; it checks the
  machinery, not the science. ``full``: the released solvers (the paper's Appendix C: 128 epochs,
  eta 0.01/K, /10 at 50% and 75% of training, batch 100/K, momentum 0.9, wd 5e-4); ``--epochs`` and ``--lr``
  shorten it for a small machine, milestones scale with ``--epochs``, and so does DGC's E_warm
  (paper value x epochs / 128), so the warm-up stays the same share of training.
* **Relative numbers.** "vs BSP-IID" is the accuracy difference in percentage points to BSP in
  the IID setting with the same model; "savings" is BSP's WAN bytes in the same setting and
  model divided by the run's.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from geodml.config import DATASETS, PROTOTXT_MODELS
from geodml.study import common
from geodml.study.common import StudyError, fmt, mean_sd, run_accuracy, seed_list
from geodml.study.runner import Launcher, RunResult, RunSpec, torchrun_launcher

PAPER_EPOCHS = 128
PAPER_LR = 0.002
"""The paper's eta at K = 5 (Appendix C, LeNet on CIFAR-10), in its summing form: geodml's averaging BSP runs at K x eta."""
PAPER_GLOBAL_BATCH = 100
"""The released LeNet solvers keep K x batch = 100 and K x eta = 0.01 (non_iid_dml examples/cifar10/{2,5,10}parts/
lenet_solver.prototxt.template: batch 50/20/10, base_lr 0.005/0.002/0.001); ``paper_eta``, ``paper_batch``."""
QUICK_ETA = 0.004
"""Quick budget's eta: BSP at 0.02 with K = 5 (what the quick studies ran before the lr rule moved to eta)."""
LR_RULES = ("paper", "divide", "same")
SUM_ALGOS = ("gaia", "dgc")  # apply the sum of the partitions' updates
PAPER_ALGOS = ("bsp", "gaia", "fedavg", "dgc")  # the Quagmire figures' algorithms, a subset of config.ALGOS
ALGO_LABEL = {"bsp": "BSP", "gaia": "Gaia", "fedavg": "FedAvg", "dgc": "DGC", "fedavgm": "FedAvgM"}
FIG1_THETA = {"gaia": ("--t0", 0.1), "fedavg": ("--iter-local", 20), "dgc": ("--e-warm", 8.0)}  # Quagmire §4.1
ALGO_FLAGS = {"dgc": ("--dgc-scope", "layer")}
"""What the studies give an algorithm beyond its knob: DGC selects its top entries per layer, as Lin et al.
and the released code (per parameter table) do, not over the whole model (geodml's default, the Quagmire
pseudocode's literal reading). A flag after '--' overrides it (e.g. -- --dgc-scope global)."""
STUDY_MODELS = ("cnn", "lenet", "resnet20")
NETWORK_LABEL = {"cnn": "CNN", "lenet": "LeNet", "resnet20": "ResNet-20"}
NORM_PREFIX = {"none": "", "batch": "BN-", "group": "GN-", "group2g": "GN2g-", "batchrenorm": "BRN-"}
"""Norm variants of a study: ``group`` is the paper's text (2 channels per group), ``group2g`` the
released prototxt's reading (2 groups), run as ``--norm group --gn-groups 2``."""
NORM_FLAGS = {"none": ("--norm", "none"), "batch": ("--norm", "batch"), "group": ("--norm", "group"),
              "group2g": ("--norm", "group", "--gn-groups", "2"), "batchrenorm": ("--norm", "batchrenorm")}


def model_flags(model: str) -> tuple[str, ...]:
    """``--model MODEL`` and, for the networks from the authors' Caffe files (LeNet, ResNet-20), their
    prototxts' per-parameter lr and weight-decay multipliers (``--param-mults prototxt``: LeNet's biases
    at 2x lr, ip1's weights at 250x decay). ``-- --param-mults none`` gives the runs made before them."""
    return ("--model", model, *(("--param-mults", "prototxt") if model in PROTOTXT_MODELS else ()))


def model_label(model: str, norm: str) -> str:
    """'CNN', 'GN-CNN', 'LeNet', 'BN-LeNet', ...: the network and its normalization, as the tables name them."""
    return NORM_PREFIX[norm] + NETWORK_LABEL[model]

# flags the studies set themselves; refused after "--"
CONTROLLED = ("algo", "out", "dataset", "partition", "skew", "alpha", "shards_per_partition", "skewscout", "t0",
              "iter_local", "e_warm", "lr", "epochs", "steps", "model", "norm", "lr_milestones", "eval_every", "eval_at",
              "server_momentum", "server_lr", "seed", "gn_groups", "gn_group_size",
              "partition_eval_examples", "rounds", "eval_every_rounds")  # accuracy is the partitions' own, on the whole test set
EPS = 1e-12

# The paper's CIFAR-10 LeNet top-1 accuracy in percent, (IID, 100% non-IID), from Tables 6-8 (whose
# BSP, T0=10%, Iter_Local=20 and E_warm=8 rows are also Figure 1). Key: (algorithm, knob value in
# the paper's units: T0 fraction, Iter_Local steps, E_warm paper epochs; None for BSP). Reports put
# these beside geodml's numbers; they are another dataset and a 64x longer schedule, so only the
# shape (which settings lose how much, relative to BSP-IID) is comparable, never the levels.
PAPER_LENET_CIFAR10: dict[tuple[str, float | None], tuple[float, float]] = {
    ("bsp", None): (77.4, 76.6),
    ("gaia", 0.02): (76.9, 52.6), ("gaia", 0.05): (74.6, 10.0), ("gaia", 0.1): (76.7, 10.0),
    ("gaia", 0.2): (77.7, 10.0), ("gaia", 0.3): (78.6, 10.0), ("gaia", 0.4): (78.3, 10.1), ("gaia", 0.5): (78.0, 10.0),
    ("fedavg", 5.0): (79.7, 67.3), ("fedavg", 10.0): (79.3, 63.2), ("fedavg", 20.0): (79.1, 10.1),
    ("fedavg", 50.0): (79.2, 55.6), ("fedavg", 200.0): (79.4, 54.2), ("fedavg", 500.0): (79.6, 19.4),
    ("fedavg", 1000.0): (78.3, 19.0),
    ("dgc", 8.0): (80.3, 47.2), ("dgc", 4.0): (10.0, 47.3), ("dgc", 3.0): (64.9, 50.5), ("dgc", 2.0): (10.0, 47.5),
    ("dgc", 1.0): (10.0, 39.9),
}


def paper_accuracy(algo: str, theta: float | None, model: str, setting: str) -> float | None:
    """The paper's CIFAR-10 LeNet accuracy (fraction) for this cell of an un-normalized network (LeNet, or
    the CNN beside it), or None where the paper has no such number."""
    if model not in ("LeNet", "CNN") or setting not in ("iid", "noniid-100%"):
        return None
    pair = PAPER_LENET_CIFAR10.get((algo, None if theta is None else float(theta)))
    return None if pair is None else pair[setting != "iid"] / 100


# ---- budgets and learning rates ----------------------------------------------------------------

@dataclass(frozen=True)
class Budget:
    """Training length and schedule shared by every run of a study."""

    name: str
    epochs: float | None
    """Epochs per run (full budget); None when ``steps`` is set."""
    steps: int | None
    """Steps per run (quick budget)."""
    lr: float
    """eta under ``--lr-rule paper``, BSP's rate under the earlier rules (per algorithm: ``lr_for``)."""
    eval_every: int
    """Steps between validations of the global model."""
    batch_size: int | None = None
    """Minibatch per partition (full budget, paper rule: ``paper_batch``); None leaves geodml's default (20)."""

    def __post_init__(self):
        if (self.epochs is None) == (self.steps is None):
            raise StudyError("a budget has either epochs or steps")
        if self.epochs is not None and not (math.isfinite(self.epochs) and self.epochs > 0):
            raise StudyError(f"--epochs must be > 0, got {self.epochs!r}")
        if self.steps is not None and self.steps < 1:
            raise StudyError(f"--steps must be >= 1, got {self.steps!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise StudyError(f"--lr must be > 0, got {self.lr!r}")
        if self.eval_every < 1:
            raise StudyError(f"--eval-every must be >= 1, got {self.eval_every!r}")

    @property
    def epoch_scale(self) -> float:
        """This budget's length as a fraction of the paper's 128 epochs (quick: 1/128, one 'paper epoch')."""
        return self.epochs / PAPER_EPOCHS if self.epochs is not None else 1.0 / PAPER_EPOCHS

    def flags(self) -> list[str]:
        if self.steps is not None:
            return ["--steps", str(self.steps), "--eval-every", str(self.eval_every)]
        ms = (0.5 * self.epochs, 0.75 * self.epochs)  # the paper's 64 and 96 of 128
        batch = [] if self.batch_size is None else ["--batch-size", str(self.batch_size)]
        return ["--epochs", fmt(self.epochs), "--lr-milestones", ",".join(fmt(m) for m in ms),
                "--eval-every", str(self.eval_every), *batch]


def paper_eta(nproc: int) -> float:
    """The released solvers' eta for K partitions: 0.01 / K (0.002 at K = 5, the paper's Appendix C)."""
    return round(PAPER_LR * 5 / nproc, 12)


def paper_batch(nproc: int) -> int:
    """The released solvers' minibatch per partition: 100 / K (20 at K = 5), rounded when K does not divide 100.

    Also ResNet-20's: the paper's Table 2 gives it 20 per node at K = 5, like LeNet; the released
    5parts resnet20 prototxt still says 50 (its 2parts value), which we read as a copy left unchanged."""
    return max(1, round(PAPER_GLOBAL_BATCH / nproc))


def make_budget(args: argparse.Namespace) -> Budget:
    if args.budget == "quick":
        if args.epochs is not None:
            raise StudyError("--epochs is for --budget full; the quick budget is in steps (--steps)")
        return Budget(name="quick", epochs=None, steps=args.steps or 10,
                      lr=args.lr or (QUICK_ETA if args.lr_rule == "paper" else 0.02),
                      eval_every=args.eval_every or args.steps or 10)
    if args.steps is not None:
        raise StudyError("--steps is for --budget quick; the full budget is in epochs (--epochs)")
    paper = args.lr_rule == "paper"
    return Budget(name="full", epochs=args.epochs or PAPER_EPOCHS, steps=None,
                  lr=args.lr or (paper_eta(args.nproc) if paper else PAPER_LR), eval_every=args.eval_every or 500,
                  batch_size=paper_batch(args.nproc) if paper else None)


def lr_for(algo: str, lr: float, nproc: int, rule: str) -> float:
    """The run's ``--lr`` for ``algo`` (FedAvgM: its base, FedAvg) under ``rule`` (LR_RULES).

    ``paper``: ``lr`` is the paper's eta; BSP runs at K x eta (the paper's BSP sums K gradients,
    geodml's averages them), Gaia, DGC and FedAvg at eta. ``divide``: ``lr`` is BSP's rate, Gaia
    and DGC at lr/K, FedAvg at lr. ``same``: every algorithm at lr."""
    if rule == "paper":
        return round(lr * nproc, 12) if algo == "bsp" else lr
    if rule == "divide":
        return lr / nproc if algo in SUM_ALGOS else lr
    assert rule == "same", rule
    return lr


# ---- planned runs ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    """One run of a study, with the coordinates its table and plots use."""

    algo: str
    """bsp, gaia, fedavg, dgc, or fedavgm (FedAvg with server momentum)."""
    setting: str
    """'iid', 'noniid-100%' (label skew), 'dirichlet-0.1' ..."""
    model: str
    """``model_label``: CNN, BN-CNN, GN-CNN, LeNet, BN-LeNet, GN-LeNet, ..."""
    knob: str
    """The algorithm's setting, e.g. 't0=0.1' ('' for BSP)."""
    lr: float
    spec: RunSpec
    skew: float | None = None
    """Label-skew fraction (0 = IID), or the Dirichlet alpha for the dirichlet study."""
    theta: float | None = None
    """The knob's value in the paper's units (DGC: paper epochs before scaling); None for BSP."""
    seed: int = 0

    @property
    def series(self) -> str:
        """The row of the pivot table: model (when varied), algorithm and knob."""
        return " ".join(x for x in (ALGO_LABEL[self.algo], self.knob) if x)


def setting_of(partition: str, value: float | None) -> str:
    if partition == "iid":
        return "iid"
    if partition == "label":
        return f"noniid-{round(100 * value):d}%"
    return f"dirichlet-{fmt(value)}"


def data_flags(dataset: str, partition: str, value: float | None) -> list[str]:
    flags = ["--dataset", dataset, "--partition", partition]
    if partition == "label":
        flags += ["--skew", fmt(value)]
    elif partition == "dirichlet":
        flags += ["--alpha", fmt(value)]
    return flags


def knob_flags(algo: str, theta: float, budget: Budget) -> tuple[list[str], str]:
    """The algorithm's knob as flags and as a label; DGC's E_warm is scaled to the budget."""
    flag, _ = FIG1_THETA[algo]
    if algo == "dgc":
        scaled = theta * budget.epoch_scale
        scale = f" (x{budget.epoch_scale:g})" if budget.epoch_scale != 1 else ""
        return [flag, fmt(round(scaled, 6))], f"E_warm={fmt(theta)}" + scale
    if algo == "gaia":
        return [flag, fmt(theta)], f"T0={fmt(100 * theta)}%"
    return [flag, str(int(theta))], f"Iter_Local={int(theta)}"


class Planner:
    """Builds Cells with consistent run ids and directories (``OUT/<run id>``)."""

    def __init__(self, args: argparse.Namespace, budget: Budget):
        self.args, self.budget, self.out = args, budget, Path(args.out)
        self.cells: dict[str, Cell] = {}

    def add(self, algo: str, partition: str, value: float | None, *, norm: str | None = None, theta: float | None = None,
            extra: tuple[str, ...] = ()) -> None:
        """One cell per seed of ``--seeds``; ``norm`` None is the network's own (``base_norm``)."""
        a, b = self.args, self.budget
        norm = base_norm(a.model) if norm is None else norm
        base_algo = "fedavg" if algo == "fedavgm" else algo
        lr = lr_for(base_algo, b.lr, a.nproc, a.lr_rule)
        knob_f, knob = ([], "") if theta is None else knob_flags(base_algo, theta, b)
        setting = setting_of(partition, value)
        slug = [] if theta is None else [f"{FIG1_THETA[base_algo][0].lstrip('-').replace('-', '_')}-{fmt(theta)}"]
        label = model_label(a.model, norm)
        tag = [label.lower()] if norm != base_norm(a.model) else []
        for seed in a.seeds:
            run_id = "-".join([algo, *slug, *tag, setting.replace("%", ""), f"s{seed}"])
            argv = ("--algo", base_algo, *data_flags(a.dataset, partition, value), *model_flags(a.model),
                    *NORM_FLAGS[norm], "--lr", fmt(lr), "--seed", str(seed), *b.flags(), *knob_f,
                    *ALGO_FLAGS.get(base_algo, ()), *extra, *a.geodml_args)
            self.cells.setdefault(run_id, Cell(algo, setting, label, knob, lr, RunSpec(run_id, self.out / run_id, argv,
                                                                                      a.nproc),
                                               skew=0.0 if partition == "iid" else value, theta=theta, seed=seed))


def base_norm(model: str) -> str:
    """The network's normalization in the un-normalized figures: ResNet-20 has BatchNorm (Figure 1), the rest none."""
    return "batch" if model == "resnet20" else "none"


def fig1_theta(algo: str) -> float | None:
    return None if algo == "bsp" else float(FIG1_THETA[algo][1])


def plan_noniid(p: Planner) -> None:
    for algo in p.args.algos:
        for partition, value in (("iid", None), ("label", 1.0)):
            p.add(algo, partition, value, theta=fig1_theta(algo))


def plan_norm(p: Planner) -> None:
    """Figure 5: BN against GN, GN in both readings (the text's group size 2, the prototxt's 2 groups)."""
    for norm in ("batch", "group", "group2g"):
        for algo in p.args.algos:
            for partition, value in (("iid", None), ("label", 1.0)):
                p.add(algo, partition, value, norm=norm, theta=fig1_theta(algo))


def plan_skew(p: Planner) -> None:
    levels = (0.2, 0.4, 0.6, 0.8) if p.budget.name == "full" else (0.2, 0.8)
    for algo in p.args.algos:
        p.add(algo, "iid", None, norm="group", theta=fig1_theta(algo))
        for level in levels:
            p.add(algo, "label", level, norm="group", theta=fig1_theta(algo))


def plan_hparams(p: Planner) -> None:
    from geodml.algorithms import algorithm_factory
    for partition, value in (("iid", None), ("label", 1.0)):
        p.add("bsp", partition, value)
    for algo in p.args.algos:
        if algo == "bsp":
            continue
        knob = algorithm_factory(algo).KNOB
        grid = tuple(float(v) for v in knob.grid) if knob is not None else ()
        if p.budget.name == "quick":
            grid = (grid[0], grid[-1])
        for theta in grid:
            for partition, value in (("iid", None), ("label", 1.0)):
                p.add(algo, partition, value, theta=theta)


def plan_dirichlet(p: Planner) -> None:
    alphas = (100.0, 1.0, 0.5, 0.2, 0.1, 0.05) if p.budget.name == "full" else (100.0, 0.1)
    beta = p.args.server_momentum
    for alpha in alphas:
        p.add("fedavg", "dirichlet", alpha, theta=20.0)
        # FedAvgM at the same effective server step: server lr = 1 - beta (hsu2019 section 3, eta_eff)
        p.add("fedavgm", "dirichlet", alpha, theta=20.0,
              extra=("--server-momentum", fmt(beta), "--server-lr", fmt(round(1 - beta, 12))))


def plan_brn(p: Planner) -> None:
    """Table 9: BN- against BRN-LeNet under BSP (K = 2 by default), IID and 100% non-IID."""
    for norm in ("batch", "batchrenorm"):
        for partition, value in (("iid", None), ("label", 1.0)):
            p.add("bsp", partition, value, norm=norm)


PLANS = {"noniid": plan_noniid, "norm": plan_norm, "skew": plan_skew, "hparams": plan_hparams, "dirichlet": plan_dirichlet,
         "brn": plan_brn}
PAPER_REF = {"noniid": "Quagmire Figure 1", "norm": "Quagmire Figure 5", "skew": "Quagmire Figure 6", "brn": "Quagmire Table 9",
             "hparams": "Quagmire Tables 6-8", "dirichlet": "Hsu et al. 2019 Figures 2/5",
             "skewscout": "Quagmire Figure 8"}


# ---- report ----------------------------------------------------------------------------------

def build_rows(cells: list[Cell], results: list[RunResult]) -> list[dict]:
    """One row per run. ``vs_bsp_iid_pp``: accuracy minus BSP-IID's of the same model and seed;
    ``savings_vs_bsp``: BSP's WAN bytes in the same setting, model and seed over the run's."""
    by_id = {r.spec.run_id: r for r in results}
    summ = {c.spec.run_id: (by_id[c.spec.run_id].summary if by_id[c.spec.run_id].succeeded else None) for c in cells}

    def bsp(setting: str, model: str, seed: int) -> dict | None:
        return next((summ[c.spec.run_id] for c in cells if c.algo == "bsp" and c.setting == setting and c.model == model
                     and c.seed == seed and summ[c.spec.run_id] is not None), None)
    rows = []
    for c in cells:
        res, s = by_id[c.spec.run_id], summ[c.spec.run_id]
        ref_iid, ref_same = bsp("iid", c.model, c.seed), bsp(c.setting, c.model, c.seed)
        acc = None if s is None else run_accuracy(s)
        wan = None if s is None else s.get("wan_bytes_total")
        rows.append({
            "run_id": c.spec.run_id, "model": c.model, "algo": c.algo, "knob": c.knob, "theta": c.theta, "setting": c.setting,
            "skew": c.skew, "seed": c.seed, "lr": c.lr, "status": res.status, "returncode": res.returncode,
            "error": res.error, "accuracy": acc, "final_model": None if s is None else s.get("final_model"),
            "global_accuracy": None if s is None else s.get("final_val_accuracy"),
            "val_loss": None if s is None else s.get("final_val_loss"),
            "train_loss": None if s is None else s.get("final_train_loss"),
            "vs_bsp_iid_pp": None if acc is None or ref_iid is None else 100 * (acc - run_accuracy(ref_iid)),
            "wan_bytes_total": wan, "savings_vs_bsp": None if not wan or ref_same is None or not ref_same.get("wan_bytes_total")
            else ref_same["wan_bytes_total"] / wan,
            "emulated_s": None if s is None else s.get("emulated_seconds"),
            "wall_s": None if s is None else s.get("wall_seconds"), "dir": str(c.spec.out),
            "stderr_tail": res.stderr_tail or None,
            "paper_accuracy": paper_accuracy(c.algo, c.theta, c.model, c.setting)})
    return rows


def aggregate(rows: list[dict]) -> list[dict]:
    """One row per cell (model, algorithm, knob, setting) over its seeds that succeeded: mean and sd of
    both accuracies, mean WAN bytes; ``vs_bsp_iid_pp`` = mean minus BSP-IID's mean (same model),
    ``savings_vs_bsp`` = BSP's mean bytes (same setting and model) over the cell's. ``status``: ok
    (every seed), partial (some), or the first failed run's status (none)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["algo"], r["knob"], r["setting"]), []).append(r)

    def ok(g: list[dict]) -> list[dict]:
        return [r for r in g if r["accuracy"] is not None]
    out = []
    for (model, algo, knob, setting), g in groups.items():
        good = ok(g)
        acc, acc_sd = mean_sd([r["accuracy"] for r in good])
        glob, glob_sd = mean_sd([r["global_accuracy"] for r in good if r.get("global_accuracy") is not None])
        wan, _ = mean_sd([r["wan_bytes_total"] for r in good if r["wan_bytes_total"] is not None])
        bsp_iid = ok(groups.get((model, "bsp", "", "iid"), []))
        bsp_same = ok(groups.get((model, "bsp", "", setting), []))
        ref_acc, _ = mean_sd([r["accuracy"] for r in bsp_iid])
        ref_wan, _ = mean_sd([r["wan_bytes_total"] for r in bsp_same if r["wan_bytes_total"] is not None])
        failed = [r for r in g if r["accuracy"] is None]
        first = g[0]
        out.append({
            "model": model, "algo": algo, "knob": knob, "theta": first["theta"], "setting": setting, "skew": first["skew"],
            "lr": first["lr"], "status": "ok" if not failed else ("partial" if good else failed[0]["status"]),
            "returncode": failed[0]["returncode"] if failed else 0, "seeds": ",".join(str(r.get("seed", 0)) for r in good),
            "n_seeds": len(good), "of_seeds": len(g), "accuracy": acc, "accuracy_sd": acc_sd,
            "global_accuracy": glob, "global_accuracy_sd": glob_sd,
            "vs_bsp_iid_pp": None if acc is None or ref_acc is None else 100 * (acc - ref_acc),
            "wan_bytes_total": wan, "savings_vs_bsp": None if not wan or not ref_wan else ref_wan / wan,
            "paper_accuracy": first["paper_accuracy"]})
    return out


def report_cells(report: dict) -> list[dict]:
    """The report's aggregated cells; computed from its rows for a report of an earlier geodml (one seed, no cells)."""
    return report["cells"] if "cells" in report else aggregate(report["rows"])


def _num(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def _bytes(n) -> str:
    from geodml.runs import human_bytes
    return "-" if n is None else human_bytes(n)


def pivot(rows: list[dict]) -> tuple[list[str], list[str], dict[tuple[str, str], dict]]:
    """(series, settings, cell) for the figure-style table: series = model + algorithm + knob."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    series = list(dict.fromkeys(series_name(r, len(models) > 1) for r in rows))
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    return series, settings, {(series_name(r, len(models) > 1), r["setting"]): r for r in rows}


def series_name(row: dict, with_model: bool) -> str:
    name = " ".join(x for x in (ALGO_LABEL[row["algo"]], row["knob"]) if x)
    return f"{row['model']} {name}" if with_model else name


def acc_text(acc: float, sd: float | None) -> str:
    """'86.4%', or '86.4 +- 0.5%' with the seeds' standard deviation."""
    return f"{100 * acc:.1f}%" if sd is None else f"{100 * acc:.1f} ± {100 * sd:.1f}%"


def cell_text(r: dict | None, *, savings: bool = False) -> str:
    """An aggregated cell: '86.4 ± 0.5% (-0.7 pp)'; with ``savings``, '(-0.7 pp, x19.9)' (WAN bytes saved over
    BSP in the same setting); '2/3 seeds' when some failed; the global model's accuracy (the
    partitions' averaged weights and BatchNorm statistics) where it differs from the partitions'
    mean by >= 0.5 pp (``run_accuracy``)."""
    if r is None:
        return ""
    if r["accuracy"] is None:
        return f"{r['status'].upper()} (exit {r['returncode']})"
    notes = [] if r["vs_bsp_iid_pp"] is None else [f"{r['vs_bsp_iid_pp']:+.1f} pp"]
    if savings and r["savings_vs_bsp"] is not None:
        notes.append(f"x{r['savings_vs_bsp']:.1f}")
    if r["n_seeds"] < r["of_seeds"]:
        notes.append(f"{r['n_seeds']}/{r['of_seeds']} seeds")
    glob = r.get("global_accuracy")
    if glob is not None and abs(glob - r["accuracy"]) >= 0.005:
        notes.append(f"global model {acc_text(glob, r.get('global_accuracy_sd'))}")
    return acc_text(r["accuracy"], r["accuracy_sd"]) + (f" ({', '.join(notes)})" if notes else "")


PAPER_BSP_IID = PAPER_LENET_CIFAR10[("bsp", None)][0] / 100


def paper_text(acc: float | None) -> str:
    """The paper's number and its difference to the paper's BSP-IID (77.4%), in the same style as ours."""
    return "" if acc is None else f"{100 * acc:.1f}% ({100 * (acc - PAPER_BSP_IID):+.1f} pp)"


LR_RULE_TEXT = {"paper": "the paper's rule: eta {lr:g}, BSP at K x eta, Gaia, DGC and FedAvg at eta",
                "divide": "BSP and FedAvg at {lr:g}, Gaia and DGC at {lr:g}/K (the rule before issue 21)",
                "same": "every algorithm at {lr:g}"}


def format_markdown(report: dict) -> str:
    rows = report["rows"]
    series, settings, cells = pivot(report_cells(report))
    b = report["budget"]
    length = f"{b['steps']} steps" if b["steps"] else f"{fmt(b['epochs'])} epochs"
    seeds = report.get("seeds", [0])
    rule = report.get("lr_rule", report.get("sum_lr", "divide"))  # earlier reports: sum_lr, divide or same
    lines = [f"# {report['study']}: {report['paper']} on {report['dataset']}, K={report['nproc']}, budget {b['name']}",
             "", f"Budget: {length} per run, lr {LR_RULE_TEXT[rule].format(lr=b['lr'])}, "
             f"eval every {b['eval_every']} steps, seeds {','.join(map(str, seeds))}. Accuracy = final top-1 validation "
             "accuracy, the mean over the partitions of each one's own model, as the released code reports (\"global "
             "model\": the partitions' averaged weights and BatchNorm statistics, where it differs by >= 0.5 pp), "
             + ("mean ± sd over the seeds; " if len(seeds) > 1 else "")
             + "(x pp) = difference to BSP-IID with the same model.", ""]
    savings = report["study"] == "hparams"  # the knobs trade bytes for accuracy: show both
    paper_cols = [st for st in ("iid", "noniid-100%") if any(r.get("paper_accuracy") is not None and r["setting"] == st
                                                            for r in report_cells(report))]
    if savings:
        lines += ["(x N) = WAN bytes saved over BSP in the same setting.", ""]
    if paper_cols:
        lines += ["Paper columns: Hsieh et al. 2020 Tables 6-8, CIFAR-10 LeNet, 128 epochs; (x pp) to the paper's "
                  "BSP-IID (77.4%). Another dataset and schedule: compare the pattern, not the levels.", ""]
    lines += ["| configuration | " + " | ".join([*settings, *(f"paper {st}" for st in paper_cols)]) + " |",
              "|---|" + "---|" * (len(settings) + len(paper_cols))]
    for s in series:
        ours = [cell_text(cells.get((s, st)), savings=savings) for st in settings]
        theirs = [paper_text((cells.get((s, st)) or {}).get("paper_accuracy")) for st in paper_cols]
        lines.append(f"| {s} | " + " | ".join([*ours, *theirs]) + " |")
    lines += ["", "| run | model | algorithm | knob | setting | seed | lr | accuracy | global model | vs BSP-IID | "
              "val loss | train loss | WAN bytes | savings vs BSP | emulated s | status |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = "-" if r["accuracy"] is None else f"{r['accuracy']:.4f}"
        sav = "-" if r["savings_vs_bsp"] is None else f"x{r['savings_vs_bsp']:.1f}"
        lines.append(f"| {r['run_id']} | {r['model']} | {ALGO_LABEL[r['algo']]} | {r['knob'] or '-'} | {r['setting']} | "
                     f"{r.get('seed', 0)} | {r['lr']:g} | {acc} | {_num(r.get('global_accuracy'), '.4f')} | "
                     f"{_num(r['vs_bsp_iid_pp'], '+.1f')} | {_num(r['val_loss'], '.3f')} | "
                     f"{_num(r['train_loss'], '.3f')} | {_bytes(r['wan_bytes_total'])} | {sav} | "
                     f"{_num(r['emulated_s'], '.0f')} | {r['status']} |")
    for r in rows:
        if r["status"] in ("failed", "timeout"):
            lines.append(f"\nFailed (excluded from comparisons): {r['run_id']}: {r['error']}; "
                         f"stderr: {Path(r['dir']) / 'stderr.txt'}")
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("run_id", "model", "algo", "knob", "theta", "setting", "skew", "seed", "lr", "status", "returncode",
              "accuracy", "global_accuracy", "final_model", "vs_bsp_iid_pp", "paper_accuracy", "val_loss", "train_loss",
              "wan_bytes_total", "savings_vs_bsp", "emulated_s", "wall_s", "dir", "error")
CELL_CSV_FIELDS = ("model", "algo", "knob", "theta", "setting", "skew", "lr", "status", "seeds", "n_seeds", "accuracy",
                   "accuracy_sd", "global_accuracy", "global_accuracy_sd", "vs_bsp_iid_pp", "paper_accuracy",
                   "wan_bytes_total", "savings_vs_bsp")


def write_csv(rows: list[dict], path: Path, fields: tuple[str, ...] = CSV_FIELDS) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})


def plot_bars(report: dict, path: Path, plt) -> None:
    """Grouped bars: one group per series, one bar per setting, '-x' labels relative to BSP-IID (like Figure 1)."""
    series, settings, cells = pivot(report_cells(report))
    width = 0.8 / max(1, len(settings))
    fig, ax = plt.subplots(figsize=(min(14.0, max(5.0, 1.1 * len(series) * max(1, len(settings)) ** 0.5 + 2)), 3.6))
    for j, st in enumerate(settings):
        xs, ys, errs, labels = [], [], [], []
        for i, s in enumerate(series):
            r = cells.get((s, st))
            if r is None or r["accuracy"] is None:
                continue
            xs.append(i + (j - (len(settings) - 1) / 2) * width)
            ys.append(100 * r["accuracy"])
            errs.append(0.0 if r["accuracy_sd"] is None else 100 * r["accuracy_sd"])
            labels.append("" if r["vs_bsp_iid_pp"] is None or r["vs_bsp_iid_pp"] > -0.5 else f"{r['vs_bsp_iid_pp']:.0f}")
        bars = ax.bar(xs, ys, width, label=st, yerr=errs if any(errs) else None, capsize=2,
                      error_kw={"elinewidth": 0.8})
        for bar, text in zip(bars, labels):
            if text:
                ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=6)
        for i, s in enumerate(series):  # failed runs: an X at zero, so they are visible
            r = cells.get((s, st))
            if r is not None and r["accuracy"] is None:
                ax.plot([i + (j - (len(settings) - 1) / 2) * width], [1], "rx")
    ax.set_xticks(range(len(series)))
    ax.set_xticklabels(series, rotation=30 if len(series) > 4 else 0, ha="right" if len(series) > 4 else "center", fontsize=7)
    ax.set_ylabel("top-1 validation accuracy [%]")
    ax.set_ylim(0, 100)
    n = len(report.get("seeds", [0]))
    ax.set_title(f"{report['paper']}: {report['dataset']}, K={report['nproc']} ({report['budget']['name']} budget"
                 + (f", mean ± sd of {n} seeds" if n > 1 else "") + ")", fontsize=9)
    ax.legend(fontsize=7, ncol=min(len(settings), 5))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_knobs(report: dict, path: Path, plt) -> bool:
    """hparams: one panel per algorithm, accuracy over its knob grid, IID and non-IID, ours (solid, each point
    labelled with its savings over BSP) beside the paper's CIFAR-10 LeNet (dashed); False when nothing to draw."""
    rows = [r for r in report_cells(report) if r["algo"] != "bsp" and r.get("theta") is not None]
    algos = list(dict.fromkeys(r["algo"] for r in rows))
    if not algos:
        return False
    bsp = {r["setting"]: r for r in report_cells(report) if r["algo"] == "bsp" and r["accuracy"] is not None}
    colors = {"iid": "tab:blue", "noniid-100%": "tab:orange"}
    fig, axes = plt.subplots(1, len(algos), figsize=(3.3 * len(algos), 3.7), squeeze=False)
    for ax, algo in zip(axes[0], algos):
        mine = [r for r in rows if r["algo"] == algo]
        grid = list(dict.fromkeys(r["theta"] for r in mine))
        labels = [next(r["knob"] for r in mine if r["theta"] == t).split(" (")[0] for t in grid]
        for setting in dict.fromkeys(r["setting"] for r in mine):
            color = colors.get(setting)
            pts = [(grid.index(r["theta"]), r) for r in mine if r["setting"] == setting and r["accuracy"] is not None]
            ax.errorbar([i for i, _ in pts], [100 * r["accuracy"] for _, r in pts],
                        yerr=[0.0 if r["accuracy_sd"] is None else 100 * r["accuracy_sd"] for _, r in pts],
                        fmt="o-", color=color, capsize=2, label=f"geodml {setting}")
            for i, r in pts:
                if r["savings_vs_bsp"] is not None:
                    ax.annotate(f"x{r['savings_vs_bsp']:.0f}", (i, 100 * r["accuracy"]), textcoords="offset points",
                                xytext=(0, 4 if setting == "iid" else -10), ha="center", fontsize=6, color=color)
            ref = [(grid.index(r["theta"]), r["paper_accuracy"]) for r in mine
                   if r["setting"] == setting and r.get("paper_accuracy") is not None]
            if ref:
                ax.plot([i for i, _ in ref], [100 * a for _, a in ref], "s--", color=color, alpha=0.5, markersize=3,
                        label=f"paper CIFAR-10 {setting}")
        if "iid" in bsp:
            ax.axhline(100 * bsp["iid"]["accuracy"], color="grey", lw=0.8, label="geodml BSP-IID")
        ax.axhline(100 * PAPER_BSP_IID, color="grey", lw=0.8, ls="--", label="paper BSP-IID")
        ax.set_xticks(range(len(grid)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylim(0, 100)
        ax.set_title(ALGO_LABEL[algo], fontsize=9)
    axes[0][0].set_ylabel("top-1 validation accuracy [%]")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize=6, frameon=False)
    fig.suptitle(f"{report['paper']}: {report['dataset']}, K={report['nproc']} (labels: WAN savings over BSP)", fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def write_plots(report: dict, out: Path) -> list[Path]:
    """accuracy.png (bars) and accuracy_vs_wan_bytes.png (curves); [] with a warning when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("warning: matplotlib is not installed; no PNGs (pip install 'geodml[plot]')", file=sys.stderr)
        return []
    from geodml.runs import ReportError, load_run, plot_accuracy
    bars, curves, knobs = out / "accuracy.png", out / "accuracy_vs_wan_bytes.png", out / "knobs.png"
    plot_bars(report, bars, plt)
    extra = [knobs] if report["study"] == "hparams" and plot_knobs(report, knobs, plt) else []
    runs = []
    first_seed = report["seeds"][0]
    for r in report["rows"]:
        if r["accuracy"] is None or r["seed"] != first_seed:
            continue
        try:
            run = load_run(r["dir"])
        except ReportError:
            continue
        run.label = f"{series_name(r, True)} {r['setting']}"
        runs.append(run)
    if runs:
        plot_accuracy(runs, "wan_bytes_total", curves, xlabel="WAN bytes sent (all ranks)",
                      title=f"{report['study']}: accuracy vs WAN bytes (seed {first_seed})", log_x=True, plt=plt)
        return [bars, curves, *extra]
    return [bars, *extra]


def build_report(args: argparse.Namespace, budget: Budget, cells: list[Cell], results: list[RunResult]) -> dict:
    rows = build_rows(cells, results)
    return {"study": args.name, "paper": PAPER_REF[args.name], "dataset": args.dataset, "nproc": args.nproc,
            "lr_rule": args.lr_rule, "seeds": list(args.seeds), "cells": aggregate(rows),
            "budget": {"name": budget.name, "epochs": budget.epochs, "steps": budget.steps, "lr": budget.lr,
                       "eval_every": budget.eval_every},
            "geodml_args": list(args.geodml_args), "out": str(args.out),
            "failed": [r["run_id"] for r in rows if r["status"] in ("failed", "timeout")], "rows": rows}


def write_outputs(report: dict, out: Path, *, plots: bool = True) -> tuple[str, list[Path]]:
    out.mkdir(parents=True, exist_ok=True)
    name = report["study"]
    text = format_markdown(report)
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    write_csv(report["rows"], out / f"{name}.csv")
    write_csv(report["cells"], out / f"{name}_cells.csv", CELL_CSV_FIELDS)
    paths = [out / f"{name}.md", out / f"{name}.csv", out / f"{name}_cells.csv", out / f"{name}.json"]
    return text, paths + (write_plots(report, out) if plots else [])


# ---- arguments ---------------------------------------------------------------------------------

def _algo_list(text: str) -> tuple[str, ...]:
    algos = tuple(a for a in text.replace(" ", "").split(",") if a)
    bad = [a for a in algos if a not in PAPER_ALGOS]
    if not algos or bad:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(PAPER_ALGOS)}, got {text!r}")
    return algos


def build_parser(name: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m geodml.study {name}", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=f"{PAPER_REF[name]} from real runs (see geodml/study/paper.py and docs/study.md).",
        epilog="Flags after '--' go to every geodml run (e.g. -- --batch-size 32). Finished runs (summary.json) are reused.")
    p.add_argument("--budget", choices=("quick", "full"), default="full",
                   help="quick: --steps per run (checks the machinery); full: the paper's schedule, shortened by --epochs")
    p.add_argument("--dataset", choices=DATASETS, default=None, help="default: digits for quick, fashion-mnist for full")
    p.add_argument("--nproc", type=int, default=2 if name == "brn" else 5,
                   help="partitions K (torchrun --nproc_per_node; Table 9's is 2)")
    p.add_argument("--processes", type=int, help="processes per run R (default: one per partition); each hosts a "
                   "block of the --nproc partitions; results do not depend on R, so finished runs are reused")
    p.add_argument("--model", choices=STUDY_MODELS, default="lenet",
                   help="lenet: the authors' Caffe LeNet (and its BN/GN/BRN variants); resnet20: He et al.'s ResNet-20 "
                   "(BatchNorm where the figure's network is un-normalized, as Figure 1's); cnn: McMahan et al.'s CNN, "
                   "what every study ran before issue 21")
    p.add_argument("--algos", type=_algo_list, default=PAPER_ALGOS, help="subset of bsp,gaia,fedavg,dgc (bsp is always run)")
    p.add_argument("--epochs", type=float, help=f"full budget: epochs per run (default {PAPER_EPOCHS}, the paper's)")
    p.add_argument("--steps", type=int, help="quick budget: steps per run (default 10)")
    p.add_argument("--lr", type=float, help=f"the paper's eta under --lr-rule paper, BSP's rate otherwise "
                   f"(default: full 0.01/K as the released solvers, {PAPER_LR} at K = 5, and {PAPER_LR} under the other "
                   f"rules; quick {QUICK_ETA}, 0.02 under the other rules)")
    p.add_argument("--lr-rule", "--sum-lr", dest="lr_rule", choices=LR_RULES, default="paper",
                   help="paper: one eta, BSP (geodml averages, the paper sums K gradients) at K x eta, Gaia, DGC and "
                   "FedAvg at eta; divide (the studies before issue 21): BSP and FedAvg at lr, Gaia and DGC at lr/K; "
                   "same: every algorithm at lr")
    p.add_argument("--seeds", type=seed_list, help="seeds, every run once per seed (default: full 0,1,2; quick 0)")
    p.add_argument("--eval-every", type=int, help="steps between validations (default: quick = --steps, full 500)")
    p.add_argument("--server-momentum", type=float, default=0.9, help="dirichlet: FedAvgM server momentum beta")
    p.add_argument("--out", help="study directory (default runs/study-NAME-DATASET-BUDGET-kNPROC, "
                   "with -lenet appended for --model lenet)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (2 cores: keep 1)")
    p.add_argument("--run-timeout", type=float, default=3600.0, help="seconds before a run is killed and reported")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    common.add_checkpoint_every(p)
    common.add_dry_run(p)
    common.add_only(p)
    if extra is not None:  # a study's own flags (geodml.study.skewscout.add_arguments)
        extra(p)
    return p


def parse_args(name: str, argv: list[str],
               flags: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    head, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = build_parser(name, flags)
    args = parser.parse_args(head)
    args.name, args.geodml_args = name, tuple(extra)
    if args.nproc < 2:
        parser.error(f"--nproc must be >= 2 (a study compares partitions), got {args.nproc}")
    if args.processes is not None and not 1 <= args.processes <= args.nproc:
        parser.error(f"--processes must be in 1..--nproc ({args.nproc}), got {args.processes}")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if not (math.isfinite(args.run_timeout) and args.run_timeout > 0):
        parser.error(f"--run-timeout must be > 0, got {args.run_timeout}")
    if not 0 <= args.server_momentum < 1:
        parser.error(f"--server-momentum must be in [0, 1), got {args.server_momentum}")
    if "bsp" not in args.algos:
        args.algos = ("bsp", *args.algos)  # every comparison is relative to BSP
    args.seeds = args.seeds or ((0,) if args.budget == "quick" else (0, 1, 2))
    args.dataset = args.dataset or ("digits" if args.budget == "quick" else "fashion-mnist")
    if args.out is None:
        suffix = "" if args.model == "cnn" else f"-{args.model}"
        args.out = str(Path("runs") / f"study-{name}-{args.dataset}-{args.budget}-k{args.nproc}{suffix}")
    return args


def prepare(name: str, argv: list[str]) -> tuple[argparse.Namespace, Budget, list[Cell]]:
    args = parse_args(name, argv)
    budget = make_budget(args)
    common.check_extra_flags(args.geodml_args, CONTROLLED)
    planner = Planner(args, budget)
    PLANS[name](planner)
    cells = list(planner.cells.values())
    common.validate_specs([c.spec for c in cells])
    return args, budget, cells


def main_for(name: str, argv: list[str] | None = None, *, launcher: Launcher = torchrun_launcher) -> int:
    """0: every run succeeded; 1: some run failed (reported); 2: bad arguments."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, budget, cells = prepare(name, argv)
    except StudyError as exc:
        print(f"geodml.study {name}: error: {exc}", file=sys.stderr)
        return 2
    print(f"{name} study ({PAPER_REF[name]}): {len(cells)} runs on {args.dataset}, K={args.nproc}, budget {budget.name}, "
          f"into {args.out}", flush=True)
    return common.run_and_report(name, args, [c.spec for c in cells], launcher,
                                 lambda results: build_report(args, budget, cells, results), write_outputs)


def noniid(argv=None, **kw):
    return main_for("noniid", argv, **kw)


def norm(argv=None, **kw):
    return main_for("norm", argv, **kw)


def skew(argv=None, **kw):
    return main_for("skew", argv, **kw)


def hparams(argv=None, **kw):
    return main_for("hparams", argv, **kw)


def dirichlet(argv=None, **kw):
    return main_for("dirichlet", argv, **kw)


def brn(argv=None, **kw):
    return main_for("brn", argv, **kw)
