"""Decentralized learning algorithms, one per file (Quagmire Appendix A).

``build_algorithm`` maps ``--algo`` onto a class (imported on demand); every class
implements the hooks of geodml.algorithms.base.Algorithm.
"""

from __future__ import annotations

import importlib
from typing import Any

from geodml.algorithms.base import AlgoContext, Algorithm, FlatParams
from geodml.config import RunConfig

REGISTRY: dict[str, str] = {
    "bsp": "geodml.algorithms.bsp:BSP",
    "local": "geodml.algorithms.local:Local",
    "gaia": "geodml.algorithms.gaia:Gaia",
    "dgc": "geodml.algorithms.dgc:DGC",
    "fedavg": "geodml.algorithms.fedavg:FedAvg",
}


def algorithm_class(name: str) -> type[Algorithm]:
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_algorithm(cfg: RunConfig, *, flat: FlatParams, comm: Any, ctx: AlgoContext) -> Algorithm:
    """Instantiate the algorithm named by ``cfg.algo.algo``."""
    return algorithm_class(cfg.algo.algo).from_config(cfg, flat=flat, comm=comm, ctx=ctx)


__all__ = ["AlgoContext", "Algorithm", "FlatParams", "REGISTRY", "algorithm_class", "build_algorithm"]
