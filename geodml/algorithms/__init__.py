"""Decentralized learning algorithms, one per file (Quagmire Appendix A).

``REGISTRY`` maps ``--algo`` onto an :class:`AlgorithmFactory` (imported on demand): the
algorithm's class for BSP, local, Gaia and DGC, and geodml.algorithms.federated's
``FedAvgFamily`` for FedAvg (it composes the variants the config asks for). Every algorithm
implements the hooks of geodml.algorithms.base.Algorithm.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

from geodml import plugins
from geodml.algorithms.base import AlgoContext, Algorithm, FlatParams, LocalWork
from geodml.algorithms.knob import Knob, KnobSpec
from geodml.config import RunConfig

if TYPE_CHECKING:
    from geodml.comm.api import Comm

REGISTRY: dict[str, str] = {
    "bsp": "geodml.algorithms.bsp:BSP",
    "local": "geodml.algorithms.local:Local",
    "gaia": "geodml.algorithms.gaia:Gaia",
    "dgc": "geodml.algorithms.dgc:DGC",
    "fedavg": "geodml.algorithms.federated:FedAvgFamily",
}


class AlgorithmFactory(Protocol):
    """What REGISTRY names for each ``--algo``."""

    @property
    def KNOB(self) -> KnobSpec | None:  # noqa: N802 -- a class constant
        """The knob (name, grid) the algorithm has with default flags, known before anything is
        built: the studies plan one run per grid point. None: no communication knob."""
        ...

    def from_config(self, cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> Algorithm:
        """The algorithm ``cfg.algo`` asks for (cfg is validated), on this rank's parameters and Comm."""
        ...


def algorithm_factory(name: str) -> AlgorithmFactory:
    """The factory of ``--algo name``: geodml's own (REGISTRY), else a plugin's class (geodml.plugins:
    ``MODULE:CLASS`` or a registered entry point). KeyError for an unknown name (RunConfig rejects those first)."""
    if name in REGISTRY:
        module, attr = REGISTRY[name].split(":")
        factory: AlgorithmFactory = getattr(importlib.import_module(module), attr)
        return factory
    if not plugins.is_plugin_name("algo", name):
        raise KeyError(name)
    plugin: AlgorithmFactory = plugins.load("algo", name)
    return plugin


def build_algorithm(cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> Algorithm:
    """Instantiate the algorithm named by ``cfg.algo.algo``."""
    return algorithm_factory(cfg.algo.algo).from_config(cfg, flat=flat, comm=comm, ctx=ctx)


__all__ = ["AlgoContext", "Algorithm", "AlgorithmFactory", "FlatParams", "Knob", "KnobSpec", "LocalWork", "REGISTRY",
           "algorithm_factory", "build_algorithm"]
