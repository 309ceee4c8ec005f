"""What a plugin algorithm may use: the stable, documented surface of geodml's algorithm API.

A plugin is a class named on the command line as ``--algo MODULE:CLASS`` (or registered under the
entry-point group ``geodml.algorithms``; geodml.plugins, docs/plugins.md). Everything it needs is
imported from here; the rest of geodml may change between versions, these names will not.

**The class.** Subclass :class:`Algorithm` (vanilla momentum SGD, no communication) or one of
geodml's algorithms (:class:`FedAvg`, :class:`FedAvgM`, :class:`BSP`, :class:`Gaia`, :class:`DGC`) and override its
hooks; give it a classmethod ``from_config(cfg, *, flat, comm, ctx)`` that builds it from the run's
:class:`RunConfig` (:func:`fedavg_arguments` gives FedAvg's own constructor arguments).

* ``Algorithm``'s hooks run every step after backward: ``before_step`` (gradient exchange on
  ``flat.grad``), ``local_update`` (the SGD step), ``after_step`` (model exchange), then
  ``finish()`` once at the end; ``stats()`` adds numbers to metrics.jsonl; ``state_dict`` /
  ``load_state_dict`` are its checkpoint (every tensor it owns that changes during the run).
* ``FedAvg``'s hooks: ``write_contribution`` (this participant's message), ``sum_contributions``
  (the exchange: override it to change what goes on the wire), ``contribute`` / ``aggregate`` /
  ``server_update`` (the arithmetic of the average).

**Options.** A nested keyword-only dataclass ``Config`` whose fields are :func:`opt` fields becomes
the plugin's command-line flags, TOML keys and ``--help`` group ("algorithm MODULE:CLASS"), checked
in its ``__post_init__`` with :func:`require` (a ``ValueError`` naming the flag: one ``geodml:
error:`` line, exit 2). The run's instance is ``cfg.plugin``.

**SkewScout.** A class attribute ``KNOB = KnobSpec(name, grid)`` (grid ordered from most to least
communication) and, on the instance, ``self.knob = KNOB.bind(get=..., set=...)``: ``--skewscout``
then tunes it as it tunes Gaia's T0.

**State.** An instance is one partition: an engine process hosts many of them (P > R) and runs
them one at a time. Everything the instance assigns to ``self`` is that partition's own. What the
process's partitions may share goes through ``ctx.shared`` (:class:`ProcessShared`): ``scratch``
buffers that hold nothing across a wait on a peer, ``object``/``tensor`` values computed once per
process. Never keep per-partition state in a class attribute or a module global: partitions would
share it. Every byte between partitions goes through ``comm`` (:class:`Comm`), which charges it
to the link between their regions; ``meta_*`` calls are the emulator's uncharged bookkeeping.
Received arrays are read-only: copy them into your buffers (:func:`copy_array_into`) or add them
(:func:`add_array`, :func:`add_sparse_array`); :func:`pack_into` / :func:`unpack_from` lay a list of
tensors (weights and float buffers) into one flat message and back.
"""

from geodml.algorithms.base import AlgoContext, Algorithm, FlatParams, LocalWork, add_sparse_array, copy_array_into
from geodml.algorithms.bsp import BSP
from geodml.algorithms.dgc import DGC
from geodml.algorithms.fedavg import FedAvg, add_array, pack_into, unpack_from
from geodml.algorithms.fedavgm import FedAvgM
from geodml.algorithms.federated import fedavg_arguments
from geodml.algorithms.gaia import Gaia
from geodml.algorithms.knob import Knob, KnobSpec
from geodml.algorithms.shared import ProcessShared
from geodml.comm.api import Comm
from geodml.config import RunConfig, opt, require

__all__ = ["AlgoContext", "Algorithm", "BSP", "Comm", "DGC", "FedAvg", "FedAvgM", "FlatParams", "Gaia", "Knob", "KnobSpec",
           "LocalWork", "ProcessShared", "RunConfig", "add_array", "add_sparse_array", "copy_array_into",
           "fedavg_arguments", "opt", "pack_into", "require", "unpack_from"]
