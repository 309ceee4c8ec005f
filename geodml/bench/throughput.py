"""Training throughput of K geodml ranks against K plain PyTorch processes doing the same compute:
``python -m geodml.bench throughput [--quick] [--models cnn,resnet20] [--algos ...]``.

For each model (the CNN and ResNet-20 on CIFAR-10-shaped data, batch 20, K = 5, one thread per
rank) the benchmark runs, one after the other in this invocation:

* ``plain``: K processes under torchrun running forward, cross-entropy, backward and
  ``torch.optim.SGD(momentum=0.9)`` on random batches, with no communication at all between
  the two barriers that bracket the timed steps (the machine's peak for this compute);
* ``local``: geodml with ``--algo local`` (the framework's own per-step cost, no exchange);
* each algorithm (bsp, gaia, dgc, fedavg) with ``--wan off``;
* ``plain`` again, so the drift of the baseline over the invocation is visible.

Combined images/s = K * batch / (seconds per step on rank 0); the ratio is against the mean of
the two plain runs. ``--device cuda`` puts every rank (plain and geodml) on the GPU(s): with
fewer GPUs than K the ranks share them (geodml with ``--backend auto --device cuda``: NCCL when
each rank has its own GPU, else gloo with host-staged collectives). Targets (issue 12): BSP and FedAvg >= 0.9x,
Gaia and DGC >= 0.8x.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from geodml.bench.common import TIMEOUT_S, bench_env, format_table, run_geodml, torchrun_cmd, write_synthetic_cifar

TARGETS = {"bsp": 0.9, "fedavg": 0.9, "gaia": 0.8, "dgc": 0.8}
ALGO_FLAGS = {"gaia": ("--t0", "0.01"), "dgc": ("--e-warm", "0"), "fedavg": ("--iter-local", "20")}
"""Gaia at T0 = 1% (3-20% significant per step on the CNN: a busy exchange); DGC at its final 99.9% sparsity."""
NORM = {"resnet20": "batch"}
"""--norm per model (ResNet-20 has BatchNorm, as in the paper); others: none."""


def _plain_worker(model_name: str, batch: int, steps: int, warmup: int, device: str = "cpu") -> None:
    """One rank of the plain baseline (run under torchrun): the same model and SGD, no exchange."""
    import datetime

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from geodml.models import build_model

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dev = torch.device("cpu")
    if device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    try:
        gen = torch.Generator().manual_seed(rank)
        model = build_model(model_name, NORM.get(model_name, "none"), (3, 32, 32), 10, generator_seed=0).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        pool_x = torch.randn(512, 3, 32, 32, generator=gen).to(dev)
        pool_y = torch.randint(0, 10, (512,), generator=gen).to(dev)
        xb = torch.empty(batch, 3, 32, 32, device=dev)
        yb = torch.empty(batch, dtype=torch.int64, device=dev)
        model.train()

        def step(i: int) -> None:
            idx = torch.randint(0, 512, (batch,), generator=gen).to(dev)
            torch.index_select(pool_x, 0, idx, out=xb)
            torch.index_select(pool_y, 0, idx, out=yb)
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
            float(loss.detach())  # the trainer reads the loss every step too

        for i in range(warmup):
            step(i)
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(steps):
            step(i)
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"PLAIN_STEP_S {float(t) / steps!r}", flush=True)
    finally:
        dist.destroy_process_group()


def plain_step_s(k: int, model: str, batch: int, steps: int, warmup: int, device: str = "cpu") -> float:
    """Seconds per step of the slowest of K concurrent plain processes."""
    cmd = torchrun_cmd(k, "-m", "geodml.bench.throughput", "--plain-worker", "--model", model,
                       "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup), "--device", device)
    r = subprocess.run(cmd, env=bench_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    if r.returncode != 0:
        raise RuntimeError(f"plain baseline failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    for line in r.stdout.splitlines():
        if line.startswith("PLAIN_STEP_S "):
            return float(line.split()[1])
    raise RuntimeError(f"plain baseline printed no timing:\n{r.stdout[-2000:]}")


def measure(models: list[str], algos: list[str], k: int, batch: int, steps: dict[str, int], on_model=None,
            device: str = "cpu") -> list[list]:
    """Rows of the table; ``on_model(rows_of_one_model)`` is called as each model finishes."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="geodml-bench-") as tmp:
        data = write_synthetic_cifar(Path(tmp) / "data", per_batch=1000, test_size=200)
        for model in models:
            n = steps[model]
            warm = max(5, n // 10)
            p0 = plain_step_s(k, model, batch, n, warm, device)
            runs = {}
            for algo in ["local", *algos]:
                extra = ALGO_FLAGS.get(algo, ())
                runs[algo] = run_geodml(k, algo, n + 20, Path(tmp), model=model, data_dir=data, batch_size=batch,
                                        extra=("--norm", NORM.get(model, "none"), "--device",
                                               "cuda" if device == "cuda" else "auto", *extra)).step_s
            p1 = plain_step_s(k, model, batch, n, warm, device)
            plain = (p0 + p1) / 2
            ips = lambda s: k * batch / s  # noqa: E731 - combined images per second
            first = len(rows)
            rows.append([model, "plain (before)", p0 * 1e3, ips(p0), plain / p0, ""])
            for algo, s in runs.items():
                target = TARGETS.get(algo)
                ok = "" if target is None else (f">= {target} ok" if plain / s >= target else f">= {target} MISS")
                rows.append([model, algo, s * 1e3, ips(s), plain / s, ok])
            rows.append([model, "plain (after)", p1 * 1e3, ips(p1), plain / p1, ""])
            if on_model is not None:
                on_model(rows[first:])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geodml.bench throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps (CNN 40, ResNet-20 20)")
    p.add_argument("--models", default="cnn,resnet20")
    p.add_argument("--algos", default="bsp,gaia,dgc,fedavg")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--steps", type=int, default=0, help="timed steps per run (default: 120 CNN, 40 ResNet-20)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where every rank trains (cuda: ranks share the visible GPUs when K exceeds them)")
    p.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=10, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.plain_worker:
        _plain_worker(a.model, a.batch, a.steps, a.warmup, a.device)
        return 0
    models = [m for m in a.models.split(",") if m]
    algos = [x for x in a.algos.split(",") if x]
    bad = [x for x in algos if x not in TARGETS]
    if bad or a.k < 1 or a.batch < 1:
        raise ValueError(f"--algos must be among {sorted(TARGETS)} (got {bad}); --k and --batch must be >= 1")
    default = {"cnn": 40, "resnet20": 20} if a.quick else {"cnn": 120, "resnet20": 40}
    steps = {m: a.steps or default.get(m, 40) for m in models}
    headers = ["model", "run", "ms/step", "img/s", "x plain", "target"]
    title = (f"throughput on {a.device}: K={a.k} ranks, batch {a.batch}, CIFAR-10-shaped data, --wan off, 1 thread/rank; "
             f"x plain = mean(plain before, after) / this run's step time")
    if len(models) == 1:
        print(format_table(headers, measure(models, algos, a.k, a.batch, steps, device=a.device), title=title))
    else:  # one table per model as it finishes (a model's rows survive a later model's failure)
        measure(models, algos, a.k, a.batch, steps, device=a.device,
                on_model=lambda r: print(format_table(headers, r, title=title), flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
