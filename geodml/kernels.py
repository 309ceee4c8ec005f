"""Which CPU selection kernels are in use: the compiled fused loops (``geodml._kernels``, built
from geodml/_kernels.c at install time when a C compiler is there) or the NumPy path.

Both compute the same float32 operations and give bit-identical results
(tests/test_kernels.py); the fused loops read each input once (docs/performance.md, Kernels).
``GEODML_NO_KERNELS=1`` forces the NumPy path (to compare, or to rule the extension out).
"""

from __future__ import annotations

import os

try:
    if os.environ.get("GEODML_NO_KERNELS", "") not in ("", "0"):
        raise ImportError("disabled by GEODML_NO_KERNELS")
    import geodml._kernels as compiled
    UNAVAILABLE_REASON = ""
except ImportError as exc:  # no compiler at install time, or disabled: the NumPy path is used
    compiled = None
    UNAVAILABLE_REASON = str(exc)


def describe() -> str:
    """One line for logs and benchmarks: which kernels run, and why not the fused ones."""
    return "fused C (geodml._kernels)" if compiled is not None else f"NumPy ({UNAVAILABLE_REASON})"
