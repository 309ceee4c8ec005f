"""Many partitions per process against a plain loop: ``python -m geodml.bench federation [--quick]``.

For each configuration, side by side in one invocation:

* **geodml**: ``torchrun --nproc_per_node=R -m geodml --partitions P ...`` (``--wan off``, no
  evaluation inside the run). Partition-steps per second = the partitions that compute in a step
  (FedAvg: the m = floor(C*P) sampled clients; Gaia, DGC: all P) x steps / seconds, timed from
  partition 0's metrics.jsonl between log lines (the first window, the warm-up, excluded; so
  start-up and the final evaluation are not in it). The runs give ``--divergence-loss inf``, whose
  one collective at each log line joins every partition of every process there (a run that stays
  finite is bit-identical to one without it): without it a process that hosts none of a FedAvg
  round's clients writes its lines without waiting for the clients of the other processes, and its
  windows would time nothing (P = 16, C = 0.1, R = 2 once measured 21.7x the loop).
* **plain loop** (the floor): the same network on the same data, trained with no framework in this
  process: for FedAvg, per round the m sampled clients one after another (load the global weights,
  Iter_Local momentum-SGD steps on minibatches of the client's partition, add the weighted
  result), then the average; for Gaia and DGC, P models each taking one momentum-SGD step per step,
  one after another, with no communication at all. Partition-steps per second the same way.
* **memory**: each process's peak RSS (the partitions' startup.json reports), summed over the R
  processes, minus the fixed cost of R processes, against the partitions' own state in float32:
  P x (weights + momentum), and for Gaia and DGC their accumulated updates v^k besides (Algorithm
  1's and DGC's state: 3 model-sized vectors). The fixed cost is measured with the same algorithm,
  flags and process count hosting two partitions per process (P = 2R), less those partitions' own
  state: the same engine path, scratch buffers and evaluation as the measured run. (It used to be a
  FedAvg run with P = R, one partition per process, which takes another path and scores its
  partition differently.) **The column is still not trustworthy at P <= 100**: the peak RSS of
  identical runs varies by more than the partitions' own state (FedAvg, P = 2, R = 1, 20 steps:
  709, 876 and 883 MiB in three runs; own state 0.7 MiB), so "x own" can come out negative; the
  memory target needs a measure that such noise does not swamp (large P, or the slope between two
  large P), which this benchmark does not have yet.

``--device cuda``: geodml's partitions and the plain loop train on the GPU (the partitions of a
process share its GPU), the plain loop's
clock stops after ``torch.cuda.synchronize()``, and memory is the processes' peak of
``torch.cuda.max_memory_allocated`` (GPU memory, not RSS), the fixed cost measured the same way.

Ratios: geodml / plain loop (target >= 0.95) and (peak - fixed) / own state (target <= 2). The
machine is shared and has 2 cores: quote ratios, and the load average printed with them.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from geodml.bench.common import format_table, run_geodml

BATCH = 20
ITER_LOCAL = 20
FRACTION = 0.1


@dataclass(frozen=True)
class Config:
    algo: str
    partitions: int
    processes: int
    extra: tuple[str, ...] = ()

    @property
    def norm(self) -> str:
        return "batch" if "batch" in self.extra else "none"

    @property
    def computing(self) -> int:
        """Partitions that compute in a step."""
        return max(1, math.floor(FRACTION * self.partitions + 1e-9)) if self.algo == "fedavg" else self.partitions

    def flags(self) -> tuple[str, ...]:
        """The algorithm's flags beside ``--algo``."""
        if self.algo == "fedavg":
            return ("--iter-local", str(ITER_LOCAL), "--client-fraction", str(FRACTION), *self.extra)
        if self.algo == "gaia":
            return ("--t0", "0.1", *self.extra)
        return self.extra


def _dataset() -> str:
    from geodml.data.datasets import check_dataset_available
    try:
        check_dataset_available("fashion-mnist", None)
        return "fashion-mnist"
    except ValueError:
        return "digits"


@functools.lru_cache(maxsize=None)
def _partition_eval_examples(dataset: str) -> int:
    """Test examples each partition's own final model is scored on in the benchmark's runs (at most
    1,000): Gaia's and DGC's P distinct models would otherwise take a whole test-set pass each
    (~10 min at P = 100), which the benchmark does not time. Read once per dataset."""
    from geodml.data.datasets import load_dataset
    return min(1000, len(load_dataset(dataset, None, seed=0).test_y))


def measure(cfg: Config, steps: int, workdir: Path, dataset: str, model: str, device: str = "cpu",
            env: dict[str, str] | None = None) -> tuple[float, int]:
    """(partition-steps per second, summed peak memory of the processes in bytes: RSS on the CPU,
    allocated GPU memory with ``device`` cuda) of one run; ``env`` on top of the benchmark's."""
    from geodml.comm.crossproc import process_of
    log_every = ITER_LOCAL if cfg.algo == "fedavg" else 10
    # one window more: run_geodml times the windows between log lines, and the last line, which
    # carries the final evaluation, is not one of them
    t = run_geodml(cfg.processes, cfg.algo, steps + log_every, workdir, model=model, dataset=dataset,
                   batch_size=BATCH, log_every=log_every,
                   extra=(*cfg.flags(), "--partitions", str(cfg.partitions), "--device", device,
                          "--partition-eval-examples", str(_partition_eval_examples(dataset)),
                          "--divergence-loss", "inf"),   # log lines join every process (module docstring)
                   timeout_s=3600.0, env=env)  # 10,000 clients of LeNet take ~15 min on 2 cores
    assert t.out is not None
    owner = process_of(cfg.partitions, cfg.processes)
    peak = [0] * cfg.processes
    key = "peak_cuda_bytes" if device == "cuda" else "peak_rss_bytes"
    for p in range(cfg.partitions):  # each partition reports its process's peak memory when it finishes
        rep = json.loads((t.out / f"rank{p}" / "startup.json").read_text())
        peak[owner[p]] = max(peak[owner[p]], int(rep[key]))
    return cfg.computing / t.step_s, sum(peak)


def plain_loop(cfg: Config, steps: int, dataset: str, model_name: str, device: str = "cpu") -> float:
    """Partition-steps per second of the floor (module docstring), in this process, one thread."""
    from geodml.data.datasets import load_dataset
    from geodml.models import build_model
    torch.set_num_threads(1)
    dev = torch.device(device)
    ds = load_dataset(dataset, None, seed=0)
    x_all, y_all = ds.train_x.to(dev), ds.train_y.to(dev)
    parts = [torch.from_numpy(p).to(dev)
             for p in np.array_split(np.random.default_rng(0).permutation(len(y_all)), cfg.partitions)]
    model = build_model(model_name, cfg.norm, ds.input_shape, ds.num_classes, generator_seed=0).to(dev)
    params = list(model.parameters())
    flat = torch.nn.utils.parameters_to_vector(params).detach()
    momentum = [torch.zeros_like(p) for p in params]
    loss_fn = torch.nn.CrossEntropyLoss()
    rng = np.random.default_rng(1)
    lr, mom = 0.01, 0.9

    def sgd_step(idx: torch.Tensor) -> None:
        xb, yb = x_all[idx], y_all[idx]
        for p in params:
            p.grad = None
        loss_fn(model(xb), yb).backward()
        with torch.no_grad():
            for p, u in zip(params, momentum):
                assert p.grad is not None
                u.mul_(mom).add_(p.grad, alpha=-lr)
                p.add_(u)

    def batch(k: int) -> torch.Tensor:
        n = len(parts[k])
        return parts[k][torch.from_numpy(rng.choice(n, BATCH, replace=n < BATCH)).to(dev)]

    done = 0
    t0 = time.perf_counter()
    if cfg.algo == "fedavg":
        rounds = max(1, steps // ITER_LOCAL)
        acc = torch.empty_like(flat)
        for _ in range(rounds):
            acc.zero_()
            for k in rng.choice(cfg.partitions, cfg.computing, replace=False):
                torch.nn.utils.vector_to_parameters(flat, params)
                for u in momentum:
                    u.zero_()
                for _ in range(ITER_LOCAL):
                    sgd_step(batch(k))
                acc.add_(torch.nn.utils.parameters_to_vector(params).detach())
                done += ITER_LOCAL
            flat = acc / cfg.computing
    else:
        states = [flat.clone() for _ in range(cfg.partitions)]
        for _ in range(steps):
            for k in range(cfg.partitions):
                torch.nn.utils.vector_to_parameters(states[k], params)
                sgd_step(batch(k))
                states[k] = torch.nn.utils.parameters_to_vector(params).detach()
                done += 1
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return done / (time.perf_counter() - t0)


def own_state_bytes(algo: str, model_name: str, dataset: str) -> int:
    """One partition's own state in float32: weights + momentum, and the accumulated updates v^k
    that Gaia (Algorithm 1, line 7) and DGC (momentum correction) keep besides."""
    from geodml.data.datasets import load_dataset
    from geodml.models import build_model, count_parameters
    ds = load_dataset(dataset, None, seed=0)
    vectors = 3 if algo in ("gaia", "dgc") else 2
    return vectors * 4 * count_parameters(build_model(model_name, "none", ds.input_shape, ds.num_classes,
                                                      generator_seed=0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geodml.bench federation", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="FedAvg at P = 16 and 100 only, R = 1 and 2, 60 steps")
    p.add_argument("--ps", default="16,100,1000", help="FedAvg partition counts (10000 adds --reset-momentum)")
    p.add_argument("--every-step-ps", default="16,100", help="partition counts of BSP, BSP with BatchNorm, Gaia and DGC")
    p.add_argument("--algos", default="bsp,bsp-batchnorm,gaia,dgc,fedavg", help="rows to measure")
    p.add_argument("--rs", default="1,2", help="process counts")
    p.add_argument("--steps", type=int, default=0, help="steps per run (default 100; quick 60)")
    p.add_argument("--model", default="lenet")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the partitions and the plain loop train (cuda: GPU memory instead of RSS)")
    a = p.parse_args(argv)
    ps = [16, 100] if a.quick else [int(x) for x in a.ps.split(",") if x]
    rs = [int(x) for x in a.rs.split(",") if x]
    steps = a.steps or (60 if a.quick else 100)
    if steps < 3 * ITER_LOCAL:
        raise ValueError(f"--steps must be >= {3 * ITER_LOCAL} (three FedAvg rounds: the warm-up, one timed, and the "
                         "last, whose log line carries the final evaluation)")
    dataset = _dataset()
    algos = [x for x in a.algos.split(",") if x]
    unknown = sorted(set(algos) - {"bsp", "bsp-batchnorm", "gaia", "dgc", "fedavg"})
    if unknown:
        raise ValueError(f"--algos: unknown {', '.join(unknown)} (bsp, bsp-batchnorm, gaia, dgc, fedavg)")
    every = [] if a.quick else [int(x) for x in a.every_step_ps.split(",") if x]
    configs = [Config("fedavg", P, R, ("--reset-momentum",) if P >= 10000 else ()) for P in ps for R in rs
               if R <= P and "fedavg" in algos]
    if a.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda needs CUDA, but torch.cuda.is_available() is False")
    for name in algos:
        if name != "fedavg":
            algo, extra = ("bsp", ("--norm", "batch")) if name == "bsp-batchnorm" else (name, ())
            configs += [Config(algo, P, R, extra) for P in every for R in rs if R <= P]
    own = {algo: own_state_bytes(algo, a.model, dataset) for algo in {c.algo for c in configs}}
    rows = []
    fixed: dict[tuple[str, tuple[str, ...], int], int] = {}
    with tempfile.TemporaryDirectory(prefix="geodml-bench-") as tmp:
        for cfg in configs:
            # the fixed cost of R processes: the same run hosting two partitions per process, less their state
            key = (cfg.algo, cfg.extra, cfg.processes)
            if key not in fixed:
                small = Config(cfg.algo, 2 * cfg.processes, cfg.processes, cfg.extra)
                fixed[key] = measure(small, steps, Path(tmp), dataset, a.model, a.device)[1] \
                    - small.partitions * own[cfg.algo]
            load = os.getloadavg()[0]
            rate, peak = measure(cfg, steps, Path(tmp), dataset, a.model, a.device)
            floor = plain_loop(cfg, steps, dataset, a.model, a.device)
            state = cfg.partitions * own[cfg.algo]
            rows.append([" ".join([cfg.algo, *(f.lstrip("-") for f in cfg.extra)]), cfg.partitions, cfg.processes, rate, floor,
                         rate / floor, peak / 2**20, fixed[key] / 2**20, state / 2**20,
                         (peak - fixed[key]) / state, load])
            print(format_table(["algo", "P", "R", "geodml ps/s", "loop ps/s", "x loop", "peak MiB", "fixed MiB",
                                "own MiB", "x own", "load"], rows[-1:]), flush=True)
    print()
    print(format_table(["algo", "P", "R", "geodml ps/s", "loop ps/s", "x loop", "peak MiB", "fixed MiB", "own MiB",
                        "x own", "load"], rows,
                       title=f"federation ({a.device}): {a.model} on {dataset}, batch {BATCH}, FedAvg Iter_Local "
                             f"{ITER_LOCAL} client fraction {FRACTION}, {steps} steps, --wan off; "
                             "ps/s = partition-steps per second; targets: x loop >= 0.95, x own <= 2"))
    return 0
