"""Decentralized learning algorithms, one per file (Quagmire Appendix A).

``build_algorithm`` maps ``--algo`` onto a class; every class implements the hooks of
geodml.algorithms.base.Algorithm.
"""

from __future__ import annotations

from typing import Any

from geodml.algorithms.base import Algorithm, FlatParams
from geodml.algorithms.bsp import BSP
from geodml.config import RunConfig

REGISTRY: dict[str, type[Algorithm]] = {"bsp": BSP}


def build_algorithm(cfg: RunConfig, *, flat: FlatParams, comm: Any, steps_per_epoch: int) -> Algorithm:
    """Instantiate the algorithm named by ``cfg.algo.algo``."""
    try:
        cls = REGISTRY[cfg.algo.algo]
    except KeyError:
        raise ValueError(f"--algo {cfg.algo.algo!r} is not available in this build; choose one of {', '.join(REGISTRY)}") from None
    return cls.from_config(cfg, flat=flat, comm=comm, steps_per_epoch=steps_per_epoch)


__all__ = ["Algorithm", "FlatParams", "REGISTRY", "build_algorithm"]
