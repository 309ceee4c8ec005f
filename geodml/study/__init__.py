"""Studies: many geodml runs launched as torchrun subprocesses, then compared.

* ``oracle`` (geodml.study.oracle): the Oracle baseline of Quagmire §7.3 / Figure 8.
* ``noniid``, ``norm``, ``skew``, ``hparams``, ``dirichlet`` (geodml.study.paper): Quagmire Figures
  1, 5, 6, Tables 6-8, and Hsu et al. 2019 Figures 2/5, each as a table, a CSV and PNGs.
* ``skewscout`` (geodml.study.skewscout): Figure 8, Oracle and SkewScout savings per skew level.
* geodml.study.runner: the reusable part (launch one run, reuse finished runs, report failures).

``python -m geodml.study NAME [options]``; ``NAME --help`` shows a study's options.
"""

STUDIES = {"oracle": "geodml.study.oracle:main", "noniid": "geodml.study.paper:noniid",
           "norm": "geodml.study.paper:norm", "skew": "geodml.study.paper:skew",
           "hparams": "geodml.study.paper:hparams", "dirichlet": "geodml.study.paper:dirichlet",
           "skewscout": "geodml.study.skewscout:main"}

__all__ = ["STUDIES"]
