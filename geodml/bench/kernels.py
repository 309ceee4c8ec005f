"""Selection kernels against the memory floor: ``python -m geodml.bench kernels [--quick] [--sizes ...]``.

Per call, one process, one thread, at N = 1M and 10M float32 elements:

* ``gaia select``: :meth:`geodml.algorithms.gaia.Gaia.select` (|v| > T |w|, gather the
  significant entries, clear them from v) with 2% and with 50% of the entries significant, on
  each CPU path: ``fused C`` (geodml/_kernels.c, the default when built), ``NumPy`` (blocked
  NumPy passes; before the fused loop) and ``torch path`` (torch.nonzero; what non-CPU devices
  run and what CPU ran before issue 12), for a before/after in one invocation.
  It must read v and w: 8 B per element (the writes of the few significant entries are small).
* ``dgc select``: :meth:`geodml.algorithms.topk.TopSelector.select` at sparsity 99.9% (sampled
  threshold, candidates |v| >= T), ``fused C`` and ``NumPy`` backends. It must read v: 4 B per
  element.
* ``memory pass``: ``x.mul_(c)`` over N float32 (reads and writes 8 B per element), the floor:
  its bytes/s is the machine's bound for a streaming pass.

``x bound`` = kernel time / (bytes the kernel must touch / floor bytes/s); target <= 1.5.
``--device cuda`` runs the same calls on the GPU (the torch paths; every call is followed by
``torch.cuda.synchronize()`` inside its timing, and the NumPy rows are left out).
Kernel and floor are timed alternately, call by call, so both see the same load; the figure is
the ratio of their medians (``--stat min`` for the uncontended cost on a busy machine).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

TARGET = 1.5
GAIA_FRACTIONS = (0.02, 0.5)
"""Significant fractions Gaia is timed at: a typical step, and the dense edge (torch.nonzero's worst case)."""


def _paired(fn, floor, repeats: int, prep=None, sync=None) -> tuple[list[float], list[float]]:
    """Alternate ``floor()`` and ``fn()`` ``repeats`` times (after one warm-up of each); ``sync``
    (e.g. torch.cuda.synchronize) ends each timed call on an asynchronous device."""
    if sync is not None:
        fn0, floor0 = fn, floor
        fn = lambda: (fn0(), sync())  # noqa: E731
        floor = lambda: (floor0(), sync())  # noqa: E731
    if prep is not None:
        prep()
    fn()
    floor()
    a, b = [], []
    for _ in range(repeats):
        if prep is not None:
            prep()
        t0 = time.perf_counter()
        floor()
        t1 = time.perf_counter()
        fn()
        t2 = time.perf_counter()
        a.append(t2 - t1)
        b.append(t1 - t0)
    return a, b


def measure(sizes: list[int], repeats: int, stat=statistics.median, device: str = "cpu") -> list[list]:
    import numpy as np
    import torch

    from geodml import kernels
    from geodml.algorithms.base import AlgoContext, FlatParams
    from geodml.algorithms.gaia import Gaia
    from geodml.algorithms.topk import TopSelector

    torch.set_num_threads(1)
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else None
    rows = []
    for n in sizes:
        gen = torch.Generator().manual_seed(0)
        scratch = torch.randn(n, generator=gen).to(dev)
        floor = lambda: scratch.mul_(1.0000001)  # noqa: E731 - read + write 8 B/element
        # Gaia at T = 1% on v = T * w * r, r ~ U(0, 1/(1-f)): a fraction f of the entries is
        # significant, the same f every call (v is restored, untimed, before each call).
        flat = FlatParams(torch.nn.Linear(n, 1, bias=False).to(dev))
        flat.data.copy_(torch.randn(n, generator=gen))
        ctx = AlgoContext(rank=0, world_size=1, seed=0, steps_per_epoch=1, total_steps=1, batch_size=1,
                          label_counts=np.ones((1, 2), dtype=np.int64))
        g = Gaia(flat=flat, comm=None, momentum=0.9, ctx=ctx, t0=0.01, lr0=0.1)
        np_views_cpu = g._np
        for f in GAIA_FRACTIONS:
            v0 = flat.data * 0.01 * torch.rand(n, generator=gen).to(dev) / (1.0 - f)
            if dev.type == "cpu":
                paths = ([("gaia select, fused C", g._np, True)] if kernels.compiled is not None else []) + \
                    [("gaia select, NumPy", g._np, False), ("gaia select, torch path", None, False)]
            else:
                paths = [("gaia select, torch path", None, False)]
            for label, np_views, fused in paths:
                g._np = np_views  # None: the torch ops (non-CPU devices; CPU before issue 12)
                g.fused = fused
                frac = []

                def gaia() -> None:
                    frac.append(g.select(0.01)[0] / n)
                kt, ft = _paired(gaia, floor, repeats, lambda v0=v0: g.v.copy_(v0), sync)
                fl = stat(ft)
                bw = 8 * n / fl
                rows.append([label, n, 8, stat(kt) * 1e3, fl * 1e3, bw / 1e9, stat(kt) / (8 * n / bw),
                             f"{statistics.median(frac):.1%} significant"])
            g._np = np_views_cpu
            del v0
        # DGC threshold selection on a heavy-tailed |v|.
        v = (torch.randn(n, generator=gen) * torch.rand(n, generator=gen) ** 3).to(dev)
        backends = (["fused"] if kernels.compiled is not None else []) + ["numpy"] if dev.type == "cpu" else ["torch"]
        for backend in backends:
            sel = TopSelector(n, sample_ratio=0.01, sparsities=(0.999,), device=dev, backend=backend,
                              generator=torch.Generator(device=dev).manual_seed(0))
            paths = []

            def dgc() -> None:
                sel.select(v, 0.999)
                paths.append(sel.path)
            kt, ft = _paired(dgc, floor, repeats, sync=sync)
            fl = stat(ft)
            bw = 8 * n / fl
            name = {"fused": "fused C", "numpy": "NumPy", "torch": "torch path"}[backend]
            rows.append([f"dgc select s=99.9%, {name}", n, 4, stat(kt) * 1e3, fl * 1e3, bw / 1e9,
                         stat(kt) / (4 * n / bw), "paths " + ",".join(sorted(set(paths)))])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geodml.bench kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats (5 instead of 20)")
    p.add_argument("--sizes", default="1000000,10000000", help="comma-separated element counts")
    p.add_argument("--repeats", type=int, default=0)
    p.add_argument("--stat", choices=["median", "min"], default="min",
                   help="summary of the repeated calls (default min: the uncontended cost on a shared machine)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:i]: time the GPU (torch) paths")
    a = p.parse_args(argv)
    sizes = [int(x) for x in a.sizes.split(",") if x]
    if not sizes or min(sizes) < 1000:
        raise ValueError(f"--sizes must be element counts >= 1000, got {a.sizes!r}")
    repeats = a.repeats or (5 if a.quick else 20)
    if not a.device.startswith(("cpu", "cuda")):
        raise ValueError(f"--device must be cpu or cuda[:i], got {a.device!r}")
    rows = measure(sizes, repeats, statistics.median if a.stat == "median" else min, a.device)
    print(format_rows(rows, repeats, a.stat, a.device))
    return 0


def format_rows(rows: list[list], repeats: int, stat: str, device: str = "cpu") -> str:
    from geodml.bench.common import format_table
    out = [r[:7] + [("ok" if r[6] <= TARGET else "MISS"), r[7]] for r in rows]
    return format_table(["kernel", "N", "B/elem", "ms", "floor ms", "floor GB/s", "x bound", f"<= {TARGET}", "note"],
                        out, title=f"kernels on {device}: 1 thread, {stat} of {repeats} alternating calls; x bound = ms / "
                                   f"(B/elem * N / floor GB/s)")


if __name__ == "__main__":
    sys.exit(main())
