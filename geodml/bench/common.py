"""Helpers shared by the suite benchmarks (throughput, kernels, startup, scale).

Every figure the suite prints is a *ratio* of two timings taken in the same invocation, one
right after the other: the machine is shared and loaded, so absolute numbers from different
invocations are not comparable, while side-by-side ratios are.

* :func:`write_synthetic_cifar` writes a small CIFAR-10-shaped dataset (python pickled
  batches, random pixels) so that the CNN on CIFAR (878,538 parameters) and ResNet-20 run with
  their real shapes on a machine without the CIFAR-10 download.
* :func:`run_geodml` runs ``torchrun -m geodml`` with K processes and returns the mean wall
  seconds per training step from rank 0's ``metrics.jsonl`` (first log window and every
  evaluation excluded), plus the launch-to-first-log time.
* :func:`format_table` renders rows as an aligned plain-text table.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from geodml.bench.ports import free_port

TIMEOUT_S = 900
"""Hard limit of any one benchmark subprocess (a hung run fails the benchmark, never the machine)."""


def bench_env() -> dict[str, str]:
    """Environment of benchmark subprocesses: one intra-op thread per rank, unbuffered output."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def torchrun_cmd(k: int, *module_and_args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={k}", "--master_addr=127.0.0.1",
            f"--master_port={free_port()}", *module_and_args]


def write_synthetic_cifar(folder: Path, *, per_batch: int = 1000, test_size: int = 500, seed: int = 0) -> Path:
    """Write ``data_batch_1..5`` (``per_batch`` images each) and ``test_batch`` of random uint8
    pixels and uniform labels into ``folder/cifar-10-batches-py``; returns ``folder``."""
    d = folder / "cifar-10-batches-py"
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        n = test_size if name == "test_batch" else per_batch
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, n).tolist()
        with open(d / name, "wb") as fh:
            pickle.dump({b"batch_label": name.encode(), b"data": data, b"labels": labels}, fh, protocol=4)
    return folder


@dataclass(frozen=True)
class RunTiming:
    step_s: float
    """Mean wall seconds per step on rank 0 between the second and the last log line."""
    first_log_s: float
    """Seconds from launching torchrun to rank 0 writing its first metrics line."""
    total_s: float
    """Seconds from launch to torchrun's exit."""
    steps_per_epoch: int
    out: Path | None = None
    """The run directory (inside ``workdir``; gone with it)."""


def run_geodml(k: int, algo: str, steps: int, workdir: Path, *, model: str, dataset: str = "cifar10",
               data_dir: Path | None = None, batch_size: int = 20, log_every: int = 10,
               extra: tuple[str, ...] = (), timeout_s: float = TIMEOUT_S, env: dict[str, str] | None = None) -> RunTiming:
    """Run ``torchrun --nproc_per_node=k -m geodml`` with ``--wan off`` and no evaluation
    inside the run; time it from rank 0's metrics.jsonl (which is polled for the first line).
    ``env``: variables set on top of :func:`bench_env`'s."""
    out = workdir / f"run-{algo}-k{k}-{time.monotonic_ns()}"
    cmd = torchrun_cmd(k, "-m", "geodml", "--algo", algo, "--dataset", dataset, "--model", model,
                       "--batch-size", str(batch_size), "--wan", "off", "--no-progress",
                       "--eval-every", str(10**9), "--log-every", str(log_every), "--steps", str(steps),
                       "--partition", "iid", "--out", str(out), *extra)
    if data_dir is not None:
        cmd += ["--data-dir", str(data_dir)]
    metrics = out / "metrics.jsonl"
    t0 = time.monotonic()
    first_log = float("nan")
    proc = subprocess.Popen(cmd, env={**bench_env(), **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while proc.poll() is None:
            if first_log != first_log and metrics.exists() and metrics.stat().st_size > 0:
                first_log = time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"geodml run {algo} K={k} exceeded {timeout_s:g} s")
            time.sleep(0.005 if first_log != first_log else 0.05)
        total = time.monotonic() - t0
        err = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"geodml run {algo} K={k} failed (exit {proc.returncode}):\n{err[-3000:]}")
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    lines = [r for r in lines if "val_accuracy" not in r and "train_loss" in r]
    if len(lines) < 3:
        raise RuntimeError(f"run {algo} K={k}: {len(lines)} log lines; give more --steps than 3 x log_every")
    first, last = lines[1], lines[-1]  # the first window holds the warm-up
    spe = int(round(last["step"] / last["epoch"])) if last["epoch"] else 0
    return RunTiming(step_s=(last["wall_s"] - first["wall_s"]) / (last["step"] - first["step"]),
                     first_log_s=first_log if first_log == first_log else total, total_s=total,
                     steps_per_epoch=spe, out=out)


def format_table(headers: list[str], rows: list[list], *, title: str | None = None) -> str:
    """Aligned plain-text table; floats get 3 significant decimals, strings are left-aligned."""
    def cell(v) -> str:
        if isinstance(v, float):
            return "nan" if v != v else (f"{v:.3f}" if abs(v) < 100 else f"{v:,.1f}")
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,}"
        return str(v)
    cells = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    left = [bool(rows) and isinstance(rows[0][i], str) for i in range(len(headers))]

    def line(vals: list[str]) -> str:
        return "  ".join(v.ljust(w) if lf else v.rjust(w) for v, w, lf in zip(vals, widths, left)).rstrip()
    out = [title] if title else []
    out += [line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells]
    return "\n".join(out)
