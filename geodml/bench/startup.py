"""Launch to first step: ``python -m geodml.bench startup [--quick] [--ks 5,16]``.

For each K, side by side in this invocation:

* ``floor``: ``torchrun`` starting K Python processes that import torch, create a gloo process
  group and pass one barrier (what any torch.distributed program pays before its first step);
* ``geodml``: ``torchrun -m geodml`` (the CNN on the bundled digits data, ``--wan off``) until rank
  0 writes its first metrics line, i.e. after step 1 (polled every 5 ms by this process).

The ratio geodml / floor and the difference (geodml's own start-up: config, dataset load and
partitioning, ZeroMQ transport and peer address exchange, model, first step) are printed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from geodml.bench.common import TIMEOUT_S, bench_env, format_table, run_geodml, torchrun_cmd


def _floor_worker(flag_file: str) -> None:
    import datetime

    import torch  # noqa: F401 - the import is part of what is measured
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    try:
        dist.barrier()
        if dist.get_rank() == 0:
            Path(flag_file).write_text("ready")
    finally:
        dist.destroy_process_group()


def floor_s(k: int, workdir: Path) -> float:
    """Seconds from launching torchrun to rank 0 passing its first barrier (torch imported, gloo up)."""
    flag = workdir / f"floor-{k}-{time.monotonic_ns()}"
    cmd = torchrun_cmd(k, "-m", "geodml.bench.startup", "--floor-worker", str(flag))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=bench_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ready = None
    try:
        while proc.poll() is None or ready is None:
            if ready is None and flag.exists():
                ready = time.monotonic() - t0
            if proc.poll() is not None and ready is None:
                break
            if time.monotonic() - t0 > TIMEOUT_S:
                raise TimeoutError(f"startup floor K={k} exceeded {TIMEOUT_S} s")
            time.sleep(0.005)
        proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    if proc.returncode != 0 or ready is None:
        raise RuntimeError(f"startup floor K={k} failed (exit {proc.returncode}): {proc.stderr.read()[-2000:]}")
    return ready


def measure(ks: list[int], repeats: int) -> list[list]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="geodml-bench-") as tmp:
        for k in ks:
            floors, firsts = [], []
            for _ in range(repeats):  # alternate, so both see the same load
                floors.append(floor_s(k, Path(tmp)))
                firsts.append(run_geodml(k, "bsp", 4, Path(tmp), model="cnn", dataset="digits",
                                         log_every=1).first_log_s)
            f, g = sorted(floors)[len(floors) // 2], sorted(firsts)[len(firsts) // 2]
            rows.append([k, f, g, g - f, g / f])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geodml.bench startup", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one round per K (default 3, median)")
    p.add_argument("--ks", default="5,16", help="comma-separated process counts")
    p.add_argument("--floor-worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.floor_worker:
        _floor_worker(a.floor_worker)
        return 0
    ks = [int(x) for x in a.ks.split(",") if x]
    if not ks or min(ks) < 1:
        raise ValueError(f"--ks must be positive process counts, got {a.ks!r}")
    repeats = 1 if a.quick else 3
    rows = measure(ks, repeats)
    print(format_table(["K", "floor s", "geodml first step s", "geodml own s", "x floor"], rows,
                       title=f"startup: launch to first step (median of {repeats}, alternating); floor = torchrun + "
                             f"import torch + gloo group + barrier; geodml = bsp, CNN, digits, --wan off"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
