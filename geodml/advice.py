"""Settings that are valid one by one but make a run unable to measure what it prints: the
``geodml: warning:`` lines a run gives before it trains (issue "a newcomer's first hour").

:func:`run_advice` is pure: the validated config, the number of partitions, the partitions' sizes,
the topology's regions and those the partitions are placed in, and whether a ``--resume`` found a
checkpoint. The CLI prints each line on rank 0 before training; ``geodml.run`` raises each as a
``SettingWarning``. What is checked:

* a run shorter than one round of a round-based algorithm (FedAvg and its family, DiLoCo,
  SCAFFOLD, ...): the models are then averaged once, at the end, and "x fewer bytes than BSP" says
  nothing about the algorithm;
* ``--eval-every`` longer than the run: the curve is the final validation alone;
* regions of the topology that hold no partition (its WAN links carry nothing);
* ``--resume`` with no checkpoint in ``--out``: the run starts afresh (said, not silent).

Gaia's and DGC's learning rate at the default is checked where the flags are parsed
(geodml.cli: only there is it known whether ``--lr`` was given).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from geodml.config import RunConfig

__all__ = ["run_advice", "round_length"]


def round_length(cfg: RunConfig, sizes: np.ndarray) -> int | None:
    """The first round's trainer steps of a round-based algorithm (None: the algorithm has no rounds)."""
    from geodml.algorithms import algorithm_factory
    from geodml.algorithms.fedavg import FedAvg, round_steps
    from geodml.algorithms.federated import FedAvgFamily
    factory = algorithm_factory(cfg.algo.algo)
    if not (factory is FedAvgFamily or (isinstance(factory, type) and issubclass(factory, FedAvg))):
        return None
    a = cfg.fedavg
    return round_steps(sizes, rounds=1, seed=cfg.seed, client_fraction=a.client_fraction,
                       batch_size=cfg.optim.batch_size, iter_local=cfg.fedavg_iter_local(),
                       local_epochs=a.local_epochs, virtual_client_size=a.virtual_client_size)[0]


def run_advice(cfg: RunConfig, *, total_steps: int, sizes: np.ndarray, topology_regions: Sequence[str],
               placed_regions: Sequence[str], resume_found: bool | None) -> list[str]:
    """The warning lines for this run (module docstring); ``resume_found`` None: no --resume asked."""
    out: list[str] = []
    first = round_length(cfg, sizes)
    if first is not None and total_steps < first and cfg.fedavg.rounds is None:
        out.append(f"geodml: warning: the run is {total_steps} steps, shorter than one {cfg.algo.algo} round of "
                   f"{first} steps: the models are averaged once, at the end (lengthen the run or shorten the round)")
    if cfg.eval_every > total_steps and not cfg.eval_at:
        out.append(f"geodml: warning: --eval-every {cfg.eval_every} is longer than the run ({total_steps} steps): the "
                   "accuracy curve is the final validation alone")
    empty = [r for r in topology_regions if r not in set(placed_regions)]
    if empty and len(set(placed_regions)) > 0:
        out.append(f"geodml: warning: --topology has {len(topology_regions)} regions but the {len(placed_regions)} "
                   f"partitions are placed in {len(set(placed_regions))}: {', '.join(empty)} hold no data and their "
                   "links carry nothing")
    if resume_found is False:
        out.append(f"geodml: warning: --resume: no checkpoint in --out {cfg.out}: the run starts afresh")
    return out
