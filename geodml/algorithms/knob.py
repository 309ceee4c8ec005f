"""An algorithm's communication knob: the one hyper-parameter SkewScout turns (Quagmire §7).

Gaia's significance threshold T0, FedAvg's Iter_Local (FedVC: examples per virtual client),
DGC's warm-up epochs E_warm. A knob has a name (the flag's, ``t0``), a grid of values ordered from
most to least communication (the controller walks it, Quagmire Appendix H, Tables 6-8), and
get/set on the live algorithm.

Two objects, because the grid is needed before anything is built: :class:`KnobSpec` is what the
registry's factory of an ``--algo`` declares as ``KNOB`` (geodml.algorithms.AlgorithmFactory; the
studies plan one run per grid point from it), :class:`Knob` is a spec bound to one algorithm
instance (``Algorithm.knob``; SkewScout reads and sets it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class KnobSpec:
    """A knob's name and grid, known without an algorithm instance."""

    name: str
    """The knob's name: the RunConfig field it starts from (``t0``, ``iter_local``, ``e_warm``)."""
    grid: tuple[float, ...]
    """The values SkewScout may choose, ordered from MOST to LEAST communication (index 0 sends most)."""

    def with_grid(self, values: tuple[float, ...]) -> KnobSpec:
        """This knob over other ``values`` (e.g. ``--skewscout-grid``), ordered like this grid: most communication
        first (ascending for T0 and Iter_Local, descending for E_warm). Empty ``values``: this spec unchanged."""
        if not values:
            return self
        descending = len(self.grid) > 1 and self.grid[0] > self.grid[-1]
        return KnobSpec(self.name, tuple(sorted({float(v) for v in values}, reverse=descending)))

    def bind(self, *, get: Callable[[], float], set: Callable[[float], None]) -> Knob:
        """This spec on one algorithm instance."""
        return Knob(name=self.name, grid=self.grid, get=get, set=set)


@dataclass(frozen=True)
class Knob(KnobSpec):
    """The knob of one algorithm instance.

    ``get()`` returns the value in force (a change that waits for a round boundary included), as a
    float. ``set(value)`` takes any real number the knob can hold -- not only grid points, and NumPy
    numbers too -- and raises ``ValueError`` naming the knob for one it cannot take (negative, NaN,
    None, not an integer where it counts steps or examples); the algorithm is unchanged then. When a
    new value takes effect is the algorithm's business (FedAvg: at the next round); every rank sets
    it at the same step, so every rank switches at the same point.
    """

    get: Callable[[], float]
    set: Callable[[float], None]
