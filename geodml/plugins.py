"""Plugins: a user's algorithm, model, partitioner or dataset, loaded by name without editing geodml.

A plugin is named on the command line in one of two ways (docs/plugins.md):

* ``MODULE:ATTRIBUTE`` -- ``--algo topk_fedavg:TopKFedAvg`` imports ``topk_fedavg`` (found on
  ``sys.path``, e.g. through ``PYTHONPATH``) and takes its attribute ``TopKFedAvg``;
* a name a Python package registered under one of :data:`GROUPS`' entry-point groups
  (``[project.entry-points."geodml.algorithms"] myalgo = "mypkg.algo:MyAlgo"`` in its
  pyproject.toml): ``--algo myalgo``. geodml's own names always win over a registered one.

This module only finds and imports; what a loaded object must provide is checked by the
component that uses it (geodml.config validates, geodml.algorithms builds). Loading is cached per
process; every failure is a ``ValueError`` naming the flag, so the CLI prints one
``geodml: error:`` line and exits 2 before any process group exists.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from typing import Any

GROUPS = {"algo": "geodml.algorithms", "model": "geodml.models", "partition": "geodml.partitioners",
          "dataset": "geodml.datasets"}
"""The flag (without ``--``) -> the entry-point group its plugins are registered under."""

BUILTIN: dict[str, dict[str, str]] = {"algo": {
    "diloco": "geodml.algorithms.diloco:DiLoCo",
    "streaming-diloco": "geodml.algorithms.streaming_diloco:StreamingDiLoCo",
    "gossip": "geodml.algorithms.gossip:Gossip",
    "hierfavg": "geodml.algorithms.hierfavg:HierFAVG",
    "scaffold": "geodml.algorithms.scaffold:Scaffold",
}}
"""geodml's own algorithms written on the public plugin API (geodml.algorithm), loaded exactly as a
package's registered plugin is (their options from their ``Config``, their ``--help`` group, their
checks): ``--algo diloco``. They win over an installed package's name, as geodml's other names do."""

_LOADED: dict[tuple[str, str], Any] = {}


def is_reference(name: str) -> bool:
    """Whether ``name`` is a ``MODULE:ATTRIBUTE`` reference (not a registry or entry-point name)."""
    return isinstance(name, str) and ":" in name


def registered(flag: str) -> dict[str, importlib.metadata.EntryPoint]:
    """The entry points installed packages registered for ``--flag`` (name -> entry point)."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUPS[flag])}


def builtin(flag: str) -> dict[str, str]:
    """geodml's own plugins for ``--flag`` (name -> ``MODULE:ATTRIBUTE``; :data:`BUILTIN`)."""
    return BUILTIN.get(flag, {})


def is_plugin_name(flag: str, name: str) -> bool:
    """Whether ``--flag name`` names a plugin: a ``MODULE:ATTRIBUTE`` reference, one of geodml's own
    (:data:`BUILTIN`) or a registered name."""
    return is_reference(name) or (isinstance(name, str) and (name in builtin(flag) or name in registered(flag)))


def load(flag: str, name: str) -> Any:
    """The object ``--flag name`` names (imported once per process). ValueError, naming the flag, when
    the module cannot be imported or has no such attribute, or the name is neither a reference nor
    registered."""
    key = (flag, name)
    if key in _LOADED:
        return _LOADED[key]
    if is_reference(name) or name in builtin(flag):
        module, _, attr = builtin(flag).get(name, name).partition(":")
        where = f"--{flag} {name}"
        target = None
    else:
        ep = registered(flag).get(name)
        if ep is None:
            raise ValueError(f"--{flag}: no plugin named {name!r} (give MODULE:ATTRIBUTE, or install a package that "
                             f"registers {name!r} under the entry-point group {GROUPS[flag]!r})")
        module, _, attr = ep.value.partition(":")
        where = f"--{flag} {name} (entry point {ep.value} in group {GROUPS[flag]})"
        target = ep
    if not module or not attr:
        raise ValueError(f"{where}: expected MODULE:ATTRIBUTE such as topk_fedavg:TopKFedAvg")
    try:
        obj: Any = target.load() if target is not None else importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ValueError(f"{where}: cannot import module {exc.name or module!r} (is its directory on PYTHONPATH? "
                         f"sys.path starts {sys.path[:3]})") from None
    except Exception as exc:  # the plugin's own import failed: say where, not a traceback
        raise ValueError(f"{where}: importing {module} failed: {type(exc).__name__}: {exc}") from None
    if target is None:
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise ValueError(f"{where}: module {module} has no attribute {attr!r}")
            obj = getattr(obj, part)
    _LOADED[key] = obj
    return obj


def forget() -> None:
    """Drop the cache of loaded plugins (tests that install and remove packages)."""
    _LOADED.clear()
