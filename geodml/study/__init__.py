"""Studies: many geodml runs launched as torchrun subprocesses, then compared.

* ``oracle`` (geodml.study.oracle): the Oracle baseline of Quagmire §7.3 / Figure 8.
* geodml.study.runner: the reusable part (launch one run, reuse finished runs, report failures).

``python -m geodml.study NAME [options]``; ``NAME --help`` shows a study's options.
"""

STUDIES = {"oracle": "geodml.study.oracle:main"}

__all__ = ["STUDIES"]
