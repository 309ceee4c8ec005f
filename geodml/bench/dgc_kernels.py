"""DGC kernels and exchange, measured: ``python -m geodml.bench dgc [--sizes ...] [--exchange K]``.

Kernel table (one process, one thread): for each size N and sparsity s, the median time of

* ``torch.topk``       -- exact top-k of |v| (the textbook selection);
* ``np.argpartition``  -- exact top-k by introselect on a NumPy view (DGC's fallback path);
* ``select``           -- geodml.algorithms.topk.TopSelector: sampled threshold, refine, fallback;
* ``dgc step``         -- the whole per-step overhead of DGC on one partition without peers
  (clip off, momentum correction, accumulation, selection, gather, clearing, applying the
  update, the Appendix G diagnostic);
* ``memory pass``      -- one read+write pass over N float32 (the floor any step pays).

Exchange table (``--exchange K``; K processes under torchrun, gloo + ZeroMQ through
geodml.comm.build_comm, ``--wan off``): per exchange of c (int32, float32) entries, the
median of ZeroMQ all-to-all (``send_to_all`` + ``recv_from_all``, what DGC uses), a
torch.distributed all_gather of fixed-size blocks, and the ring all_reduce of a dense
N-vector (DGC's wire while k >= N/K).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from geodml.bench.ports import free_port

STAT = {"median": statistics.median, "min": min}
"""How repeated timings are summarized: median (default) or min (the uncontended cost on a busy machine)."""
_stat = statistics.median


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up (page faults, lazy init)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return _stat(times) * 1e3


def _accumulator(numel: int, seed: int = 0):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randn(numel, generator=g) * torch.rand(numel, generator=g) ** 3  # heavy-tailed like |v|


def dgc_step_s(numel: int, sparsity: float, repeats: int = 20) -> tuple[float, dict[str, int]]:
    """Median seconds of one DGC step's overhead on ``numel`` parameters (K=1, no peers), and
    how often each selection path ran."""
    import numpy as np
    import torch

    from geodml.algorithms.base import AlgoContext, FlatParams
    from geodml.algorithms.dgc import DGC

    torch.set_num_threads(1)
    flat = FlatParams(torch.nn.Linear(numel, 1, bias=False))
    flat.data.copy_(_accumulator(numel, 1))
    ctx = AlgoContext(rank=0, world_size=1, seed=0, steps_per_epoch=10**9, total_steps=10**9, batch_size=1,
                      label_counts=np.ones((1, 2), dtype=np.int64))
    algo = DGC(flat=flat, comm=None, momentum=0.9, ctx=ctx, sparsity=sparsity, e_warm=0)
    grads = [_accumulator(numel, 10 + i) * 1e-3 for i in range(4)]
    times, step = [], 0
    for i in range(repeats + 3):
        flat.grad.copy_(grads[i % 4])
        t0 = time.perf_counter()
        algo.step(step, 0.01)
        if i >= 3:
            times.append(time.perf_counter() - t0)
        step += 1
    return _stat(times), dict(algo.paths)


def kernel_table(sizes: list[int], sparsities: list[float]) -> list[str]:
    import numpy as np
    import torch

    from geodml.algorithms.topk import TopSelector, target_count

    torch.set_num_threads(1)
    lines = [f"{'N':>11s} {'s':>7s} {'k':>9s} {'torch.topk':>11s} {'argpartition':>13s} {'select':>8s} "
             f"{'dgc step':>9s} {'mem pass':>9s}  select paths (dgc step)",
             f"{'':>11s} {'':>7s} {'':>9s} {'ms':>11s} {'ms':>13s} {'ms':>8s} {'ms':>9s} {'ms':>9s}"]
    for n in sizes:
        reps = 5 if n >= 5_000_000 else 15
        v = _accumulator(n)
        absv = v.abs()
        an = absv.numpy()
        scratch = torch.randn(n)
        mem = _median_ms(lambda: scratch.mul_(1.0000001), reps)
        for s in sparsities:
            k = target_count(s, n)
            topk = _median_ms(lambda: torch.topk(v.abs(), k, sorted=False), reps)
            argp = _median_ms(lambda: np.argpartition(an, n - k)[n - k:], reps)
            sel = TopSelector(n, sample_ratio=0.01, sparsities=(s,), generator=torch.Generator().manual_seed(0))
            select = _median_ms(lambda: sel.select(v, s), reps)
            step_s, paths = dgc_step_s(n, s, repeats=reps)
            used = ", ".join(f"{p} {c}" for p, c in paths.items() if c)
            lines.append(f"{n:>11,} {s:>7.4g} {k:>9,} {topk:>11.2f} {argp:>13.2f} {select:>8.2f} {step_s * 1e3:>9.2f} "
                         f"{mem:>9.2f}  {used}")
    return lines


# ---- exchange (multi-process) -------------------------------------------------------------------
def _exchange_worker(entries: list[int], dense_numel: int, repeats: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from geodml.comm import build_comm
    from geodml.config import CommConfig

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    comm = build_comm(CommConfig(wan="off", timeout_s=60), rank=rank, world_size=world)
    rows = []
    step = 0
    try:
        for c in entries:
            idx = torch.arange(c, dtype=torch.int32)
            val = torch.ones(c, dtype=torch.float32)
            block = torch.zeros(2 * c + 1, dtype=torch.float32)  # [count | idx bits | values]

            def zmq_exchange():
                nonlocal step
                comm.send_to_all("gradient", [idx, val], step=step)
                comm.recv_from_all("gradient", step=step)
                step += 1

            def gather_exchange():
                comm.all_gather(block, "gradient")

            res = []
            for fn in (zmq_exchange, gather_exchange):
                times = []
                for i in range(repeats + 3):
                    comm.meta_all_reduce(torch.zeros(1))  # line the ranks up (uncharged)
                    t0 = time.perf_counter()
                    fn()
                    if i >= 3:
                        times.append(time.perf_counter() - t0)
                t = torch.tensor([statistics.median(times)], dtype=torch.float64)
                comm.meta_all_reduce(t)
                res.append(float(t) / world * 1e3)
            rows.append((c, *res))
        dense = torch.ones(dense_numel)
        times = []
        for i in range(repeats + 3):
            comm.meta_all_reduce(torch.zeros(1))
            t0 = time.perf_counter()
            comm.all_reduce(dense, "gradient")
            if i >= 3:
                times.append(time.perf_counter() - t0)
        t = torch.tensor([statistics.median(times)], dtype=torch.float64)
        comm.meta_all_reduce(t)
        if rank == 0:
            print(f"exchange, K={world} ranks, --wan off, median over {repeats} rounds, mean over ranks")
            print(f"{'entries':>9s} {'KiB/peer':>9s} {'zmq all-to-all ms':>18s} {'gloo all_gather ms':>19s}")
            for c, z, g in rows:
                print(f"{c:>9,} {8 * c / 1024:>9.1f} {z:>18.3f} {g:>19.3f}")
            print(f"ring all_reduce of {dense_numel:,} float32 (dense wire): {float(t) / world * 1e3:.3f} ms")
            sys.stdout.flush()
    finally:
        comm.close()
        dist.destroy_process_group()


def run_exchange(k: int, entries: list[int], dense_numel: int, repeats: int) -> int:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={k}", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "-m", "geodml.bench.dgc_kernels", "--exchange-worker",
           "--entries", ",".join(map(str, entries)), "--dense", str(dense_numel), "--repeats", str(repeats)]
    return subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=900).returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geodml.bench dgc", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="188810,878538,1000000,10000000",
                   help="comma-separated parameter counts (digits CNN, CIFAR CNN, 1M, 10M)")
    p.add_argument("--sparsities", default="0.75,0.99,0.999")
    p.add_argument("--exchange", type=int, default=0, metavar="K", help="also time the exchange with K processes")
    p.add_argument("--entries", default="189,879,11801,47203", help="exchange: entries per block")
    p.add_argument("--dense", type=int, default=188_810, help="exchange: dense all_reduce size")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--stat", choices=sorted(STAT), default="median", help="summary of repeated kernel timings")
    p.add_argument("--exchange-worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    global _stat
    _stat = STAT[a.stat]
    entries = [int(x) for x in a.entries.split(",")]
    if a.exchange_worker:
        _exchange_worker(entries, a.dense, a.repeats)
        return 0
    print(f"geodml.bench dgc: DGC selection kernels, 1 thread, {a.stat} of repeats")
    for line in kernel_table([int(x) for x in a.sizes.split(",")], [float(x) for x in a.sparsities.split(",")]):
        print(line, flush=True)
    if a.exchange:
        return run_exchange(a.exchange, entries, a.dense, a.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
