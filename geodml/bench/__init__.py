"""Benchmarks of geodml's own machinery: ``python -m geodml.bench NAME [options]``.

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
}
"""name -> "module:function" (the function parses its own options from argv)."""

DESCRIPTIONS: dict[str, str] = {
    "transport": "ZeroMQ transport vs raw pyzmq on loopback; --wan real pacing accuracy",
    "step": "per-step synchronization overhead of an algorithm against compute-only and its kernel",
    "dgc": "DGC selection kernels and exchange",
}


def resolve(name: str) -> Callable[[list[str] | None], int]:
    """The entry function of benchmark ``name`` (KeyError for an unknown name)."""
    module, func = BENCHMARKS[name].split(":")
    return getattr(importlib.import_module(module), func)
