"""Benchmarks of geodml's own machinery: ``python -m geodml.bench [NAME ...] [--quick]``.

With no NAME the suite (:data:`SUITE`) runs; with one NAME that benchmark's own options
follow it (``python -m geodml.bench kernels --sizes 1000000``); with several, only ``--quick``
may follow. Every figure is a ratio of two timings taken side by side in the same invocation
(the machine is shared: absolute timings from different invocations do not compare).

:data:`BENCHMARKS` maps a name to ``"module:function"``; the function takes the remaining
command-line arguments (``argv``) and returns an exit code. Modules are imported only when
their benchmark runs, so adding one costs nothing to the others. To add a benchmark, add an
entry here and a module with ``main(argv: list[str] | None = None) -> int``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

BENCHMARKS: dict[str, str] = {
    "transport": "geodml.bench.transport:main",
    "step": "geodml.bench.step:main",
    "dgc": "geodml.bench.dgc_kernels:main",
    "throughput": "geodml.bench.throughput:main",
    "kernels": "geodml.bench.kernels:main",
    "startup": "geodml.bench.startup:main",
    "scale": "geodml.bench.scale:main",
    "breakdown": "geodml.bench.breakdown:main",
    "federation": "geodml.bench.federation:main",
    "flower": "geodml.bench.flower:main",
    "layout": "geodml.bench.layout:main",
    "layers": "geodml.bench.layers:main",
}
"""name -> "module:function" (the function parses its own options from argv)."""

DESCRIPTIONS: dict[str, str] = {
    "transport": "ZeroMQ transport vs raw pyzmq on loopback; --wan real pacing accuracy",
    "step": "per-step synchronization overhead of an algorithm against compute-only and its kernel",
    "dgc": "DGC selection kernels and exchange",
    "throughput": "K=5 ranks' images/s per algorithm vs K plain PyTorch processes (the CNN, ResNet-20)",
    "kernels": "Gaia / DGC selection at 1M and 10M vs a memory pass (bytes/s bound)",
    "startup": "launch to first step, K=5 and K=16, vs torchrun + import torch + process group",
    "scale": "wall time per epoch at fixed total data, K=2,5,10,16, vs K=2",
    "breakdown": "where a step's time goes (compute, algorithm, send, recv wait, log) per algorithm",
    "federation": "P = 16 .. 10,000 partitions on R = 1, 2 processes: partition-steps/s vs a plain loop, memory vs state",
    "flower": "the default command vs Flower's simulation doing the same FedAvg (same final weights), K = 5 .. 1,000",
    "layout": "--channels-last vs NCHW: wall per step of whole runs (the studies' CPU workloads), same WAN bytes",
    "layers": "compiled max-pool and LRN vs torch's: per model (train step, evaluation) and whole runs, same results",
}

SUITE: tuple[str, ...] = ("throughput", "kernels", "transport", "startup", "scale")
"""What ``python -m geodml.bench`` runs with no NAME (issue 12's table, in this order)."""

QUICK_SUPPORTED: frozenset[str] = frozenset({"throughput", "kernels", "startup", "scale", "breakdown", "transport",
                                                "federation", "layout", "layers"})
"""Benchmarks that accept ``--quick``."""


def resolve(name: str) -> Callable[[list[str] | None], int]:
    """The entry function of benchmark ``name`` (KeyError for an unknown name)."""
    module, func = BENCHMARKS[name].split(":")
    return getattr(importlib.import_module(module), func)
