"""geodml: an emulator for decentralized, geo-distributed deep learning over non-IID data.

Studies Hsieh et al., "The Non-IID Data Quagmire of Decentralized Machine Learning" (ICML 2020)
and the federated algorithms after it, with an exact ledger of the bytes each WAN link carries;
see README.md and docs/design.md. As a library (imported on first use, so ``import geodml`` stays
cheap):

* ``geodml.run(config) -> RunResult``: one run in this process (geodml.api);
* ``geodml.RunConfig``: the validated configuration (geodml.config);
* ``geodml.Algorithm``, ``geodml.KnobSpec``, ``geodml.Comm``, ``geodml.opt``: what a plugin
  algorithm uses (geodml.algorithm, docs/plugins.md).
"""

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {"run": "geodml.api", "RunResult": "geodml.api", "InputError": "geodml.api",
            "SettingWarning": "geodml.api", "RunConfig": "geodml.config", "Algorithm": "geodml.algorithm",
            "KnobSpec": "geodml.algorithm", "Comm": "geodml.algorithm", "opt": "geodml.algorithm"}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'geodml' has no attribute {name!r}")
