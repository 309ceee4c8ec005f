"""Command line: flags (and an optional TOML file of defaults) -> RunConfig -> run.

Thin on purpose (DESIGN.md style rule 10): parse, validate everything that can be validated
before a process group exists, then hand over to geodml.run. Bad input prints one message
(on rank 0 only, so torchrun's K processes don't repeat it) and exits with code 2 on every
rank.
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from pathlib import Path

from geodml import __version__
from geodml.config import (ALGOS, BACKENDS, DEVICES, DATASETS, LR_SCHEDULES, MODELS, NORMS, PARTITIONS, SEARCHES, WAN_MODES,
                           AlgoConfig, CommConfig, DataConfig, ModelConfig, OptimConfig, ReliabilityConfig, RunConfig,
                           SkewScoutConfig)


class UsageError(ValueError):
    """Bad command-line input; the message is shown as-is."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print and exit on every rank
        raise UsageError(message)


def _float_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers like 64,96, got {text!r}") from None


# flag dest -> (RunConfig section or None for top level, field name)
FIELD_OF: dict[str, tuple[str | None, str]] = {
    "dataset": ("data", "dataset"), "data_dir": ("data", "data_dir"), "partition": ("data", "partition"),
    "skew": ("data", "skew"), "alpha": ("data", "alpha"), "shards_per_partition": ("data", "shards_per_partition"),
    "data_cache": ("data", "cache"),
    "model": ("model", "model"), "norm": ("model", "norm"),
    "epochs": ("optim", "epochs"), "steps": ("optim", "steps"), "batch_size": ("optim", "batch_size"), "lr": ("optim", "lr"),
    "lr_schedule": ("optim", "lr_schedule"), "lr_milestones": ("optim", "lr_milestones"),
    "poly_power": ("optim", "poly_power"), "momentum": ("optim", "momentum"), "weight_decay": ("optim", "weight_decay"),
    "algo": ("algo", "algo"), "t0": ("algo", "t0"), "sparsity": ("algo", "sparsity"), "e_warm": ("algo", "e_warm"),
    "clip_norm": ("algo", "clip_norm"), "dgc_sample_ratio": ("algo", "dgc_sample_ratio"),
    "iter_local": ("algo", "iter_local"), "reset_momentum": ("algo", "reset_momentum"),
    "client_fraction": ("algo", "client_fraction"), "server_momentum": ("algo", "server_momentum"),
    "server_lr": ("algo", "server_lr"), "server_nesterov": ("algo", "server_nesterov"), "prox_mu": ("algo", "prox_mu"),
    "fedir": ("algo", "fedir"), "virtual_client_size": ("algo", "virtual_client_size"), "iwds": ("algo", "iwds"),
    "topology": ("comm", "topology"), "wan": ("comm", "wan"), "wan_scale": ("comm", "wan_scale"),
    "bind_host": ("comm", "bind_host"), "comm_timeout": ("comm", "timeout_s"),
    "wire_auth": ("comm", "wire_auth"), "max_message_mb": ("comm", "max_message_mb"),
    "skewscout": ("skewscout", "enabled"), "travel_every": ("skewscout", "travel_every"),
    "travel_samples": ("skewscout", "travel_samples"), "lambda_al": ("skewscout", "lambda_al"),
    "lambda_c": ("skewscout", "lambda_c"), "sigma_al": ("skewscout", "sigma_al"), "skewscout_search": ("skewscout", "search"),
    "seed": (None, "seed"), "eval_every": (None, "eval_every"), "log_every": (None, "log_every"), "out": (None, "out"),
    "backend": (None, "backend"), "device": (None, "device"), "threads": (None, "threads"), "progress": (None, "progress"),
    "metrics_port": (None, "metrics_port"), "metrics_host": (None, "metrics_host"),
    "metrics_linger": (None, "metrics_linger_s"),
    "checkpoint_every": ("reliability", "checkpoint_every"), "resume": ("reliability", "resume"),
    "peer_timeout_s": ("reliability", "peer_timeout_s"),
}
SECTIONS = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "algo": AlgoConfig, "comm": CommConfig,
            "skewscout": SkewScoutConfig, "reliability": ReliabilityConfig}


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="geodml", description="Emulate decentralized, geo-distributed training over non-IID data. "
                "Run one process per data partition: torchrun --nproc_per_node=K -m geodml [flags].",
                formatter_class=argparse.ArgumentDefaultsHelpFormatter, argument_default=argparse.SUPPRESS)
    p.add_argument("--version", action="version", version=f"geodml {__version__}")
    p.add_argument("--config", metavar="FILE.toml", help="TOML file of flag defaults (keys are flag names); flags override it")
    g = p.add_argument_group("algorithm")
    g.add_argument("--algo", choices=ALGOS, help="decentralized learning algorithm (default bsp)")
    g.add_argument("--t0", type=float, help="gaia: initial significance threshold, 0.1 = 10%% (default 0.1)")
    g.add_argument("--sparsity", type=float, help="dgc: final update sparsity (default 0.999)")
    g.add_argument("--e-warm", type=float, help="dgc: epochs per sparsity warm-up stage (default 4)")
    g.add_argument("--clip-norm", type=float, help="dgc: local gradient clipping L2 threshold (default off)")
    g.add_argument("--dgc-sample-ratio", type=float, help="dgc: sampled fraction for the threshold estimate (default 0.01)")
    g.add_argument("--iter-local", type=int, help="fedavg: local iterations per round (default 20)")
    g.add_argument("--reset-momentum", action="store_true", help="fedavg: reset local momentum every round")
    g.add_argument("--client-fraction", type=float, help="fedavg: fraction of partitions per round (default 1.0)")
    g.add_argument("--server-momentum", type=float, help="fedavg: FedAvgM server momentum beta (default 0)")
    g.add_argument("--server-lr", type=float, help="fedavg: FedAvgM server learning rate (default 1)")
    g.add_argument("--server-nesterov", action="store_true", help="fedavg: Nesterov server momentum")
    g.add_argument("--prox-mu", type=float, help="fedavg: FedProx proximal weight mu (default 0)")
    g.add_argument("--fedir", action="store_true", help="fedavg: FedIR importance reweighting")
    g.add_argument("--virtual-client-size", type=int, help="fedavg: FedVC examples per client per round (default off)")
    g.add_argument("--iwds", type=_float_list, help="fedavg: IWDS schedule beta0,beta_m,rho (default off)")
    g = p.add_argument_group("SkewScout (Quagmire section 7)")
    g.add_argument("--skewscout", action="store_true", help="travel models and tune the algorithm's knob (gaia/fedavg/dgc)")
    g.add_argument("--travel-every", type=int, help="steps between model travels/decisions (default 500)")
    g.add_argument("--travel-samples", type=int, help="examples a host evaluates a visiting model on (default 100)")
    g.add_argument("--lambda-al", type=float, help="Eq. 1 accuracy-loss weight (default 50)")
    g.add_argument("--lambda-c", type=float, help="Eq. 1 communication weight (default 1)")
    g.add_argument("--sigma-al", type=float, help="tolerated accuracy loss (default 0.05)")
    g.add_argument("--skewscout-search", choices=SEARCHES, help="hill, stochastic or annealing (default hill)")
    g = p.add_argument_group("data")
    g.add_argument("--dataset", choices=DATASETS, help="dataset (default digits, embedded)")
    g.add_argument("--data-dir", help="dataset directory (fashion-mnist default: /usr/share/datasets/fashion-mnist)")
    g.add_argument("--partition", choices=PARTITIONS, help="partitioner (default iid)")
    g.add_argument("--skew", type=float, help="--partition label: fraction partitioned by label (default 1.0)")
    g.add_argument("--alpha", type=float, help="--partition dirichlet: concentration (default 0.5)")
    g.add_argument("--shards-per-partition", type=int, help="--partition shards: shards per partition (default 2)")
    g.add_argument("--data-cache", metavar="DIR", help="decoded dataset shared by the ranks (decode once, map K times): "
                   "auto ($GEODML_DATA_CACHE or ~/.cache/geodml/datasets), off, or DIR (default auto)")
    g = p.add_argument_group("model")
    g.add_argument("--model", choices=MODELS, help="network (default lenet)")
    g.add_argument("--norm", choices=NORMS, help="normalization: none, batch (BN), group (GN, group size 2) (default none)")
    g = p.add_argument_group("optimization")
    g.add_argument("--epochs", type=float, help="epochs (default 30)")
    g.add_argument("--steps", type=int, help="training length in steps; overrides --epochs")
    g.add_argument("--batch-size", type=int, help="minibatch size per partition (default 20)")
    g.add_argument("--lr", type=float, help="initial learning rate (default 0.02)")
    g.add_argument("--lr-schedule", choices=LR_SCHEDULES, help="step (divide by 10 at milestones) or poly (default step)")
    g.add_argument("--lr-milestones", type=_float_list, help="epochs at which lr is divided by 10, e.g. 64,96")
    g.add_argument("--poly-power", type=float, help="power of the poly schedule (default 1)")
    g.add_argument("--momentum", type=float, help="momentum (default 0.9)")
    g.add_argument("--weight-decay", type=float, help="L2 weight decay (default 0.0005)")
    g = p.add_argument_group("WAN and communication")
    g.add_argument("--topology", help="topology name (topologies/NAME.toml) or path; default: one region per rank")
    g.add_argument("--wan", choices=WAN_MODES, help="off: count bytes; virtual: emulated clock; real: paced wall time (default virtual)")
    g.add_argument("--wan-scale", type=float, help="multiply every link bandwidth (default 1)")
    g.add_argument("--bind-host", help="address for this node's ZeroMQ socket (default: loopback single-node, hostname multi-node)")
    g.add_argument("--comm-timeout", type=float, help="seconds to wait for a peer before failing (default 60)")
    g.add_argument("--wire-auth", choices=("on", "off"), help="authenticate every ZeroMQ message with the run's secret (default on)")
    g.add_argument("--max-message-mb", type=float, help="largest ZeroMQ message a rank sends or accepts, MiB (default 512)")
    g = p.add_argument_group("run")
    g.add_argument("--seed", type=int, help="seed of every generator (default 0)")
    g.add_argument("--eval-every", type=int, help="validate the global model every N steps (default 100)")
    g.add_argument("--log-every", type=int, help="write a metrics line every N steps (default 10)")
    g.add_argument("--out", help="run directory (default runs/<timestamp>-<algo>)")
    g.add_argument("--backend", choices=BACKENDS, help="torch.distributed backend (default auto: nccl with CUDA, else gloo)")
    g.add_argument("--device", choices=DEVICES, help="where ranks train (default auto: each rank's GPU with nccl, else "
                   "the CPU); cuda with --backend gloo lets several ranks share a GPU")
    g.add_argument("--threads", type=int, help="torch threads per rank (default 1)")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no live progress line")
    g = p.add_argument_group("metrics")
    g.add_argument("--metrics-port", type=int, metavar="BASE", help="Prometheus exporter on every rank at port BASE + local rank; "
                   "writes <out>/prometheus_targets.json (default 0: off)")
    g.add_argument("--metrics-host", metavar="HOST", help="address the exporters listen on (default 127.0.0.1; 0.0.0.0 for other hosts)")
    g.add_argument("--metrics-linger", type=float, metavar="S", help="seconds the exporters stay up after the run (default 10)")
    g = p.add_argument_group("reliability (docs/reliability.md)")
    g.add_argument("--checkpoint-every", type=int, metavar="N", help="write every rank's full state to "
                   "<out>/rank<k>/ckpt-<step>.pt every N steps (default 0: never)")
    g.add_argument("--resume", action="store_true", help="continue from the newest step every rank has a checkpoint "
                   "of in --out (fresh start when none; implied after a torchrun --max-restarts restart)")
    g.add_argument("--peer-timeout-s", type=float, metavar="S", help="a rank silent this long is declared lost and "
                   "every other rank exits non-zero naming it (default 30)")
    return p


def _load_toml(path: str, parser: argparse.ArgumentParser) -> dict:
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"--config: file not found: {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config: {path} is not valid TOML: {exc}") from None
    out = {}
    for key, value in raw.items():
        dest = key.replace("-", "_")
        if dest not in FIELD_OF:
            raise UsageError(f"--config: {path}: unknown key {key!r} (keys are flag names such as lr, algo, lr-milestones)")
        if dest in ("lr_milestones", "iwds") and isinstance(value, list):
            value = tuple(value)
        out[dest] = value
    return out


# flags that only mean something for some algorithms (DESIGN.md style rule 4: warn when a setting does nothing)
ALGO_ONLY = {"t0": ("gaia",), "sparsity": ("dgc",), "e_warm": ("dgc",), "clip_norm": ("dgc",), "dgc_sample_ratio": ("dgc",),
             "iter_local": ("fedavg",), "reset_momentum": ("fedavg",), "client_fraction": ("fedavg",),
             "server_momentum": ("fedavg",), "server_lr": ("fedavg",), "server_nesterov": ("fedavg",),
             "prox_mu": ("fedavg",), "fedir": ("fedavg",), "virtual_client_size": ("fedavg",), "iwds": ("fedavg",)}


def ignored_settings(values: dict, algo: str) -> list[str]:
    """Flags given that have no effect with ``algo`` (to warn about, not to fail)."""
    return [f"--{d.replace('_', '-')}" for d in values if d in ALGO_ONLY and algo not in ALGO_ONLY[d]]


def parse_config(argv: list[str] | None = None, *, warn=None) -> RunConfig:
    """Flags (over TOML defaults) -> validated RunConfig. Raises ValueError on bad input."""
    parser = build_parser()
    ns = vars(parser.parse_args(argv))
    values = _load_toml(ns.pop("config"), parser) if "config" in ns else {}
    values.update(ns)
    ignored = ignored_settings(values, values.get("algo", "bsp"))
    if ignored and warn is not None:
        warn(f"geodml: warning: {', '.join(ignored)} has no effect with --algo {values.get('algo', 'bsp')}")
    kwargs: dict[str, dict] = {name: {} for name in SECTIONS}
    top: dict = {}
    for dest, value in values.items():
        section, fld = FIELD_OF[dest]
        (kwargs[section] if section else top)[fld] = value
    try:
        sections = {name: cls(**kwargs[name]) for name, cls in SECTIONS.items()}
        return RunConfig(**sections, **top)
    except TypeError as exc:  # wrong value type from a TOML file
        raise UsageError(f"--config: a value has the wrong type: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    from geodml.runtime import Env
    is_rank0 = os.environ.get("RANK", "0") == "0"
    try:
        env = Env.from_environ()
        cfg = parse_config(argv, warn=(lambda m: print(m, file=sys.stderr)) if is_rank0 else None)
        from geodml.run import check_before_start
        check_before_start(cfg, env)
    except ValueError as exc:
        if is_rank0:
            print(f"geodml: error: {exc}", file=sys.stderr)
            print("run 'python -m geodml --help' for the flags", file=sys.stderr)
        return 2
    from geodml.run import run
    run(cfg, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
