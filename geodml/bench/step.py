"""Per-step synchronization overhead of an algorithm (Gaia, DGC, BSP, FedAvg), measured in
one invocation against two baselines:

* ``compute-only``: the same K-process run with ``--algo local`` (no communication at all);
* ``kernel``: the algorithm's bare selection kernel on a buffer of the model's size in this
  process (Gaia: significance mask + gather + clear; other algorithms: none).

Step times come from metrics.jsonl ``wall_s`` between the first and last logged step (no
evaluation inside the window), so start-up and evaluation are excluded. ``--wan off``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from geodml.bench.ports import free_port

LOG_EVERY = 10
MIN_STEPS = 4 * LOG_EVERY
"""Log windows a timing needs: the first (warm-up, skipped), two to time between, and the last,
whose line carries the final evaluation and is left out."""


def run_steps(algo: str, k: int, steps: int, extra: list[str], workdir: Path, model: str, dataset: str) -> float:
    """Mean wall seconds per step of a K-process run (torchrun), excluding start-up and eval."""
    out = workdir / f"{algo}-{len(list(workdir.iterdir()))}"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={k}", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "-m", "geodml", "--algo", algo, "--dataset", dataset, "--model", model,
           "--wan", "off", "--no-progress", "--eval-every", str(10**9), "--log-every", str(LOG_EVERY),
           "--steps", str(steps), "--out", str(out), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, timeout=900)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    lines = [r for r in lines if "val_accuracy" not in r]
    first, last = lines[1], lines[-1]  # skip the first window (warm-up)
    return (last["wall_s"] - first["wall_s"]) / (last["step"] - first["step"])


def gaia_kernel_s(numel: int, repeats: int = 50) -> float:
    """Median seconds of Gaia.select on ``numel`` parameters (T = 1%, ~few % significant)."""
    import numpy as np
    import torch

    from geodml.algorithms.base import AlgoContext, FlatParams
    from geodml.algorithms.gaia import Gaia

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Linear(numel, 1, bias=False)
    flat = FlatParams(model)
    flat.data.copy_(torch.randn(numel, generator=gen))
    ctx = AlgoContext(rank=0, world_size=1, seed=0, steps_per_epoch=1, total_steps=1, batch_size=1,
                      label_counts=np.ones((1, 2), dtype=np.int64))
    g = Gaia(flat=flat, comm=None, momentum=0.9, ctx=ctx, t0=0.01, lr0=0.1)
    upd = torch.randn(numel, generator=gen) * 1e-3
    times = []
    for _ in range(repeats):
        g.v.add_(upd)
        t0 = time.perf_counter()
        g.select(0.01)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def memory_pass_s(numel: int, repeats: int = 50) -> float:
    """Median seconds of one read+write pass over ``numel`` float32 (the floor)."""
    import torch
    torch.set_num_threads(1)
    a = torch.randn(numel)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a.mul_(1.0000001)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geodml.bench step", description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", default="gaia", choices=["gaia", "dgc", "bsp", "fedavg"])
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--model", default="cnn")
    p.add_argument("--dataset", default="digits")
    p.add_argument("extra", nargs="*", help="extra geodml flags after --, e.g. -- --t0 0.05")
    a = p.parse_args(argv)
    if a.steps < MIN_STEPS or a.k < 1:
        raise ValueError(f"--steps must be >= {MIN_STEPS} (log windows of {LOG_EVERY} steps: the warm-up, two timed, "
                         f"and the last, which holds the final evaluation) and --k >= 1; got --steps {a.steps} --k {a.k}")
    from geodml.models import build_model, count_parameters
    numel = count_parameters(build_model(a.model, "none", (1, 8, 8), 10))
    with tempfile.TemporaryDirectory(prefix="geodml-bench-") as tmp:
        base = run_steps("local", a.k, a.steps, [], Path(tmp), a.model, a.dataset)
        algo = run_steps(a.algo, a.k, a.steps, a.extra, Path(tmp), a.model, a.dataset)
    rows = [("compute-only step (--algo local)", base * 1e3, 1.0), (f"{a.algo} step", algo * 1e3, algo / base),
            (f"{a.algo} sync overhead per step", (algo - base) * 1e3, (algo - base) / base)]
    if a.algo == "gaia":
        kern = gaia_kernel_s(numel)
        floor = memory_pass_s(numel)
        rows += [(f"gaia selection kernel ({numel:,} params)", kern * 1e3, kern / base),
                 ("memory pass, same buffer (floor)", floor * 1e3, floor / base)]
    print(f"geodml.bench step: {a.model} on {a.dataset}, K={a.k}, {a.steps} steps, --wan off, 1 thread/rank")
    print(f"{'what':44s} {'ms':>9s} {'x compute-only':>15s}")
    for name, ms, ratio in rows:
        print(f"{name:44s} {ms:9.3f} {ratio:15.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
