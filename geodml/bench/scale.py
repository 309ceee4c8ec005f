"""Wall time per epoch as K grows at fixed total data: ``python -m geodml.bench scale [--quick] [--ks 2,5,10,16]``.

The training set is fixed (CIFAR-10-shaped, 5,000 images, the CNN, batch 20, ``--wan off``), so
an epoch is ``ceil(5000 / (K * 20))`` steps of K ranks: the total compute per epoch is the same
for every K, and on this 2-core machine the ideal is a flat line. For each K, side by side:
``--algo local`` (no communication: the compute and process-count cost) and each algorithm.
Wall seconds per epoch = seconds per step (rank 0, metrics.jsonl; each run is --steps + 10 steps,
the first 10-step log window, the warm-up, excluded) x
steps per epoch. Ratios: against the same algorithm at the smallest K, and against local at
the same K.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from geodml.bench.common import format_table, run_geodml, write_synthetic_cifar

TRAIN_IMAGES = 5000
BATCH = 20


def measure(ks: list[int], algos: list[str], steps: int) -> list[list]:
    rows = []
    base: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="geodml-bench-") as tmp:
        data = write_synthetic_cifar(Path(tmp) / "data", per_batch=TRAIN_IMAGES // 5, test_size=200)
        for k in ks:
            spe = -(-TRAIN_IMAGES // (k * BATCH))
            per_epoch = {}
            for algo in ["local", *algos]:
                t = run_geodml(k, algo, steps + 10, Path(tmp), model="cnn", data_dir=data, batch_size=BATCH)
                per_epoch[algo] = t.step_s * spe
                base.setdefault(algo, per_epoch[algo])
            for algo, s in per_epoch.items():
                rows.append([k, algo, spe, s, s / base[algo], s / per_epoch["local"]])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geodml.bench scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="30 steps per run (default 60)")
    p.add_argument("--ks", default="2,5,10,16")
    p.add_argument("--algos", default="bsp,gaia")
    p.add_argument("--steps", type=int, default=0)
    a = p.parse_args(argv)
    ks = [int(x) for x in a.ks.split(",") if x]
    if not ks or min(ks) < 1 or ks != sorted(ks):
        raise ValueError(f"--ks must be increasing positive process counts, got {a.ks!r}")
    algos = [x for x in a.algos.split(",") if x]
    steps = a.steps or (30 if a.quick else 60)
    if steps < 30:
        raise ValueError("--steps must be >= 30 (three log windows of 10 steps)")
    rows = measure(ks, algos, steps)
    print(format_table(["K", "algo", "steps/epoch", "s/epoch", f"x K={ks[0]}", "x local"], rows,
                       title=f"scale: fixed total data ({TRAIN_IMAGES} CIFAR-shaped images, CNN, batch {BATCH}), "
                             f"--wan off, {steps} steps per run; s/epoch = s/step x steps/epoch"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
