"""``--channels-last`` against the default NCHW path: wall seconds per training step of whole geodml
runs (one process, its partitions hosted; ``OMP_NUM_THREADS=1``), the two variants interleaved
(A, B, A, B, ...) and each variant's fastest repetition kept, so a load change hits both alike.

The setups are the studies' CPU workloads: the IWDS paper's FedAvg (McMahan's CNN, 10 clients, 5
per round, batch 32), the Quagmire LeNet under BSP at K = 5 (batch 20), with BatchNorm, and
BN-ResNet-20. Each row prints the ratio NCHW / channels-last (> 1: the flag is faster) and whether
the two runs sent the same WAN bytes. ``--quick``: digits, few steps (checks the machinery only;
8x8 images say nothing about the speed-up).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from geodml.bench.common import format_table, run_geodml

SETUPS: dict[str, tuple[str, str, int, tuple[str, ...]]] = {
    # name: (algo, model, batch, further flags)
    "cnn fedavg P=10 C=0.5": ("fedavg", "cnn", 32, ("--partitions", "10", "--client-fraction", "0.5",
                                                    "--iter-local", "20")),
    "lenet bsp K=5": ("bsp", "lenet", 20, ("--partitions", "5")),
    "bn-lenet bsp K=5": ("bsp", "lenet", 20, ("--partitions", "5", "--norm", "batch")),
    "bn-resnet20 bsp K=5": ("bsp", "resnet20", 20, ("--partitions", "5", "--norm", "batch")),
}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m geodml.bench layout", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="digits, 40 steps, one repetition, two setups")
    p.add_argument("--dataset", default="fashion-mnist", help="dataset of the full benchmark")
    p.add_argument("--steps", type=int, default=100, help="training steps per run (the first 10 are warm-up)")
    p.add_argument("--repeats", type=int, default=2, help="runs per variant and setup, interleaved")
    p.add_argument("--setups", default=",".join(SETUPS), help="comma-separated names of: " + "; ".join(SETUPS))
    args = p.parse_args(argv)
    args.setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = [s for s in args.setups if s not in SETUPS]
    if unknown:
        p.error(f"unknown setup(s) {unknown}; choose from {list(SETUPS)}")
    if args.quick:
        args.dataset, args.steps, args.repeats = "digits", 40, 1
        args.setups = [s for s in args.setups if "resnet" not in s][:2]
    if args.steps < 40 or args.repeats < 1:
        p.error("--steps must be >= 40 and --repeats >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    rows = []
    with tempfile.TemporaryDirectory(prefix="geodml-bench-layout-") as tmp:
        for name in args.setups:
            algo, model, batch, extra = SETUPS[name]
            best: dict[bool, float] = {}
            wan: dict[bool, int] = {}
            for _ in range(args.repeats):
                for cl in (False, True):
                    t = run_geodml(1, algo, args.steps, Path(tmp), model=model, dataset=args.dataset, batch_size=batch,
                                   extra=(*extra, "--partition-eval-examples", "100",  # a short final evaluation
                                          *(("--channels-last",) if cl else ())))
                    best[cl] = min(best.get(cl, float("inf")), t.step_s)
                    assert t.out is not None
                    wan[cl] = json.loads((t.out / "summary.json").read_text())["wan_bytes_total"]
            rows.append([name, 1000 * best[False], 1000 * best[True], best[False] / best[True],
                         "yes" if wan[False] == wan[True] else f"no ({wan[False]:,} vs {wan[True]:,})"])
            print(f"  {name}: {rows[-1][3]:.2f}x", flush=True)
    print(format_table(["setup", "NCHW ms/step", "channels-last ms/step", "ratio", "same WAN bytes"], rows,
                       title=f"--channels-last vs NCHW, {args.dataset}, {args.steps} steps, best of {args.repeats} "
                             "interleaved run(s) per variant, one process, OMP_NUM_THREADS=1"))
    return 0
