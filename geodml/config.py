"""Run configuration: one keyword-only dataclass per component, checked in ``__post_init__``.

The CLI only maps flags onto these classes (DESIGN.md style rule 3). Every check raises
``ValueError`` whose message names the command-line flag, so the CLI can print it once and
exit with code 2 before any process group exists.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

DATASETS = ("digits", "fashion-mnist", "mnist", "cifar10")
PARTITIONS = ("iid", "label", "dirichlet", "shards")
MODELS = ("lenet", "resnet20", "logreg", "mlp")
NORMS = ("none", "batch", "group")
MODEL_NORMS = {"lenet": ("none", "batch", "group"), "resnet20": ("batch", "group"), "logreg": ("none",), "mlp": ("none",)}
ALGOS = ("bsp", "gaia", "dgc", "fedavg", "local")
BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")
WAN_MODES = ("off", "virtual", "real")
LR_SCHEDULES = ("step", "poly")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


@dataclass(kw_only=True)
class DataConfig:
    """What data each partition trains on and how it is split."""

    dataset: str = "digits"
    """Dataset name: digits (embedded), fashion-mnist, mnist, cifar10."""
    data_dir: str | None = None
    """Directory with the dataset files (fashion-mnist defaults to the Debian package's)."""
    partition: str = "iid"
    """Partitioner: iid, label (Quagmire x% non-IID), dirichlet (Hsu et al.), shards (McMahan)."""
    skew: float = 1.0
    """For --partition label: fraction of the data partitioned by label (1.0 = 100% non-IID)."""
    alpha: float = 0.5
    """For --partition dirichlet: concentration alpha of Dir(alpha * p)."""
    shards_per_partition: int = 2
    """For --partition shards: shards of sorted labels per partition (McMahan et al.: 2)."""
    cache: str = "auto"
    """Decoded-dataset cache shared by the ranks: auto ($GEODML_DATA_CACHE or ~/.cache/geodml/datasets), off, or a directory."""

    def __post_init__(self) -> None:
        _check(isinstance(self.cache, str) and self.cache.strip() != "",
               f"--data-cache must be auto, off or a directory, got {self.cache!r}")
        _check(self.dataset in DATASETS, f"--dataset: unknown dataset {self.dataset!r}; choose one of {', '.join(DATASETS)}")
        _check(self.partition in PARTITIONS, f"--partition: unknown partitioner {self.partition!r}; choose one of {', '.join(PARTITIONS)}")
        _check(_finite(self.skew) and 0.0 <= self.skew <= 1.0, f"--skew must be a fraction in [0, 1], got {self.skew!r}")
        _check(_finite(self.alpha) and self.alpha > 0, f"--alpha must be > 0, got {self.alpha!r}")
        _check(isinstance(self.shards_per_partition, int) and self.shards_per_partition >= 1,
               f"--shards-per-partition must be an integer >= 1, got {self.shards_per_partition!r}")


@dataclass(kw_only=True)
class ModelConfig:
    """Which network every partition trains."""

    model: str = "lenet"
    """Architecture: lenet (the paper's CIFAR LeNet), resnet20, logreg, mlp."""
    norm: str = "none"
    """Normalization layers: none, batch (BN-LeNet), group (GN-LeNet, group size 2)."""

    def __post_init__(self) -> None:
        _check(self.model in MODELS, f"--model: unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        _check(self.norm in NORMS, f"--norm: unknown normalization {self.norm!r}; choose one of {', '.join(NORMS)}")
        allowed = MODEL_NORMS[self.model]
        _check(self.norm in allowed, f"--norm {self.norm} is not available for --model {self.model}; use --norm {' or --norm '.join(allowed)}")


@dataclass(kw_only=True)
class OptimConfig:
    """Local momentum SGD and its learning-rate schedule (Quagmire Appendix C)."""

    epochs: float = 30.0
    """Training length in epochs (an epoch = total training set / (K * batch size) steps)."""
    steps: int | None = None
    """Training length in steps; overrides --epochs when given."""
    batch_size: int = 20
    """Minibatch size per partition (the paper: 20)."""
    lr: float = 0.02
    """Initial learning rate eta_0."""
    lr_schedule: str = "step"
    """step: divide by 10 at each milestone epoch; poly: eta_0 * (1 - step/max_steps) ** power."""
    lr_milestones: tuple[float, ...] = ()
    """Epochs at which the step schedule divides the learning rate by 10 (paper: 64, 96 of 128)."""
    poly_power: float = 1.0
    """Power of the polynomial decay schedule."""
    momentum: float = 0.9
    """Momentum m of vanilla momentum SGD."""
    weight_decay: float = 0.0005
    """L2 weight decay added to the gradient."""

    def __post_init__(self) -> None:
        _check(_finite(self.epochs) and self.epochs > 0, f"--epochs must be > 0, got {self.epochs!r}")
        _check(self.steps is None or (isinstance(self.steps, int) and self.steps >= 1), f"--steps must be an integer >= 1, got {self.steps!r}")
        _check(isinstance(self.batch_size, int) and self.batch_size >= 1, f"--batch-size must be an integer >= 1, got {self.batch_size!r}")
        _check(_finite(self.lr) and self.lr > 0, f"--lr must be > 0, got {self.lr!r}")
        _check(self.lr_schedule in LR_SCHEDULES, f"--lr-schedule: choose one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        ms = tuple(self.lr_milestones)
        _check(all(_finite(m) and m > 0 for m in ms), f"--lr-milestones must be positive epochs, got {ms!r}")
        _check(list(ms) == sorted(set(ms)), f"--lr-milestones must be strictly increasing, got {ms!r}")
        self.lr_milestones = ms
        _check(_finite(self.poly_power) and self.poly_power > 0, f"--poly-power must be > 0, got {self.poly_power!r}")
        _check(_finite(self.momentum) and 0.0 <= self.momentum < 1.0, f"--momentum must be in [0, 1), got {self.momentum!r}")
        _check(_finite(self.weight_decay) and self.weight_decay >= 0, f"--weight-decay must be >= 0, got {self.weight_decay!r}")


@dataclass(kw_only=True)
class AlgoConfig:
    """Which decentralized learning algorithm runs and its hyper-parameters (Quagmire Appendix A)."""

    algo: str = "bsp"
    """bsp, gaia, dgc, fedavg, or local (no communication: each partition trains alone)."""
    # Gaia (Algorithm 1)
    t0: float = 0.1
    """Gaia: initial significance threshold T0 (0.1 = 10%); T_t = T0 * lr_t / lr_0."""
    # DeepGradientCompression (Algorithm 3)
    sparsity: float = 0.999
    """DGC: final update sparsity s (0.999 = send the top 0.1%)."""
    e_warm: float = 4.0
    """DGC: epochs per sparsity warm-up stage (75%, 93.75%, 98.4375%, 99.6%, then --sparsity); 0 disables warm-up."""
    clip_norm: float | None = None
    """DGC: global L2 gradient-clipping threshold; each partition clips its own gradient at clip_norm/sqrt(K) (Lin et al.); None: off."""
    dgc_sample_ratio: float = 0.01
    """DGC: fraction of elements sampled to estimate the top-s threshold."""
    # FederatedAveraging (Algorithm 2) and variants
    iter_local: int = 20
    """FedAvg: local iterations between model averages (Iter_Local)."""
    reset_momentum: bool = False
    """FedAvg: reset the local momentum buffer every round (Algorithm 2 keeps it)."""
    client_fraction: float = 1.0
    """FedAvg: fraction of partitions selected each round (seeded, identical on every rank)."""
    server_momentum: float = 0.0
    """FedAvgM (Hsu et al. 2019): server momentum beta (0 = plain FedAvg)."""
    server_lr: float = 1.0
    """FedAvgM: server learning rate."""
    server_nesterov: bool = False
    """FedAvgM: Nesterov server momentum."""
    prox_mu: float = 0.0
    """FedProx (Li et al. 2020): proximal term weight mu (0 = off)."""
    fedir: bool = False
    """FedIR (Hsu et al. 2020): importance weights p(y)/q_k(y) on each partition's loss."""
    virtual_client_size: int = 0
    """FedVC (Hsu et al. 2020): examples per selected partition per round (0 = off)."""
    iwds: tuple[float, ...] | None = None
    """IWDS: (beta0, beta_m, rho) of the per-sample weight schedule (None = off)."""

    def __post_init__(self) -> None:
        _check(self.algo in ALGOS, f"--algo: unknown algorithm {self.algo!r}; choose one of {', '.join(ALGOS)}")
        _check(_finite(self.t0) and self.t0 >= 0, f"--t0 must be >= 0 (a fraction, 0.1 = 10%), got {self.t0!r}")
        _check(_finite(self.sparsity) and 0.0 <= self.sparsity < 1.0, f"--sparsity must be in [0, 1), got {self.sparsity!r}")
        _check(_finite(self.e_warm) and self.e_warm >= 0, f"--e-warm must be >= 0 epochs, got {self.e_warm!r}")
        _check(self.clip_norm is None or (_finite(self.clip_norm) and self.clip_norm > 0),
               f"--clip-norm must be > 0, got {self.clip_norm!r}")
        _check(_finite(self.dgc_sample_ratio) and 0 < self.dgc_sample_ratio <= 1,
               f"--dgc-sample-ratio must be in (0, 1], got {self.dgc_sample_ratio!r}")
        _check(isinstance(self.iter_local, int) and self.iter_local >= 1, f"--iter-local must be an integer >= 1, got {self.iter_local!r}")
        _check(_finite(self.client_fraction) and 0 < self.client_fraction <= 1,
               f"--client-fraction must be in (0, 1], got {self.client_fraction!r}")
        _check(_finite(self.server_momentum) and 0 <= self.server_momentum < 1,
               f"--server-momentum must be in [0, 1), got {self.server_momentum!r}")
        _check(_finite(self.server_lr) and self.server_lr > 0, f"--server-lr must be > 0, got {self.server_lr!r}")
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


SEARCHES = ("hill", "stochastic", "annealing")


@dataclass(kw_only=True)
class SkewScoutConfig:
    """SkewScout (Quagmire §7): model traveling and communication control."""

    enabled: bool = False
    """Run SkewScout (needs an algorithm with a knob: gaia, fedavg, dgc)."""
    travel_every: int = 500
    """Travel models and decide every this many steps (the paper: 500 minibatches)."""
    travel_samples: int = 100
    """Training examples the host evaluates a visiting model on (small on purpose, §7.2)."""
    lambda_al: float = 50.0
    """Equation 1 weight of the accuracy-loss penalty (paper: 50)."""
    lambda_c: float = 1.0
    """Equation 1 weight of communication (paper: 1)."""
    sigma_al: float = 0.05
    """Tolerated accuracy loss (paper: 5%)."""
    search: str = "hill"
    """hill, stochastic (hill climbing) or annealing (simulated annealing)."""

    def __post_init__(self) -> None:
        _check(isinstance(self.travel_every, int) and self.travel_every >= 1, f"--travel-every must be an integer >= 1, got {self.travel_every!r}")
        _check(isinstance(self.travel_samples, int) and self.travel_samples >= 1, f"--travel-samples must be an integer >= 1, got {self.travel_samples!r}")
        _check(_finite(self.lambda_al) and self.lambda_al >= 0, f"--lambda-al must be >= 0, got {self.lambda_al!r}")
        _check(_finite(self.lambda_c) and self.lambda_c >= 0, f"--lambda-c must be >= 0, got {self.lambda_c!r}")
        _check(_finite(self.sigma_al) and 0 <= self.sigma_al <= 1, f"--sigma-al must be in [0, 1], got {self.sigma_al!r}")
        _check(self.search in SEARCHES, f"--skewscout-search: choose one of {', '.join(SEARCHES)}, got {self.search!r}")


@dataclass(kw_only=True)
class CommConfig:
    """Emulated WAN and peer transport."""

    topology: str | None = None
    """Topology name (a file in topologies/) or path; None: one region per rank, joined by an illustrative 100 Mbit/s, 50 ms WAN."""
    wan: str = "virtual"
    """off: count bytes; virtual: also advance an emulated clock; real: pace sends in wall time."""
    wan_scale: float = 1.0
    """Multiply every link bandwidth by this factor (run a slow WAN faster); reported."""
    bind_host: str | None = None
    """Address the ZeroMQ socket binds and advertises; default: this node's address towards MASTER_ADDR (127.0.0.1 on one machine); * or 0.0.0.0 binds all interfaces."""
    timeout_s: float = 60.0
    """How long any wait on a peer may take before the run fails naming that peer."""
    wire_auth: str = "on"
    """on: every ZeroMQ message carries a MAC under a per-run secret (docs/reliability.md); off: no MAC (trusted networks)."""
    max_message_mb: float = 512.0
    """Largest ZeroMQ message (MiB) a rank sends or accepts; larger incoming ones are dropped and counted."""

    def __post_init__(self) -> None:
        _check(self.wan in WAN_MODES, f"--wan: choose one of {', '.join(WAN_MODES)}, got {self.wan!r}")
        _check(self.wire_auth in ("on", "off"), f"--wire-auth: choose on or off, got {self.wire_auth!r}")
        _check(_finite(self.max_message_mb) and 1 / 1024 <= self.max_message_mb <= 1 << 20,
               f"--max-message-mb must be between 0.001 (1 KiB) and 1048576 MiB, got {self.max_message_mb!r}")
        _check(_finite(self.wan_scale) and self.wan_scale > 0, f"--wan-scale must be > 0, got {self.wan_scale!r}")
        _check(_finite(self.timeout_s) and self.timeout_s > 0, f"--comm-timeout must be > 0 seconds, got {self.timeout_s!r}")


@dataclass(kw_only=True)
class ReliabilityConfig:
    """Checkpoints, resume and peer-failure detection (docs/reliability.md)."""

    checkpoint_every: int = 0
    """Write every rank's full state to <out>/rank<k>/ckpt-<step>.pt every this many steps (0: never)."""
    resume: bool = False
    """Continue from the newest step every rank has a checkpoint of (start fresh when there is none);
    implied under torchrun after a restart (TORCHELASTIC_RESTART_COUNT > 0)."""
    peer_timeout_s: float = 30.0
    """A rank whose heartbeat (through the torch.distributed store) stops this long is declared lost:
    every other rank exits non-zero naming it."""

    def __post_init__(self) -> None:
        _check(isinstance(self.checkpoint_every, int) and not isinstance(self.checkpoint_every, bool)
               and self.checkpoint_every >= 0,
               f"--checkpoint-every must be an integer >= 0 steps (0 = no checkpoints), got {self.checkpoint_every!r}")
        _check(isinstance(self.resume, bool), f"--resume is a switch (true/false), got {self.resume!r}")
        _check(_finite(self.peer_timeout_s) and self.peer_timeout_s > 0,
               f"--peer-timeout-s must be > 0 seconds, got {self.peer_timeout_s!r}")


@dataclass(kw_only=True)
class RunConfig:
    """Everything one run needs; identical on every rank."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    skewscout: SkewScoutConfig = field(default_factory=SkewScoutConfig)
    reliability: ReliabilityConfig = field(default_factory=ReliabilityConfig)
    seed: int = 0
    """Seed of every generator (partitioning, init, minibatch order)."""
    eval_every: int = 100
    """Validate the global model on the whole test set every this many steps (and at the end)."""
    out: str | None = None
    """Run directory; default runs/<timestamp>-<algo>."""
    backend: str = "auto"
    """torch.distributed backend: auto (nccl if CUDA is available, else gloo), gloo, nccl."""
    device: str = "auto"
    """Where each rank trains: auto (the GPU with nccl, else the CPU), cpu, or cuda (with gloo: ranks share the GPUs)."""
    threads: int = 1
    """torch intra-op threads per rank (1: two threads per rank collapse under contention)."""
    log_every: int = 10
    """Write a metrics.jsonl line (averaged over partitions) every this many steps."""
    progress: bool = True
    """Rank 0 prints live progress."""
    metrics_port: int = 0
    """Prometheus exporter of every rank on port metrics_port + local rank (0: no exporter)."""
    metrics_host: str = "127.0.0.1"
    """Address the exporters listen on (loopback by default; 0.0.0.0 to be scraped from other hosts)."""
    metrics_linger_s: float = 10.0
    """Seconds the exporters stay up after the run so Prometheus scrapes the final values (with --metrics-port)."""

    def __post_init__(self) -> None:
        _check(isinstance(self.seed, int) and self.seed >= 0, f"--seed must be a non-negative integer, got {self.seed!r}")
        _check(isinstance(self.eval_every, int) and self.eval_every >= 1, f"--eval-every must be an integer >= 1, got {self.eval_every!r}")
        _check(isinstance(self.log_every, int) and self.log_every >= 1, f"--log-every must be an integer >= 1, got {self.log_every!r}")
        _check(self.backend in BACKENDS, f"--backend: choose one of {', '.join(BACKENDS)}, got {self.backend!r}")
        _check(self.device in DEVICES, f"--device: choose one of {', '.join(DEVICES)}, got {self.device!r}")
        _check(isinstance(self.threads, int) and self.threads >= 1, f"--threads must be an integer >= 1, got {self.threads!r}")
        _check(isinstance(self.metrics_port, int) and 0 <= self.metrics_port <= 65535,
               f"--metrics-port must be a TCP port in [1, 65535] (or 0 to disable the exporter), got {self.metrics_port!r}")
        _check(isinstance(self.metrics_host, str) and self.metrics_host.strip() != "",
               f"--metrics-host must be an address such as 127.0.0.1 or 0.0.0.0, got {self.metrics_host!r}")
        _check(_finite(self.metrics_linger_s) and self.metrics_linger_s >= 0,
               f"--metrics-linger must be >= 0 seconds, got {self.metrics_linger_s!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
