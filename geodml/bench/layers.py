"""The compiled CPU layers (geodml.models.compiled: max-pool, LRN) against torch's own kernels.

Two parts, each variant timed side by side in this invocation (interleaved, best repetition kept):

* **per model**: a training step (forward + backward, batch 64) and an evaluation pass (batch 500,
  no gradient) of each model with them on Fashion-MNIST's shape (cifar-cnn on CIFAR-10's), in
  this process on one thread; torch's path is the same module with the compiled kernels switched
  off, so the ratio is the layers' share of the step (lenet and cifar-cnn have LRN, cnn and
  BN-LeNet not).
* **whole runs**: geodml runs (one process, ``OMP_NUM_THREADS=1``) of the studies' workloads with
  ``GEODML_NO_KERNELS=1`` (torch's layers) and without. FedAvg and BSP use no other compiled
  kernel, so the ratio is the layers' alone. Each row also says whether the two runs ended with
  the same final accuracy, loss and WAN bytes (they must: the layers are bit-identical to torch's).

``--quick``: small batches, digits, one run setup (checks the machinery only).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from geodml.bench.common import format_table, run_geodml
from geodml.models import build_model, compiled

MODELS: dict[str, tuple[str, str, tuple[int, int, int]]] = {
    "cnn": ("cnn", "none", (1, 28, 28)),
    "lenet": ("lenet", "none", (1, 28, 28)),
    "bn-lenet": ("lenet", "batch", (1, 28, 28)),
    "cifar-cnn": ("cifar-cnn", "none", (3, 32, 32)),
}

RUNS: dict[str, tuple[str, str, int, tuple[str, ...]]] = {
    # name: (algo, model, batch, further flags), as geodml.bench.layout's
    "cnn fedavg P=10 C=0.5": ("fedavg", "cnn", 32, ("--partitions", "10", "--client-fraction", "0.5",
                                                    "--iter-local", "20")),
    "lenet bsp K=5": ("bsp", "lenet", 20, ("--partitions", "5")),
    "cifar-cnn fedavg P=10 C=0.5": ("fedavg", "cifar-cnn", 64, ("--partitions", "10", "--client-fraction", "0.5",
                                                                "--iter-local", "8")),
}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m geodml.bench layers", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small batches, digits, 40 steps, one run setup")
    p.add_argument("--steps", type=int, default=100, help="training steps per whole run (the first 10 are warm-up)")
    p.add_argument("--repeats", type=int, default=2, help="repetitions per variant, interleaved")
    p.add_argument("--no-runs", action="store_true", help="the per-model part only")
    args = p.parse_args(argv)
    if args.steps < 40 or args.repeats < 1:
        p.error("--steps must be >= 40 and --repeats >= 1")
    return args


def _time_model(model_name: str, fast: bool, *, train: bool, batch: int, reps: int) -> float:
    """Best seconds per call over three timed blocks of ``reps`` calls, after two warm-up calls."""
    name, norm, shape = MODELS[model_name]
    saved = compiled.kernels.compiled
    if not fast:
        compiled.kernels.compiled = None
    try:
        torch.manual_seed(0)
        model = build_model(name, norm, shape, 10)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(batch, *shape, generator=g), torch.randint(0, 10, (batch,), generator=g)

        def call() -> None:
            if train:
                model.zero_grad()
                F.cross_entropy(model(x), y).backward()
            else:
                with torch.no_grad():
                    model(x)
        for _ in range(2):
            call()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                call()
            best = min(best, (time.perf_counter() - t0) / reps)
        return best
    finally:
        compiled.kernels.compiled = saved


def main(argv: list[str] | None = None) -> int:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    if compiled.kernels.compiled is None:
        print(f"python -m geodml.bench layers: error: geodml._kernels unavailable ({compiled.kernels.UNAVAILABLE_REASON})",
              file=sys.stderr)
        return 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        for m in MODELS:
            for train in (True, False):
                batch = (64 if train else 500) // (8 if args.quick else 1)
                reps = 2 if args.quick else (10 if train else 3)
                best = {False: float("inf"), True: float("inf")}
                for _ in range(args.repeats):
                    for fast in (False, True):
                        best[fast] = min(best[fast], _time_model(m, fast, train=train, batch=batch, reps=reps))
                what = f"train step, batch {batch}" if train else f"evaluation, batch {batch}"
                rows.append([m, what, 1000 * best[False], 1000 * best[True], best[False] / best[True]])
                print(f"  {m} {what}: {rows[-1][4]:.2f}x", flush=True)
    finally:
        torch.set_num_threads(threads)
    print(format_table(["model", "pass", "torch ms", "compiled ms", "ratio"], rows,
                       title="max-pool and LRN: torch's CPU kernels vs geodml._kernels, one thread, in-process"))
    if args.no_runs:
        return 0
    dataset, steps, repeats = ("digits", 40, 1) if args.quick else ("fashion-mnist", args.steps, args.repeats)
    setups = list(RUNS)[:1] if args.quick else list(RUNS)
    run_rows = []
    with tempfile.TemporaryDirectory(prefix="geodml-bench-layers-") as tmp:
        for name in setups:
            algo, model, batch, extra = RUNS[name]
            best_s: dict[bool, float] = {}
            ends: dict[bool, tuple] = {}
            for _ in range(repeats):
                for fast in (False, True):
                    t = run_geodml(1, algo, steps, Path(tmp), model=model, dataset=dataset, batch_size=batch,
                                   extra=(*extra, "--partition-eval-examples", "100"),
                                   env={} if fast else {"GEODML_NO_KERNELS": "1"})
                    best_s[fast] = min(best_s.get(fast, float("inf")), t.step_s)
                    assert t.out is not None
                    s = json.loads((t.out / "summary.json").read_text())
                    ends[fast] = (s["final_val_accuracy"], s["final_train_loss"], s["wan_bytes_total"])
            run_rows.append([name, 1000 * best_s[False], 1000 * best_s[True], best_s[False] / best_s[True],
                             "yes" if ends[False] == ends[True] else f"no ({ends[False]} vs {ends[True]})"])
            print(f"  {name}: {run_rows[-1][3]:.2f}x", flush=True)
    print(format_table(["setup", "torch ms/step", "compiled ms/step", "ratio", "same accuracy, loss, bytes"],
                       run_rows, title=f"whole runs, {dataset}, {steps} steps, best of {repeats} interleaved run(s) "
                                       "per variant, one process, OMP_NUM_THREADS=1"))
    return 0 if all(r[4] == "yes" for r in run_rows) else 1
