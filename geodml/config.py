"""Run configuration: one keyword-only dataclass per component, checked in ``__post_init__``.

This module is the only place options are validated, and the only place they are described:
each field carries its command-line face in ``dataclasses.field(metadata=...)`` (see ``opt``):
help text, flag name when it differs from the field's, choices, and which algorithms the
option applies to. ``OPTIONS`` lists them all; geodml.cli generates the parser and reads TOML
files from it (docs/design.md style rule 3: the CLI only maps flags onto these classes). Every check
raises ``ValueError`` whose message names the command-line flag, so the CLI can print it once
and exit with code 2 before any process group exists.

Registries of names (datasets, models, algorithms, WAN modes, ...) are defined here once; the
modules that implement them import these tuples rather than restating them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from geodml import plugins

DATASETS = ("digits", "fashion-mnist", "mnist", "cifar10")
PARTITIONS = ("iid", "label", "dirichlet", "lda", "shards", "longtail", "entropy")
MODELS = ("cnn", "lenet", "resnet20", "logreg", "mlp", "cifar-cnn")
"""cnn: McMahan et al. 2017's CNN (called lenet before issue 21); lenet: the Quagmire authors' Caffe LeNet;
cifar-cnn: McMahan et al. 2017's CIFAR-10 CNN (the TensorFlow tutorial's), which Hsu et al. 2019 use."""
CONV_MODELS = ("cnn", "lenet", "resnet20", "cifar-cnn")
"""The models with convolutions (``--channels-last`` changes nothing for the others)."""
NORMS = ("none", "batch", "group", "batchrenorm")
MODEL_NORMS = {"cnn": ("none", "batch", "group"), "lenet": ("none", "batch", "group", "batchrenorm"),
               "resnet20": ("batch", "group"), "logreg": ("none",), "mlp": ("none",), "cifar-cnn": ("none",)}
"""The normalizations each model supports; the first is its natural default."""
MODEL_NORM_CHANNELS = {"cnn": (32, 64), "lenet": (32, 32, 64), "resnet20": (16, 32, 64)}
"""The channel counts of each model's normalized layers (a GroupNorm grouping must divide them all)."""
PARAM_MULTS = ("none", "prototxt")
PROTOTXT_MODELS = ("lenet", "resnet20")
"""The models that carry the authors' Caffe per-parameter lr_mult / decay_mult (``--param-mults prototxt``)."""
ALGOS = ("bsp", "gaia", "dgc", "fedavg", "local")
"""Keys of geodml.algorithms.REGISTRY (tests/test_cli.py checks that they agree)."""
API_ALGOS = tuple(plugins.builtin("algo"))
"""geodml's algorithms written on the public plugin API (geodml.plugins.BUILTIN): their options come
from their own ``Config`` (``cfg.plugin``), as a user's plugin's do."""
KNOB_ALGOS = ("gaia", "fedavg", "dgc")
"""The algorithms with a communication knob SkewScout can tune."""
BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")
WAN_MODES = ("off", "virtual", "real")
WIRE_AUTH_MODES = ("on", "off")
LR_SCHEDULES = ("step", "poly")
DGC_SCOPES = ("global", "layer")
DGC_CLIP_AT = ("gradient", "update")
IWDS_MODES = ("reweight", "resample")
SERVER_OPTIMIZERS = ("sgd", "adagrad", "adam", "yogi")
COMPRESSORS = ("none", "powersgd", "qsgd", "int8", "int4")
"""--compress: the codecs of BSP's gradient exchange and FedAvg's upload (geodml.algorithms.compressed)."""
"""FedAvg's server step (--server-optimizer): SGD (FedAvg / FedAvgM) or Reddi et al. 2021's adaptive ones."""
PARTITION_SCORES = ("auto", "all")
"""``--partition-scores``: which partitions' own final models the end of a run scores."""
SEARCHES = ("hill", "stochastic", "annealing")


def did_you_mean(word: object, choices: tuple[str, ...] | list[str]) -> str:
    """``" (did you mean gaia?)"`` when one of ``choices`` is close to ``word`` (difflib's ratio >= 0.6), else ``""``."""
    import difflib
    if not isinstance(word, str):
        return ""
    near = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {near[0]}?)" if near else ""


def require(cond: bool, msg: str) -> None:
    """Raise ``ValueError(msg)`` unless ``cond``: how every config check (plugins' too) refuses a value;
    ``msg`` names the flag, as the CLI prints it after ``geodml: error:``."""
    if not cond:
        raise ValueError(msg)


_check = require


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _int(x: Any) -> bool:
    """An integer that is not a bool (True would otherwise pass as 1)."""
    return isinstance(x, int) and not isinstance(x, bool)


def opt(default: Any, *, help: str, flag: str | None = None, choices: tuple[str, ...] | None = None,
        algos: tuple[str, ...] = (), norms: tuple[str, ...] = (), metavar: str | None = None,
        group: str | None = None, default_text: str | None = None) -> Any:
    """A config field and its command-line face (the field's one line of documentation is ``help``).

    flag: the flag when it is not ``--`` + the field name with dashes; a bool field defaulting to
    True is switched off by its flag (``--no-progress``). choices: the registry the value must be
    in. algos: the algorithms the option means something to (others warn that it does nothing);
    norms: likewise, the normalizations (``--norm``).
    group: the help section, when not the class's ``GROUP``. default_text: how ``--help`` shows
    the default when the value itself does not say it (``None`` meaning "off", a computed path).
    """
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices, "algos": algos,
                                            "norms": norms, "metavar": metavar, "group": group,
                                            "default_text": default_text})


@dataclass(kw_only=True)
class DataConfig:
    """What data each partition trains on and how it is split."""

    GROUP: ClassVar[str] = "data"

    dataset: str = opt("digits", help="dataset: digits (embedded), fashion-mnist, mnist, cifar10 (read from "
                       "--data-dir), or a plugin MODULE:FUNCTION (docs/plugins.md)")
    data_dir: str | None = opt(None, help="directory with the dataset files",
                               default_text="/usr/share/datasets/fashion-mnist for fashion-mnist")
    partition: str = opt("iid", help="partitioner: iid, label (Quagmire x% non-IID), "
                         "dirichlet (Hsu et al.), lda (per-class Dirichlet over the partitions, unequal sizes; "
                         "IWDS's LDA), shards (McMahan et al.), longtail (IWDS's LLT), "
                         "entropy (van Lier's topic-based distributions), or a plugin MODULE:CLASS (docs/plugins.md)")
    skew: float = opt(1.0, help="--partition label: fraction of the data partitioned by label (1.0 = 100% non-IID)")
    alpha: float = opt(0.5, help="--partition dirichlet: concentration alpha of Dir(alpha * p); 0 = one class "
                       "per client (the alpha -> 0 limit); --partition lda: per-client concentration of each "
                       "class's Dir(alpha * 1) over the partitions (> 0; IWDS's alpha_d)")
    client_size: int | None = opt(None, metavar="N", default_text="training samples // partitions",
                                  help="--partition dirichlet: samples per partition, drawn without replacement "
                                  "(Hsu et al. 2019: 100 clients x 500)")
    size_zipf: float = opt(0.0, metavar="S", help="--partition dirichlet: imbalanced partition sizes by Zipf's "
                           "rank-size law, the r-th largest of the K partitions holding floor(N1 * r^-S) samples "
                           "(N1 = --client-size, default the largest that fits), ranks in a random order (for Hsu et "
                           "al. 2020's FedVC); 0 = equal sizes")
    tail: float = opt(0.9, metavar="ALPHA", help="--partition longtail: alpha_l, the share of each class its "
                      "head partition(s) hold; the other partitions share the rest evenly (IWDS: 0.9, 0.99)")
    entropy_steps: int = opt(0, metavar="N", help="--partition entropy: distribution iterations d_N (0 = the "
                             "minimum-entropy topic split; van Lier: up to 100)")
    shards_per_partition: int = opt(2, help="--partition shards: shards of sorted labels per partition "
                                    "(McMahan et al.: 2)")
    cache: str = opt("auto", flag="--data-cache", metavar="DIR",
                     help="decoded dataset shared by the ranks (decode once, map K times): "
                     "auto ($GEODML_DATA_CACHE or ~/.cache/geodml/datasets), off, or DIR")

    def __post_init__(self) -> None:
        _check(isinstance(self.cache, str) and self.cache.strip() != "",
               f"--data-cache must be auto, off or a directory, got {self.cache!r}")
        _check(self.dataset in DATASETS or plugins.is_plugin_name("dataset", self.dataset),
               f"--dataset: unknown dataset {self.dataset!r}; choose one of {', '.join(DATASETS)}, "
               f"or a plugin MODULE:FUNCTION{did_you_mean(self.dataset, DATASETS)}")
        if self.dataset not in DATASETS:
            _check(callable(plugins.load("dataset", self.dataset)),
                   f"--dataset {self.dataset}: not a function (it must return a geodml.data.Dataset or the arrays "
                   "train_x, train_y, test_x, test_y; docs/plugins.md)")
        _check(self.partition in PARTITIONS or plugins.is_plugin_name("partition", self.partition),
               f"--partition: unknown partitioner {self.partition!r}; choose one of {', '.join(PARTITIONS)}, "
               f"or a plugin MODULE:CLASS{did_you_mean(self.partition, PARTITIONS)}")
        if self.partition not in PARTITIONS:
            _check(callable(getattr(plugins.load("partition", self.partition), "split", None)),
                   f"--partition {self.partition}: has no split(labels, num_partitions, rng) method "
                   "(geodml.data.partition.Partitioner; docs/plugins.md)")
        _check(_finite(self.skew) and 0.0 <= self.skew <= 1.0,
               f"--skew must be a fraction in [0, 1], got {self.skew!r}")
        _check(_finite(self.alpha) and self.alpha >= 0,
               f"--alpha must be >= 0 (0: one class per partition), got {self.alpha!r}")
        _check(self.partition != "lda" or self.alpha > 0,
               f"--partition lda needs --alpha > 0 (a Dirichlet concentration), got {self.alpha!r}")
        _check(self.client_size is None or (_int(self.client_size) and self.client_size >= 1),
               f"--client-size must be an integer >= 1, got {self.client_size!r}")
        _check(_finite(self.size_zipf) and self.size_zipf >= 0,
               f"--size-zipf must be a finite number >= 0 (0: equal partition sizes), got {self.size_zipf!r}")
        _check(_finite(self.tail) and 0.0 <= self.tail <= 1.0,
               f"--tail must be a fraction in [0, 1] (the head partitions' share of a class), got {self.tail!r}")
        _check(_int(self.entropy_steps) and self.entropy_steps >= 0,
               f"--entropy-steps must be an integer >= 0, got {self.entropy_steps!r}")
        _check(isinstance(self.shards_per_partition, int) and self.shards_per_partition >= 1,
               f"--shards-per-partition must be an integer >= 1, got {self.shards_per_partition!r}")


@dataclass(kw_only=True)
class ModelConfig:
    """Which network every partition trains."""

    GROUP: ClassVar[str] = "model"

    model: str = opt("cnn", help="network: cnn (McMahan et al. 2017's CNN), lenet (the Quagmire authors' Caffe LeNet), "
                     "resnet20, logreg, mlp, cifar-cnn (McMahan et "
                     "al.'s CIFAR-10 CNN, the TensorFlow tutorial's with its LRN, as Hsu et al. 2019 use it), or a "
                     "plugin MODULE:FUNCTION (docs/plugins.md)")
    norm: str = opt("none", choices=NORMS, help="normalization layers: none, batch (BN), group (GN), batchrenorm "
                    "(BRN, lenet only); resnet20 needs batch or group")
    gn_group_size: int | None = opt(None, norms=("group",), metavar="N", default_text="2 (the paper's text, "
                                    "section 5.2) unless --gn-groups", help="GroupNorm: N channels per group")
    gn_groups: int | None = opt(None, norms=("group",), metavar="N", default_text="off",
                                help="GroupNorm: N groups per layer (the authors' gnlenet prototxt: 2; "
                                "the paper's text says group size 2 instead); excludes --gn-group-size")
    brn_steps: tuple[float, ...] = opt((5000.0, 20000.0, 20000.0), norms=("batchrenorm",),
                                       help="BatchReNorm step_to_init,step_to_r_max,step_to_d_max: plain BN "
                                       "before the first, r_max and d_max reached at the others (the authors' "
                                       "K=2 prototxt: 5000,20000,20000 of 64,000 steps)")
    brn_r_max: float = opt(4.0, norms=("batchrenorm",), help="BatchReNorm r_max (the authors' prototxt: 4)")
    brn_d_max: float = opt(6.0, norms=("batchrenorm",), help="BatchReNorm d_max (the authors' prototxt: 6)")
    brn_average_fraction: float = opt(0.99, norms=("batchrenorm",), help="BatchReNorm moving_average_fraction "
                                      "(the authors' K=2 prototxt: 0.99)")
    param_mults: str = opt("none", choices=PARAM_MULTS, help="per-parameter learning-rate and weight-decay "
                           "multipliers: none (every parameter 1, 1) or prototxt (the authors' Caffe lr_mult / "
                           "decay_mult; lenet: biases lr 2, the classifier's weights decay 250; resnet20: weights "
                           "decay 2; geodml/models/lenet.py, resnet.py)")

    @property
    def is_plugin(self) -> bool:
        """Whether ``--model`` names a user's function (geodml.plugins) rather than one of MODELS."""
        return self.model not in MODELS

    def __post_init__(self) -> None:
        _check(self.model in MODELS or plugins.is_plugin_name("model", self.model),
               f"--model: unknown model {self.model!r}; choose one of {', '.join(MODELS)}, or a plugin MODULE:FUNCTION"
               f"{did_you_mean(self.model, MODELS)}")
        _check(self.norm in NORMS, f"--norm: unknown normalization {self.norm!r}; choose one of {', '.join(NORMS)}")
        if self.is_plugin:
            _check(callable(plugins.load("model", self.model)),
                   f"--model {self.model}: not a function (it takes input_shape and num_classes and returns a "
                   "torch.nn.Module; docs/plugins.md)")
            _check(self.norm == "none", f"--norm {self.norm}: a plugin model (--model {self.model}) builds its own "
                   "normalization layers; leave out --norm")
            _check(self.param_mults == "none", f"--param-mults {self.param_mults} needs a network from the authors' "
                   f"Caffe files (--model {' or --model '.join(PROTOTXT_MODELS)}), not the plugin --model {self.model}")
            return
        allowed = MODEL_NORMS[self.model]
        _check(self.norm in allowed, f"--norm {self.norm} is not available for --model {self.model}; "
                                     f"use --norm {' or --norm '.join(allowed)}")
        _check(self.param_mults in PARAM_MULTS,
               f"--param-mults: unknown value {self.param_mults!r}; choose one of {', '.join(PARAM_MULTS)}")
        _check(self.param_mults == "none" or self.model in PROTOTXT_MODELS,
               f"--param-mults {self.param_mults} needs a network from the authors' Caffe files "
               f"(--model {' or --model '.join(PROTOTXT_MODELS)}), not --model {self.model}")
        for flag, v in (("--gn-group-size", self.gn_group_size), ("--gn-groups", self.gn_groups)):
            _check(v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
                   f"{flag} must be an integer >= 1, got {v!r}")
        _check(self.gn_group_size is None or self.gn_groups is None,
               "--gn-group-size and --gn-groups are two readings of GroupNorm's grouping; give one")
        if self.norm == "group":
            n, what = ((self.gn_groups, "groups") if self.gn_groups is not None
                       else (self.gn_group_size or 2, "channels per group"))
            bad = [c for c in MODEL_NORM_CHANNELS.get(self.model, ()) if c % n]
            _check(not bad, f"--model {self.model} has normalized layers of {bad} channels, "
                            f"which {n} {what} do not divide")
        steps = tuple(self.brn_steps)
        _check(len(steps) == 3 and all(_finite(x) and x >= 0 and float(x) == int(x) for x in steps),
               f"--brn-steps takes three whole step counts step_to_init,step_to_r_max,step_to_d_max, got {steps!r}")
        _check(steps[0] < steps[1] and steps[0] < steps[2],
               f"--brn-steps: step_to_init must come before step_to_r_max and step_to_d_max, got {steps!r}")
        self.brn_steps = tuple(float(x) for x in steps)
        _check(_finite(self.brn_r_max) and self.brn_r_max >= 1, f"--brn-r-max must be >= 1, got {self.brn_r_max!r}")
        _check(_finite(self.brn_d_max) and self.brn_d_max >= 0, f"--brn-d-max must be >= 0, got {self.brn_d_max!r}")
        _check(_finite(self.brn_average_fraction) and 0 <= self.brn_average_fraction <= 1,
               f"--brn-average-fraction must be in [0, 1], got {self.brn_average_fraction!r}")


@dataclass(kw_only=True)
class OptimConfig:
    """Local momentum SGD and its learning-rate schedule (Quagmire Appendix C)."""

    GROUP: ClassVar[str] = "optimization"

    epochs: float = opt(30.0, help="training length in epochs (an epoch = training set / (K * batch size) steps)")
    steps: int | None = opt(None, help="training length in steps; overrides --epochs")
    batch_size: int = opt(20, help="minibatch size per partition (the paper: 20)")
    lr: float = opt(0.02, help="initial learning rate eta_0")
    lr_schedule: str = opt("step", choices=LR_SCHEDULES, help="step: divide by 10 at each milestone; "
                           "poly: eta_0 * (1 - step/max_steps) ** power")
    lr_milestones: tuple[float, ...] = opt((), default_text="none: a constant rate",
                                           help="epochs at which the step schedule divides the learning rate by 10, "
                                           "comma-separated, e.g. 64,96 (the paper: 64,96 of 128)")
    poly_power: float = opt(1.0, help="power of the poly schedule")
    momentum: float = opt(0.9, help="momentum m of vanilla momentum SGD")
    weight_decay: float = opt(0.0005, help="L2 weight decay added to the gradient")

    def __post_init__(self) -> None:
        _check(_finite(self.epochs) and self.epochs > 0, f"--epochs must be > 0, got {self.epochs!r}")
        _check(self.steps is None or (isinstance(self.steps, int) and self.steps >= 1),
               f"--steps must be an integer >= 1, got {self.steps!r}")
        _check(isinstance(self.batch_size, int) and self.batch_size >= 1,
               f"--batch-size must be an integer >= 1, got {self.batch_size!r}")
        _check(_finite(self.lr) and self.lr > 0, f"--lr must be > 0, got {self.lr!r}")
        _check(self.lr_schedule in LR_SCHEDULES,
               f"--lr-schedule: choose one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        ms = tuple(self.lr_milestones)
        _check(all(_finite(m) and m > 0 for m in ms), f"--lr-milestones must be positive epochs, got {ms!r}")
        _check(list(ms) == sorted(set(ms)), f"--lr-milestones must be strictly increasing, got {ms!r}")
        self.lr_milestones = ms
        _check(_finite(self.poly_power) and self.poly_power > 0, f"--poly-power must be > 0, got {self.poly_power!r}")
        _check(_finite(self.momentum) and 0.0 <= self.momentum < 1.0,
               f"--momentum must be in [0, 1), got {self.momentum!r}")
        _check(_finite(self.weight_decay) and self.weight_decay >= 0,
               f"--weight-decay must be >= 0, got {self.weight_decay!r}")


GAIA, DGC, FEDAVG = ("gaia",), ("dgc",), ("fedavg",)
DENSE = ("bsp", "fedavg")
FEDAVG_BASE_FIELDS = ("iter_local", "reset_momentum", "client_fraction", "local_epochs", "rounds", "eval_every_rounds")
"""The FedAvg options plain FedAvg itself takes (the rest select its variants): what a plugin that
extends FedAvg receives (geodml.algorithms.federated.fedavg_arguments) and is not warned about."""


@dataclass(kw_only=True)
class AlgoConfig:
    """Which decentralized learning algorithm runs (Quagmire Appendix A; a plugin: docs/plugins.md).

    Each of geodml's algorithms keeps its hyper-parameters in a section of its own (:class:`GaiaConfig`,
    :class:`DGCConfig`, :class:`FedAvgConfig`, :class:`CompressConfig`; a plugin's in ``RunConfig.plugin``);
    each knob also says which algorithms it means something to in its metadata (``algos``), which titles its
    help and warns when it is given to another one. Run directories written before the split keep these
    fields in the ``algo`` section: :func:`upgrade_config` reads them.
    """

    GROUP: ClassVar[str] = "algorithm"

    algo: str = opt("bsp", metavar="{" + ",".join(ALGOS + API_ALGOS) + "}|MODULE:CLASS",
                    help="decentralized learning algorithm; local: no communication, each partition trains alone; "
                    "MODULE:CLASS or a registered name: a plugin (docs/plugins.md); one with options of its own "
                    "(diloco, gossip, ...) shows them in this help once it is the chosen algorithm")

    def __post_init__(self) -> None:
        _check(self.algo in ALGOS or plugins.is_plugin_name("algo", self.algo),
               f"--algo: unknown algorithm {self.algo!r}; choose one of {', '.join(ALGOS + API_ALGOS)}, or a plugin "
               f"MODULE:CLASS (docs/plugins.md){did_you_mean(self.algo, ALGOS + API_ALGOS)}")
        if self.algo not in ALGOS:
            factory = plugins.load("algo", self.algo)
            _check(callable(getattr(factory, "from_config", None)),
                   f"--algo {self.algo}: has no from_config(cfg, *, flat, comm, ctx) (subclass geodml.Algorithm, whose "
                   "from_config builds it from the run's config; docs/plugins.md)")


@dataclass(kw_only=True)
class GaiaConfig:
    """Gaia's options (Quagmire Algorithm 1)."""

    GROUP: ClassVar[str] = "algorithm"

    t0: float = opt(0.1, algos=GAIA, help="initial significance threshold T0, 0.1 = 10%; T_t = T0 * lr_t / lr_0")

    def __post_init__(self) -> None:
        _check(_finite(self.t0) and self.t0 >= 0, f"--t0 must be >= 0 (a fraction, 0.1 = 10%), got {self.t0!r}")


@dataclass(kw_only=True)
class DGCConfig:
    """Deep Gradient Compression's options (Quagmire Algorithm 3; Lin et al. 2018)."""

    GROUP: ClassVar[str] = "algorithm"

    sparsity: float = opt(0.999, algos=DGC, help="final update sparsity s (0.999 = send the top 0.1%)")
    e_warm: float = opt(4.0, algos=DGC, help="epochs per sparsity warm-up stage (75%, 93.75%, 98.4375%, 99.6%, "
                        "then --sparsity); 0: no warm-up")
    clip_norm: float | None = opt(None, algos=DGC, default_text="off", help="global L2 gradient-clipping threshold; "
                                  "each partition clips its own gradient at clip_norm/sqrt(K) (Lin et al.)")
    dgc_sample_ratio: float = opt(0.01, algos=DGC, help="fraction of elements sampled to estimate the top-s threshold")
    dgc_scope: str = opt("global", algos=DGC, choices=DGC_SCOPES, help="global: one top-s over the whole model "
                         "(the Quagmire pseudocode); layer: the top-s of every layer (Lin et al.)")
    dgc_clip_at: str = opt("gradient", algos=DGC, choices=DGC_CLIP_AT, help="with --clip-norm: gradient: clip each "
                           "partition's gradient at clip_norm/sqrt(K) before momentum (Lin et al.); update: clip the "
                           "momentum-corrected update at clip_norm, as the authors' parameter server does")

    def __post_init__(self) -> None:
        _check(_finite(self.sparsity) and 0.0 <= self.sparsity < 1.0,
               f"--sparsity must be in [0, 1), got {self.sparsity!r}")
        _check(_finite(self.e_warm) and self.e_warm >= 0, f"--e-warm must be >= 0 epochs, got {self.e_warm!r}")
        _check(self.clip_norm is None or (_finite(self.clip_norm) and self.clip_norm > 0),
               f"--clip-norm must be > 0, got {self.clip_norm!r}")
        _check(_finite(self.dgc_sample_ratio) and 0 < self.dgc_sample_ratio <= 1,
               f"--dgc-sample-ratio must be in (0, 1], got {self.dgc_sample_ratio!r}")
        _check(self.dgc_scope in DGC_SCOPES,
               f"--dgc-scope: choose one of {', '.join(DGC_SCOPES)}, got {self.dgc_scope!r}")
        _check(self.dgc_clip_at in DGC_CLIP_AT,
               f"--dgc-clip-at: choose one of {', '.join(DGC_CLIP_AT)}, got {self.dgc_clip_at!r}")


@dataclass(kw_only=True)
class FedAvgConfig:
    """Federated Averaging's options (Quagmire Algorithm 2) and its variants' (FedAvgM, FedOpt, FedProx, FedIR,
    FedVC, IWDS, FedNova)."""

    GROUP: ClassVar[str] = "algorithm"

    iter_local: int = opt(20, algos=FEDAVG, help="local iterations between model averages (Iter_Local)")
    reset_momentum: bool = opt(False, algos=FEDAVG, help="reset the local momentum buffer every round "
                               "(Algorithm 2 keeps it)")
    client_fraction: float = opt(1.0, algos=FEDAVG, help="fraction of partitions selected each round "
                                 "(seeded, identical on every rank)")
    server_momentum: float = opt(0.0, algos=FEDAVG, help="FedAvgM (Hsu et al. 2019) server momentum beta "
                                 "(0: plain FedAvg)")
    server_lr: float = opt(1.0, algos=FEDAVG, help="FedAvgM server learning rate")
    server_nesterov: bool = opt(False, algos=FEDAVG, help="Nesterov server momentum (FedAvgM)")
    server_optimizer: str = opt("sgd", algos=FEDAVG, choices=SERVER_OPTIMIZERS, help="the server step on the "
                                "averaged update: sgd (FedAvg; FedAvgM with --server-momentum) or Reddi et al. "
                                "2021's FedAdagrad / FedAdam / FedYogi, with --server-lr as eta, --server-betas, "
                                "--server-tau")
    server_betas: tuple[float, ...] = opt((0.9, 0.99), algos=FEDAVG, metavar="B1,B2", help="FedAdam/FedYogi/"
                                          "FedAdagrad beta1,beta2 (Reddi et al.'s 0.9,0.99; Adagrad uses beta1 only)")
    server_tau: float = opt(1e-3, algos=FEDAVG, help="FedAdam/FedYogi/FedAdagrad adaptivity tau (Reddi et al.'s "
                            "1e-3; v starts at tau^2)")
    prox_mu: float = opt(0.0, algos=FEDAVG, help="FedProx (Li et al. 2020) proximal term weight mu (0: off)")
    fedir: bool = opt(False, algos=FEDAVG, help="FedIR (Hsu et al. 2020): importance weights p(y)/q_k(y) "
                      "on each partition's loss")
    virtual_client_size: int = opt(0, algos=FEDAVG, help="FedVC (Hsu et al. 2020): examples per selected partition "
                                   "per round (0: off)")
    iwds: tuple[float, ...] | None = opt(None, algos=FEDAVG, default_text="off",
                                         help="IWDS per-sample weight schedule beta0,beta_m,rho")
    iwds_mode: str = opt("reweight", algos=FEDAVG, choices=IWDS_MODES, help="with --iwds: resample: draw each "
                         "minibatch with p(k,i) proportional to w_{k,i,t}, as the IWDS paper does; reweight: uniform "
                         "minibatches, each example's loss weighted by w (the default, so that earlier runs keep their "
                         "meaning)")
    fednova: bool = opt(False, algos=FEDAVG, help="FedNova (Wang et al. 2020): average the participants' updates "
                        "normalized by their local steps ||a_i||_1 and rescale by tau_eff = sum p_i ||a_i||_1; "
                        "resets the local momentum every round")
    local_epochs: float = opt(0.0, algos=FEDAVG, metavar="E", help="E > 0: each participant takes ceil(E * n_k / "
                              "batch size) local steps per round (McMahan et al.'s E: unequal partitions take unequal "
                              "steps), a round lasting as long as its longest participant; replaces --iter-local "
                              "(0: off)")
    rounds: int | None = opt(None, algos=FEDAVG, metavar="R", default_text="off", help="training length in "
                             "rounds; replaces --steps and --epochs: the run ends with the R-th average, after the "
                             "rounds' lengths summed (R x --iter-local; with --local-epochs each round's longest "
                             "participant, from the partition sizes and the seeded client draw)")
    eval_every_rounds: int = opt(0, algos=FEDAVG, metavar="N", help="with --rounds: also validate the global model "
                                 "after every N-th round (at the round's last step, whatever its length; 0: off)")

    def __post_init__(self) -> None:
        _check(isinstance(self.iter_local, int) and self.iter_local >= 1,
               f"--iter-local must be an integer >= 1, got {self.iter_local!r}")
        _check(_finite(self.client_fraction) and 0 < self.client_fraction <= 1,
               f"--client-fraction must be in (0, 1], got {self.client_fraction!r}")
        _check(_finite(self.server_momentum) and 0 <= self.server_momentum < 1,
               f"--server-momentum must be in [0, 1), got {self.server_momentum!r}")
        _check(_finite(self.server_lr) and self.server_lr > 0, f"--server-lr must be > 0, got {self.server_lr!r}")
        _check(self.server_optimizer in SERVER_OPTIMIZERS,
               f"--server-optimizer: choose one of {', '.join(SERVER_OPTIMIZERS)}, got {self.server_optimizer!r}")
        self.server_betas = tuple(self.server_betas)
        _check(len(self.server_betas) == 2 and all(_finite(b) and 0 <= b < 1 for b in self.server_betas),
               f"--server-betas takes two numbers in [0, 1) such as 0.9,0.99, got {self.server_betas!r}")
        _check(_finite(self.server_tau) and self.server_tau > 0, f"--server-tau must be > 0, got {self.server_tau!r}")
        _check(self.server_optimizer == "sgd" or (self.server_momentum == 0 and not self.server_nesterov),
               f"--server-optimizer {self.server_optimizer} has its own momentum (beta1 of --server-betas); "
               "--server-momentum and --server-nesterov are FedAvgM's (--server-optimizer sgd)")
        _check(_finite(self.prox_mu) and self.prox_mu >= 0, f"--prox-mu must be >= 0, got {self.prox_mu!r}")
        _check(isinstance(self.virtual_client_size, int) and self.virtual_client_size >= 0,
               f"--virtual-client-size must be an integer >= 0, got {self.virtual_client_size!r}")
        _check(not (self.fedir and self.iwds is not None),
               "--fedir and --iwds both set the per-class loss weights; choose one")
        if self.iwds is not None:
            self.iwds = tuple(self.iwds)
            _check(len(self.iwds) == 3 and all(_finite(b) for b in self.iwds),
                   f"--iwds takes three numbers beta0,beta_m,rho, got {self.iwds!r}")
            b0, bm, rho = self.iwds
            _check(0 <= b0 < 1 and 0 <= bm < 1 and 0 < rho <= 1,
                   f"--iwds: need 0 <= beta0, beta_m < 1 and 0 < rho <= 1, got {self.iwds!r}")
        _check(self.iwds_mode in IWDS_MODES,
               f"--iwds-mode: choose one of {', '.join(IWDS_MODES)}, got {self.iwds_mode!r}")
        _check(not (self.iwds is not None and self.iwds_mode == "resample" and self.virtual_client_size > 0),
               "--iwds-mode resample draws each minibatch itself and FedVC (--virtual-client-size) draws its "
               "virtual clients; use one of them, or --iwds-mode reweight with FedVC")
        _check(_finite(self.local_epochs) and self.local_epochs >= 0,
               f"--local-epochs must be >= 0 (0: off), got {self.local_epochs!r}")
        _check(not (self.local_epochs > 0 and self.virtual_client_size > 0),
               "--local-epochs and --virtual-client-size both set how much a participant trains per round; "
               "choose one")
        _check(self.rounds is None or (_int(self.rounds) and self.rounds >= 1),
               f"--rounds must be an integer >= 1, got {self.rounds!r}")
        _check(_int(self.eval_every_rounds) and self.eval_every_rounds >= 0,
               f"--eval-every-rounds must be an integer >= 0 (0: off), got {self.eval_every_rounds!r}")
        _check(self.eval_every_rounds == 0 or self.rounds is not None,
               "--eval-every-rounds counts the rounds of a --rounds run; give --rounds too (or --eval-every in steps)")
        _check(self.rounds is None or self.eval_every_rounds <= self.rounds,
               f"--eval-every-rounds {self.eval_every_rounds} is more than the run's --rounds {self.rounds}: it would "
               f"never validate before the end; choose 1 to {self.rounds}")


@dataclass(kw_only=True)
class CompressConfig:
    """Compressed exchange of BSP's gradients and FedAvg's uploads (geodml.algorithms.compressed)."""

    GROUP: ClassVar[str] = "algorithm"

    compress: str = opt("none", algos=DENSE, choices=COMPRESSORS, help="compress BSP's gradient exchange or "
                        "FedAvg's upload: powersgd (Vogels et al. 2019, rank --compress-rank, error feedback), qsgd "
                        "(Alistarh et al. 2017, --compress-levels), int8 / int4 (blocks of 64 with float32 scales)")
    compress_rank: int = opt(1, algos=DENSE, metavar="R", help="PowerSGD's rank r (torch's powerSGD_hook default 1)")
    compress_levels: int = opt(16, algos=DENSE, metavar="S", help="QSGD's levels s per sign "
                               "(ceil(log2(2s + 1)) bits an entry)")

    def __post_init__(self) -> None:
        _check(self.compress in COMPRESSORS,
               f"--compress: choose one of {', '.join(COMPRESSORS)}, got {self.compress!r}"
               f"{did_you_mean(self.compress, COMPRESSORS)}")
        _check(_int(self.compress_rank) and self.compress_rank >= 1,
               f"--compress-rank must be an integer >= 1, got {self.compress_rank!r}")
        _check(_int(self.compress_levels) and 1 <= self.compress_levels <= 2**15,
               f"--compress-levels must be an integer in [1, 32768], got {self.compress_levels!r}")


ALGO_SECTIONS = ("gaia", "dgc", "fedavg", "compression")
"""RunConfig's sections that hold geodml's algorithms' own options (split from ``algo`` by issue 66 item 7)."""


@dataclass(kw_only=True)
class SkewScoutConfig:
    """SkewScout (Quagmire §7): model traveling and communication control.

    Cadence: ``--travel-every N`` travels and decides every N steps (the paper: every 500
    minibatches); ``--travel-decisions D`` instead spreads D decisions over the run (every
    ``total_steps // D`` steps; the paper's 64,000 steps / 500 = 128). Steps stay the default:
    the paper states its cadence in minibatches and a step interval behaves the same whatever the
    run's length; a study that shortens the schedule passes ``--travel-decisions`` to keep the
    paper's order of decisions (geodml.study.skewscout does). Giving both is refused.

    ``--travel-backoff F`` (not the paper's; default 1 = its fixed cadence) stretches the interval
    while nothing is to be decided: after a decision that keeps theta, with at least two trips
    pooled and the pool's accuracy-loss bounds both on one side of sigma_AL, the next interval is
    twice the last, up to F times the cadence; any other decision returns to the cadence. It caps
    travel's share of the bytes once theta has settled (docs/skewscout.md, "Travel cost").
    """

    GROUP: ClassVar[str] = "SkewScout (Quagmire section 7)"
    DEFAULT_TRAVEL_EVERY: ClassVar[int] = 500
    """Steps between travels when neither --travel-every nor --travel-decisions is given (the paper's)."""

    enabled: bool = opt(False, flag="--skewscout", help="travel models and tune the algorithm's communication knob "
                        f"({', '.join(KNOB_ALGOS)})")
    travel_every: int | None = opt(None, metavar="STEPS", help="steps between model travels and decisions",
                                   default_text="500, the paper's 500 minibatches, unless --travel-decisions")
    travel_decisions: int | None = opt(None, metavar="D", help="decisions per run instead: travel every "
                                       "max(1, total steps // D) steps (the paper: 64,000 / 500 = 128)",
                                       default_text="off")
    travel_backoff: int = opt(1, metavar="F", help="after each decision that keeps theta with its accuracy-loss "
                              "bounds clear of sigma_AL, double the steps to the next one, up to F times the cadence; "
                              "any other decision returns to the cadence (1: a fixed cadence, the paper's)")
    travel_samples: int | None = opt(None, help="training examples a host evaluates a visiting model on (and the "
                                     "sender its own model on); capped by the partition's size",
                                     default_text="sized for --travel-se: ceil(0.5 / (K * se^2)), 1000 at K=5")
    travel_se: float = opt(0.01, help="target standard error of the K-partition mean accuracy loss, worst case "
                           "(p = 0.5): sizes --travel-samples when it is not given (0.01 = 1 pp, a fifth of sigma_AL)")
    al_confidence: float = opt(0.95, help="one-sided confidence of the accuracy-loss bounds the controller decides on "
                               "(0.5: the point estimate, the paper's rule; docs in geodml/skewscout/controller.py)")
    skewscout_grid: tuple[float, ...] = opt((), metavar="V1,V2,...", help="knob values SkewScout may choose, "
                                            "ordered by the knob itself (e.g. 0.005,0.01,...,0.5 for T0)",
                                            default_text="the algorithm's grid")
    lambda_al: float = opt(50.0, help="Equation 1 weight of the accuracy-loss penalty (the paper: 50)")
    lambda_c: float = opt(1.0, help="Equation 1 weight of communication (the paper: 1)")
    sigma_al: float = opt(0.05, help="tolerated accuracy loss (the paper: 0.05 = 5%)")
    search: str = opt("hill", flag="--skewscout-search", choices=SEARCHES,
                      help="hill, stochastic (hill climbing) or annealing (simulated annealing)")

    def __post_init__(self) -> None:
        _check(self.travel_every is None or (_int(self.travel_every) and self.travel_every >= 1),
               f"--travel-every must be an integer >= 1 (steps), got {self.travel_every!r}")
        _check(self.travel_decisions is None or (_int(self.travel_decisions) and self.travel_decisions >= 1),
               f"--travel-decisions must be an integer >= 1 (decisions per run), got {self.travel_decisions!r}")
        _check(self.travel_every is None or self.travel_decisions is None,
               "--travel-every (steps) and --travel-decisions (decisions per run) set the same cadence; give one")
        _check(_int(self.travel_backoff) and self.travel_backoff >= 1,
               f"--travel-backoff must be an integer >= 1 (1: a fixed cadence), got {self.travel_backoff!r}")
        _check(self.travel_samples is None or (_int(self.travel_samples) and self.travel_samples >= 1),
               f"--travel-samples must be an integer >= 1, got {self.travel_samples!r}")
        _check(_finite(self.travel_se) and 0 < self.travel_se <= 0.5,
               f"--travel-se must be in (0, 0.5] (a standard error, 0.01 = 1 pp), got {self.travel_se!r}")
        _check(_finite(self.al_confidence) and 0.5 <= self.al_confidence < 1,
               f"--al-confidence must be in [0.5, 1) (0.95 = one-sided 95%), got {self.al_confidence!r}")
        self.skewscout_grid = tuple(self.skewscout_grid)
        _check(all(_finite(v) and v >= 0 for v in self.skewscout_grid),
               f"--skewscout-grid takes finite knob values >= 0, got {self.skewscout_grid!r}")
        _check(len(set(self.skewscout_grid)) == len(self.skewscout_grid),
               f"--skewscout-grid has a repeated value: {self.skewscout_grid!r}")
        _check(_finite(self.lambda_al) and self.lambda_al >= 0, f"--lambda-al must be >= 0, got {self.lambda_al!r}")
        _check(_finite(self.lambda_c) and self.lambda_c >= 0, f"--lambda-c must be >= 0, got {self.lambda_c!r}")
        _check(_finite(self.sigma_al) and 0 <= self.sigma_al <= 1,
               f"--sigma-al must be in [0, 1], got {self.sigma_al!r}")
        _check(self.search in SEARCHES, f"--skewscout-search: choose one of {', '.join(SEARCHES)}, got {self.search!r}")

    def interval_steps(self, total_steps: int) -> int:
        """Steps between travels for a run of ``total_steps``: --travel-every, else total // --travel-decisions
        (at least 1, so more decisions than steps means one per step), else the paper's 500."""
        assert total_steps >= 1
        if self.travel_decisions is not None:
            return max(1, total_steps // self.travel_decisions)
        return self.travel_every if self.travel_every is not None else self.DEFAULT_TRAVEL_EVERY

    def samples(self, num_partitions: int) -> int:
        """Examples per travel evaluation: --travel-samples, else the fewest n whose worst-case standard error
        of the K-partition mean AL is <= --travel-se: AL_k = local - remote is a difference of two accuracies
        on n examples each, Var <= 2 * 0.25 / n; the mean of K of them: 0.5 / (n K); so n = ceil(0.5 / (K se^2))."""
        assert num_partitions >= 1
        if self.travel_samples is not None:
            return self.travel_samples
        return math.ceil(0.5 / (num_partitions * self.travel_se ** 2) - 1e-9)


@dataclass(kw_only=True)
class CommConfig:
    """Emulated WAN and peer transport."""

    GROUP: ClassVar[str] = "WAN and communication"

    topology: str | None = opt(None, help="topology name (a file in topologies/) or path to a .toml file",
                               default_text="one region per rank, joined by an illustrative 100 Mbit/s, 50 ms WAN")
    wan: str = opt("virtual", choices=WAN_MODES, help="off: count bytes; virtual: also advance an emulated clock; "
                   "real: pace sends in wall time")
    wan_scale: float = opt(1.0, help="multiply every link bandwidth by this factor (run a slow WAN faster); reported")
    compute_s_per_step: float | None = opt(None, metavar="S", default_text="measured", help="emulate every computed "
                                           "step's forward and backward as S seconds instead of measuring them: the "
                                           "emulated clock (time-to-accuracy) then depends on the bytes and messages "
                                           "alone, not on this machine's speed or load")
    bind_host: str | None = opt(None, help="address this node's ZeroMQ socket binds and advertises; "
                                "* or 0.0.0.0 binds all interfaces",
                                default_text="this node's address towards MASTER_ADDR, 127.0.0.1 on one machine")
    timeout_s: float = opt(60.0, flag="--comm-timeout", help="seconds any wait on a peer may take before the run "
                           "fails naming that peer")
    wire_auth: str = opt("on", choices=WIRE_AUTH_MODES, help="on: every ZeroMQ message carries a MAC under a per-run "
                         "secret (docs/reliability.md); off: no MAC (trusted networks)")
    max_message_mb: float = opt(512.0, help="largest ZeroMQ message a rank sends or accepts, MiB; larger incoming ones "
                                "are dropped and counted")

    def __post_init__(self) -> None:
        _check(self.wan in WAN_MODES, f"--wan: choose one of {', '.join(WAN_MODES)}, got {self.wan!r}")
        _check(self.wire_auth in WIRE_AUTH_MODES, f"--wire-auth: choose on or off, got {self.wire_auth!r}")
        _check(_finite(self.max_message_mb) and 1 / 1024 <= self.max_message_mb <= 1 << 20,
               f"--max-message-mb must be between 0.001 (1 KiB) and 1048576 MiB, got {self.max_message_mb!r}")
        _check(_finite(self.wan_scale) and self.wan_scale > 0, f"--wan-scale must be > 0, got {self.wan_scale!r}")
        _check(self.compute_s_per_step is None or (_finite(self.compute_s_per_step) and self.compute_s_per_step >= 0),
               f"--compute-s-per-step must be >= 0 seconds, got {self.compute_s_per_step!r}")
        _check(_finite(self.timeout_s) and self.timeout_s > 0,
               f"--comm-timeout must be > 0 seconds, got {self.timeout_s!r}")


@dataclass(kw_only=True)
class ReliabilityConfig:
    """Checkpoints, resume and peer-failure detection (docs/reliability.md)."""

    GROUP: ClassVar[str] = "reliability (docs/reliability.md)"

    checkpoint_every: int = opt(0, metavar="N", help="write every rank's full state to <out>/rank<k>/ckpt-<step>.pt "
                                "every N steps (0: never)")
    resume: bool = opt(False, help="continue from the newest step every rank has a checkpoint of in --out "
                       "(fresh start when none); implied after a torchrun --max-restarts restart "
                       "(TORCHELASTIC_RESTART_COUNT > 0)")
    restart: bool = opt(False, help="start afresh in --out, replacing the unfinished run there (its metrics.jsonl "
                        "and checkpoints are removed); a finished run (summary.json) is never replaced")
    peer_timeout_s: float = opt(30.0, metavar="S", help="a rank whose heartbeat (through the torch.distributed store) "
                                "stops this many seconds is declared lost: every other rank exits non-zero naming it")
    divergence_loss: float | None = opt(None, metavar="LOSS", default_text="off: every step runs",
                                        help="end the run at the first log line (--log-every, --eval-every) whose mean "
                                        "training loss over every partition since the line before is NaN, infinite or "
                                        "above LOSS (inf: only NaN and infinite); the final evaluation and summary.json "
                                        "(diverged_at_step) are written as usual, the steps left are not run")

    def __post_init__(self) -> None:
        _check(isinstance(self.checkpoint_every, int) and not isinstance(self.checkpoint_every, bool)
               and self.checkpoint_every >= 0,
               f"--checkpoint-every must be an integer >= 0 steps (0 = no checkpoints), got {self.checkpoint_every!r}")
        _check(isinstance(self.resume, bool), f"--resume is a switch (true/false), got {self.resume!r}")
        _check(isinstance(self.restart, bool), f"--restart is a switch (true/false), got {self.restart!r}")
        _check(not (self.resume and self.restart), "--resume continues a run and --restart starts it afresh: give one")
        _check(_finite(self.peer_timeout_s) and self.peer_timeout_s > 0,
               f"--peer-timeout-s must be > 0 seconds, got {self.peer_timeout_s!r}")
        _check(self.divergence_loss is None or (isinstance(self.divergence_loss, (int, float))
                                                 and not isinstance(self.divergence_loss, bool)
                                                 and self.divergence_loss > 0),  # NaN fails, inf passes
               f"--divergence-loss must be a loss > 0 (inf: stop only on NaN or inf), got {self.divergence_loss!r}")


@dataclass(kw_only=True)
class RunConfig:
    """Everything one run needs; identical on every rank."""

    GROUP: ClassVar[str] = "run"

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    gaia: GaiaConfig = field(default_factory=GaiaConfig)
    dgc: DGCConfig = field(default_factory=DGCConfig)
    fedavg: FedAvgConfig = field(default_factory=FedAvgConfig)
    compression: CompressConfig = field(default_factory=CompressConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    skewscout: SkewScoutConfig = field(default_factory=SkewScoutConfig)
    reliability: ReliabilityConfig = field(default_factory=ReliabilityConfig)
    plugin: Any = None
    """A plugin algorithm's own options: an instance of its ``Config`` dataclass (docs/plugins.md), built
    with its defaults when not given; None for geodml's algorithms and a plugin without ``Config``."""
    seed: int = opt(0, help="seed of every generator (partitioning, init, minibatch order)")
    eval_every: int = opt(100, help="validate the global model on the whole test set every this many steps "
                          "(and at the end)")
    eval_at: tuple[float, ...] = opt((), metavar="S1,S2,...", default_text="none", help="also validate the global "
                                     "model after each of these steps (whole numbers, e.g. the last rounds' ends, so a "
                                     "final accuracy can be averaged over them); each also writes a metrics line, where the "
                                     "train loss and accuracy averages restart; steps past the run's end are never reached")
    partition_eval_examples: int | None = opt(
        None, metavar="N", help="score each partition's own final model (summary.json's per_rank_val_accuracy) on N "
        "test examples drawn without replacement from the run's seed (the same N for every partition, process count and "
        "engine) instead of the whole test set: where partitions hold different models (gaia, dgc, local) the final "
        "evaluation is one test-set pass per partition. The global model is always scored on the whole test set",
        default_text="the whole test set")
    partition_scores: str = opt("auto", choices=PARTITION_SCORES, help="score each partition's own final model at the "
                                "end (summary.json's per_rank_val_accuracy on the test set and per_rank_train_accuracy on "
                                "its own training data): all: every partition; auto: only where partitions end with "
                                "models of their own (gaia, local): where every partition holds a copy of a global model "
                                "of some round (bsp, dgc, fedavg) the per-partition scores are null and the global model's "
                                "accuracy is the run's")
    out: str | None = opt(None, help="run directory", default_text="runs/<timestamp>-<algo>")
    backend: str = opt("auto", choices=BACKENDS, help="torch.distributed backend; auto: nccl if CUDA is available, "
                       "else gloo")
    device: str = opt("auto", choices=DEVICES, help="where ranks train; auto: each rank's GPU with nccl, else the CPU; "
                      "cuda with --backend gloo lets several ranks share a GPU")
    threads: int = opt(1, help="torch intra-op threads per rank (two per rank collapse under contention)")
    deterministic: bool = opt(False, help="deterministic kernels only (torch.use_deterministic_algorithms; "
                              "CUBLAS_WORKSPACE_CONFIG on a GPU): a GPU run repeats to the bit, somewhat slower; "
                              "the CPU's kernels already do. An op with no deterministic GPU kernel warns instead "
                              "(LocalResponseNorm's backward: lenet, cifar-cnn)")
    log_every: int = opt(10, help="write a metrics.jsonl line (averaged over partitions) every this many steps")
    progress: bool = opt(True, flag="--no-progress", help="no live progress line (rank 0 prints one by default)")
    metrics_port: int = opt(0, group="metrics", metavar="BASE", help="Prometheus exporter on every rank at port "
                            "BASE + local rank; writes <out>/prometheus_targets.json (0: no exporter)")
    metrics_host: str = opt("127.0.0.1", group="metrics", metavar="HOST", help="address the exporters listen on "
                            "(0.0.0.0 to be scraped from other hosts)")
    tensorboard: str | None = opt(None, group="metrics", metavar="DIR", default_text="off",
                                  help="also write TensorBoard event files into DIR/<run directory name>: every "
                                  "metrics.jsonl number on the step axis, accuracy_vs_wan_bytes (bytes as the step), "
                                  "and the summary's WAN bytes per kind and per link (geodml/metrics/tensorboard.py)")
    metrics_linger_s: float = opt(10.0, flag="--metrics-linger", group="metrics", metavar="S",
                                  help="seconds the exporters stay up after the run so Prometheus scrapes the final "
                                  "values (with --metrics-port)")
    partitions: int | None = opt(None, metavar="P", help="data partitions; each process hosts a block of them on "
                                 "one engine (in-process messages, charged exactly as sent; docs/launch.md)",
                                 default_text="the number of processes")
    processes: int | None = opt(None, metavar="R", help="processes that `python -m geodml` starts for the run when "
                                "torchrun did not launch it, each hosting a block of the partitions (results do not "
                                "depend on R; geodml/engine/launcher.py); under torchrun, --nproc_per_node decides",
                                default_text="one per usable core, at most --partitions (GEODML_PROCESSES overrides)")
    channels_last: bool = opt(False, help="train on a copy of the model whose convolution weights are channels-last, "
                              "synced with the flat weights every step: whole runs 1.07-1.19x faster on the CPU (cnn, "
                              "lenet, resnet20; docs/performance.md); gradients equal to float32 rounding, not bit for bit, "
                              "so a run differs from one without it; dense algorithms send the same bytes "
                              "(geodml/channels_last.py)")

    def __post_init__(self) -> None:
        _check(isinstance(self.seed, int) and self.seed >= 0,
               f"--seed must be a non-negative integer, got {self.seed!r}")
        _check(isinstance(self.eval_every, int) and self.eval_every >= 1,
               f"--eval-every must be an integer >= 1, got {self.eval_every!r}")
        at = tuple(self.eval_at)
        _check(all(not isinstance(x, bool) and _finite(x) and x >= 1 and float(x) == int(x) for x in at),
               f"--eval-at takes whole step numbers >= 1, got {at!r}")
        _check(self.optim.steps is None or all(x <= self.optim.steps for x in at),
               f"--eval-at: every step must be within the run's --steps {self.optim.steps}, got {at!r}")
        self.eval_at = tuple(sorted({int(x) for x in at}))
        _check(self.partition_eval_examples is None
               or (isinstance(self.partition_eval_examples, int) and not isinstance(self.partition_eval_examples, bool)
                   and self.partition_eval_examples >= 1),
               f"--partition-eval-examples must be an integer >= 1, got {self.partition_eval_examples!r}")
        _check(isinstance(self.log_every, int) and self.log_every >= 1,
               f"--log-every must be an integer >= 1, got {self.log_every!r}")
        _check(self.backend in BACKENDS, f"--backend: choose one of {', '.join(BACKENDS)}, got {self.backend!r}")
        _check(self.device in DEVICES, f"--device: choose one of {', '.join(DEVICES)}, got {self.device!r}")
        _check(not self.channels_last or self.model.model in CONV_MODELS,
               f"--channels-last: --model {self.model.model} has no convolutions (it applies to "
               f"{', '.join(CONV_MODELS)}); leave it out")
        _check(self.processes is None or (isinstance(self.processes, int) and not isinstance(self.processes, bool)
                                          and self.processes >= 1),
               f"--processes must be a whole number >= 1, got {self.processes!r}")
        _check(isinstance(self.threads, int) and self.threads >= 1,
               f"--threads must be an integer >= 1, got {self.threads!r}")
        _check(isinstance(self.metrics_port, int) and 0 <= self.metrics_port <= 65535,
               f"--metrics-port must be a TCP port in [1, 65535] (or 0 to disable the exporter), "
               f"got {self.metrics_port!r}")
        _check(isinstance(self.metrics_host, str) and self.metrics_host.strip() != "",
               f"--metrics-host must be an address such as 127.0.0.1 or 0.0.0.0, got {self.metrics_host!r}")
        _check(self.tensorboard is None or (isinstance(self.tensorboard, str) and self.tensorboard.strip() != ""),
               f"--tensorboard takes a directory, got {self.tensorboard!r}")
        _check(_finite(self.metrics_linger_s) and self.metrics_linger_s >= 0,
               f"--metrics-linger must be >= 0 seconds, got {self.metrics_linger_s!r}")
        _check(self.partitions is None or (isinstance(self.partitions, int) and not isinstance(self.partitions, bool)
                                           and self.partitions >= 1),
               f"--partitions must be an integer >= 1, got {self.partitions!r}")
        _check(self.compression.compress == "none" or self.algo.algo in DENSE,
               f"--compress {self.compression.compress}: compresses BSP's gradients or FedAvg's upload; "
               f"--algo {self.algo.algo} has its own encoding (leave --compress out)")
        _check(not (self.compression.compress == "powersgd" and self.fedavg.client_fraction < 1),
               "--compress powersgd all-reduces its factors over every partition; it needs --client-fraction 1")
        self._check_plugin()
        _check(not self.skewscout.enabled or self.algo.algo in KNOB_ALGOS or self.plugin_knob() is not None,
               f"--skewscout tunes a communication knob; --algo {self.algo.algo} has none "
               f"(use {', '.join(KNOB_ALGOS[:-1])} or {KNOB_ALGOS[-1]}, or a plugin that declares KNOB)")
        # FedAvg's knob counts steps (Iter_Local) or examples (FedVC's N_VC): whole numbers >= 1
        _check(self.algo.algo != "fedavg" or all(v >= 1 and float(v).is_integer() for v in self.skewscout.skewscout_grid),
               f"--skewscout-grid: FedAvg's knob counts steps or examples, so its values are integers >= 1, "
               f"got {self.skewscout.skewscout_grid!r}")
        _check(not (self.skewscout.enabled and self.algo.algo == "fedavg" and self.fedavg.local_epochs > 0),
               "--skewscout tunes FedAvg's Iter_Local, which --local-epochs replaces; drop one of them")
        _check(self.fedavg.rounds is None or self.algo.algo == "fedavg" or plugin_family(self.algo.algo) == "fedavg",
               f"--rounds counts FedAvg's rounds; --algo {self.algo.algo} has none: give --steps or --epochs")
        _check(self.fedavg.rounds is None or self.optim.steps is None,
               "--rounds and --steps both set the training length; give one")
        _check(self.fedavg.rounds is None or not self.skewscout.enabled,
               "--rounds needs the rounds' lengths before the run and --skewscout changes Iter_Local during it; "
               "give --steps instead")

    def _check_plugin(self) -> None:
        """The ``plugin`` field against ``--algo``: the plugin's Config instance (its defaults when not
        given) for a plugin algorithm that declares one, None otherwise."""
        cls = plugin_config_class(self.algo.algo)
        if cls is None:
            _check(self.plugin is None, f"RunConfig.plugin holds {type(self.plugin).__name__} options, but --algo "
                   f"{self.algo.algo} takes none")
            return
        if self.plugin is None:
            self.plugin = cls()
        _check(isinstance(self.plugin, cls), f"RunConfig.plugin must be a {cls.__qualname__} (the options of --algo "
               f"{self.algo.algo}), got {type(self.plugin).__name__}")
        check = getattr(plugins.load("algo", self.algo.algo), "check_config", None)
        if check is not None:   # the plugin's checks across sections (its own options against geodml's)
            check(self)

    def fedavg_iter_local(self) -> int:
        """Iter_Local of a FedAvg-family run: ``--iter-local``, or the plugin's own (its Config's
        ``iter_local``: DiLoCo's ``--inner-steps``)."""
        return int(getattr(self.plugin, "iter_local", self.fedavg.iter_local))

    def plugin_knob(self) -> Any:
        """The KnobSpec a plugin algorithm declares (``KNOB``), or None (no plugin, or no knob)."""
        if self.algo.algo in ALGOS:
            return None
        return getattr(plugins.load("algo", self.algo.algo), "KNOB", None)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def plugin_config_class(algo: str) -> type | None:
    """The options dataclass (``Config``) of the plugin algorithm ``algo``; None for geodml's own
    algorithms and for a plugin without options. ValueError when ``Config`` is no keyword-only dataclass."""
    if algo in ALGOS or not plugins.is_plugin_name("algo", algo):   # an unknown name: AlgoConfig says so
        return None
    cls = getattr(plugins.load("algo", algo), "Config", None)
    if cls is None:
        return None
    _check(isinstance(cls, type) and dataclasses.is_dataclass(cls),
           f"--algo {algo}: its Config must be a dataclass of opt(...) fields (docs/plugins.md), got {cls!r}")
    return cls


def plugin_family(algo: str) -> str | None:
    """The geodml algorithm a plugin class extends ("fedavg", "bsp", "gaia", "dgc", "local": the ``name``
    of the nearest of geodml's algorithm classes among its bases), or None."""
    if algo in ALGOS or not plugins.is_plugin_name("algo", algo):
        return algo if algo in ALGOS else None
    for base in getattr(plugins.load("algo", algo), "__mro__", ()):
        name = base.__dict__.get("name")
        if base.__module__.startswith("geodml.algorithms.") and name in ALGOS:
            return str(name)
    return None


# ---- the options, as the command line and TOML files see them ---------------------------------

def _sections() -> dict[str, type]:
    hints = typing.get_type_hints(RunConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(RunConfig) if isinstance(hints[f.name], type)
            and dataclasses.is_dataclass(hints[f.name])}


SECTIONS = _sections()
"""RunConfig's sections, attribute name -> dataclass, in RunConfig's order (the order they are checked in)."""


def parse_floats(text: str) -> tuple[float, ...]:
    """``"64,96"`` -> ``(64.0, 96.0)``: how tuple options are written on the command line; ValueError otherwise."""
    return tuple(float(x) for x in text.replace(" ", "").split(",") if x)


def _of_kind(kind: type, v: Any) -> bool:
    """Whether the TOML value ``v`` is of the field kind ``kind`` (a boolean is no number; an integer is a float)."""
    if kind is bool or isinstance(v, bool):
        return kind is bool and isinstance(v, bool)
    return isinstance(v, kind) or (kind is float and isinstance(v, int))


_TOML_KINDS = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"), (list, "an array"),
               (dict, "a table"))
_EXPECTED = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string",
             tuple: 'an array of numbers such as [64, 96] (or a string "64,96")'}


def _toml_kind(v: Any) -> str:
    return next((name for t, name in _TOML_KINDS if isinstance(v, t)), "a date/time")


def _toml_text(v: Any) -> str:
    """``v`` as it is written in TOML."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_text(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_text(x)}" for k, x in v.items()) + "}"
    return str(v)


@dataclass(frozen=True)
class Option:
    """One RunConfig field as a command-line flag and a TOML key (built from the field's ``opt`` metadata)."""

    section: str | None
    """The RunConfig attribute holding the field's dataclass; None for a field of RunConfig itself."""
    name: str
    """The field's name in its dataclass."""
    flag: str
    """The command-line flag, e.g. ``--comm-timeout``."""
    dest: str
    """The argparse destination and TOML key (``-`` or ``_``), e.g. ``comm_timeout``; ``progress`` for --no-progress."""
    kind: type
    """bool (a switch), int, float, str, or tuple (a tuple of floats)."""
    default: Any
    help: str
    group: str
    """The --help section."""
    choices: tuple[str, ...] | None
    algos: tuple[str, ...]
    """The algorithms the option means something to; empty: all of them."""
    norms: tuple[str, ...]
    """The normalizations (--norm) the option means something to; empty: all of them."""
    metavar: str | None
    default_text: str | None
    plugin_class: type | None = None
    """A plugin algorithm's options dataclass (``section`` is then ``"plugin"``)."""

    @property
    def owner(self) -> type:
        if self.plugin_class is not None:
            return self.plugin_class
        return SECTIONS[self.section] if self.section else RunConfig

    def from_toml(self, key: str, value: Any) -> Any:
        """``value`` from a TOML file as the field takes it (arrays become tuples, "64,96" as on the command line).

        A value of the wrong TOML type is a ValueError naming ``key``, the value and the type
        expected, followed by what the field's own check says of the value, if anything.
        """
        problem = _toml_kind(value)
        if self.kind is tuple:
            if isinstance(value, str):
                try:
                    return parse_floats(value)
                except ValueError:
                    problem = "a string that is not comma-separated numbers"
            elif isinstance(value, list):
                bad = [x for x in value if not _of_kind(float, x)]
                if not bad:
                    return tuple(value)
                problem = f"an array holding {_toml_kind(bad[0])} ({_toml_text(bad[0])})"
        elif _of_kind(self.kind, value):
            return value
        verdict = self._verdict(value)
        raise ValueError(f"{key} = {_toml_text(value)} is {problem}; expected {_EXPECTED[self.kind]}"
                         + (f" ({verdict})" if verdict else ""))

    def _verdict(self, value: Any) -> str | None:
        """What the owning dataclass's check says of ``value`` (None: no objection, or it cannot judge it)."""
        try:
            self.owner(**{self.name: value})
        except ValueError as exc:
            return str(exc)
        except Exception:  # a wrong-typed value may trip a check's own arithmetic; the type error is enough
            return None
        return None


def _kind_of(hint: Any) -> type:
    """bool, int, float, str or tuple from a field's type (``X | None`` is X: TOML and flags have no None)."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    kind = typing.get_origin(hint) or hint
    assert kind in (bool, int, float, str, tuple), f"no command-line form for fields of type {hint}"
    return kind


def _fields_as_options(section: str | None, cls: type, *, group: str, algos: tuple[str, ...] = (),
                       plugin_class: type | None = None) -> list[Option]:
    """The ``opt(...)`` fields of the dataclass ``cls`` as options (fields without metadata are skipped)."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.metadata:  # RunConfig's sections and its plugin field
            continue
        m = f.metadata
        kind = _kind_of(hints[f.name])
        flag = m["flag"] or "--" + f.name.replace("_", "-")
        off_switch = kind is bool and f.default is True
        if off_switch and not flag.startswith("--no-"):
            raise ValueError(f"{flag}: a switch that turns {f.name} off is spelled --no-... (give flag=)")
        dest = (flag.removeprefix("--no-") if off_switch else flag.removeprefix("--")).replace("-", "_")
        default = f.default if f.default is not dataclasses.MISSING else None
        if m["group"]:
            help_group = m["group"]
        elif m["algos"] and plugin_class is None:   # --help groups an algorithm's own options under it
            help_group = f"{group} {'/'.join(m['algos'])}"
        else:
            help_group = group
        out.append(Option(section=section, name=f.name, flag=flag, dest=dest, kind=kind, default=default,
                          help=m["help"], group=help_group, choices=m["choices"],
                          algos=m["algos"] or algos, norms=m["norms"], metavar=m["metavar"],
                          default_text=m["default_text"], plugin_class=plugin_class))
    return out


def _options() -> tuple[Option, ...]:
    out = []
    for section, cls in [*SECTIONS.items(), (None, RunConfig)]:
        out += _fields_as_options(section, cls, group=getattr(cls, "GROUP"))
    return tuple(out)


OPTIONS: tuple[Option, ...] = _options()
"""Every option, section by section in RunConfig's order, then RunConfig's own fields."""

MOVED_FROM_ALGO: dict[str, str] = {o.name: o.section for o in OPTIONS if o.section in ALGO_SECTIONS}
"""Field name -> its section now, for the fields that the ``algo`` section held before the split (issue 66)."""


def upgrade_config(config: dict[str, Any]) -> dict[str, Any]:
    """A configuration table (config.json's ``config``, a sectioned TOML file) in today's sections: the
    fields an older run directory keeps in ``[algo]`` (``t0``, ``iter_local``, ...) move to their sections
    (``[gaia]``, ``[fedavg]``, ...). A table in today's shape is returned as it is."""
    algo = config.get("algo")
    if not isinstance(algo, dict) or not any(k in MOVED_FROM_ALGO for k in algo):
        return config
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in config.items()}
    for k in [k for k in algo if k in MOVED_FROM_ALGO]:
        out.setdefault(MOVED_FROM_ALGO[k], {})[k] = out["algo"].pop(k)
    return out


def upgrade_setting_key(key: str) -> str:
    """``"algo.t0"`` (a checkpoint fingerprint's key written before the split) -> ``"gaia.t0"``."""
    section, _, name = key.partition(".")
    return f"{MOVED_FROM_ALGO[name]}.{name}" if section == "algo" and name in MOVED_FROM_ALGO else key


def plugin_options(algo: str, cls: type) -> tuple[Option, ...]:
    """The options of the plugin algorithm ``algo`` from its ``Config`` dataclass ``cls`` (section
    ``"plugin"``, help group "algorithm ALGO"): the same ``opt(...)`` metadata as geodml's own. ValueError
    for a field without ``opt`` metadata or a flag or TOML key that one of geodml's options already has."""
    fields = dataclasses.fields(cls)
    bare = [f.name for f in fields if not f.metadata]
    _check(not bare, f"--algo {algo}: {cls.__qualname__} field(s) {', '.join(bare)} need opt(...) metadata "
           "(help text and flag; geodml.algorithm.opt)")
    try:
        options = _fields_as_options("plugin", cls, group=f"algorithm {algo}", algos=(algo,), plugin_class=cls)
    except (AssertionError, ValueError) as exc:
        raise ValueError(f"--algo {algo}: {cls.__qualname__}: {exc}") from None
    taken = {o.flag for o in OPTIONS} | {o.dest for o in OPTIONS} | {"--config", "--version", "--help", "config"}
    clash = [o.flag for o in options if o.flag in taken or o.dest in taken]
    _check(not clash, f"--algo {algo}: option(s) {', '.join(clash)} of {cls.__qualname__} are geodml's own; "
           "rename them (e.g. with a prefix such as --topk-...)")
    return tuple(options)
