"""Studies: many geodml runs launched as torchrun subprocesses, then compared.

* ``oracle`` (geodml.study.oracle): the Oracle baseline of Quagmire §7.3 / Figure 8.
* ``noniid``, ``norm``, ``brn``, ``skew``, ``hparams``, ``dirichlet`` (geodml.study.paper): Quagmire Figures
  1, 5, 6, Tables 6-8, and Hsu et al. 2019 Figures 2/5, each as a table, a CSV and PNGs.
* ``skewscout`` (geodml.study.skewscout): Figure 8, Oracle and SkewScout savings per skew level.
* ``plateau`` (geodml.study.plateau): the budget those figures need, BSP-IID over doubling budgets
  until doubling gains <= 0.5 pp; ``brn`` (geodml.study.paper): Table 9, BN vs BRN under BSP.
* ``iwds`` (geodml.study.iwds): the IWDS paper's Figures 5-7, FedAvg / FedProx / FedNova with uniform
  sampling against IWDS resampling on LDA and LLT partitions of 10 clients, per seed.
* ``vanlier`` (geodml.study.vanlier): van Lier 2018, FedAvg over 1,984 clients on distributions of
  rising label entropy against centralized training, by accuracy and ROC AUC, per seed.
* geodml.study.common: what the studies share (arguments, running with ``--only``, curves, seed statistics,
  ROC AUC).
* ``hsu2019`` (geodml.study.hsu): Hsu et al. 2019, FedAvg over Dirichlet alpha and report goal C, FedAvgM's
  server momentum at a fixed effective learning rate (Figures 2, 5, 6), 100 clients x 500.
* ``hsu2020`` (geodml.study.hsu): Hsu et al. 2020, FedIR on the Dirichlet population, FedVC on imbalanced
  (Zipf-sized) clients at round and batch budgets (Table 2) and the volatility of the learning curves.
* ``lowcomm`` (geodml.study.lowcomm): the low-communication algorithms (compressed BSP, FedOpt, SCAFFOLD,
  DiLoCo, Streaming DiLoCo, gossip, HierFAVG) against BSP, Gaia, DGC and FedAvg under label skew, with
  WAN bytes, peak link rate and time to accuracy over a bandwidth sweep (docs/lowcomm.md).
* geodml.study.runner: the reusable part (launch one run, reuse finished runs, report failures).

``python -m geodml.study NAME [options]``; ``NAME --help`` shows a study's options.
"""

STUDIES = {"oracle": "geodml.study.oracle:main", "noniid": "geodml.study.paper:noniid",
           "norm": "geodml.study.paper:norm", "skew": "geodml.study.paper:skew",
           "hparams": "geodml.study.paper:hparams", "dirichlet": "geodml.study.paper:dirichlet",
           "skewscout": "geodml.study.skewscout:main", "iwds": "geodml.study.iwds:main",
           "vanlier": "geodml.study.vanlier:main", "hsu2019": "geodml.study.hsu:hsu2019",
           "hsu2020": "geodml.study.hsu:hsu2020", "brn": "geodml.study.paper:brn",
           "plateau": "geodml.study.plateau:main", "lowcomm": "geodml.study.lowcomm:main"}

__all__ = ["STUDIES"]
