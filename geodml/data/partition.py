"""Partitioners: split a training set's sample indices into one partition per rank ("data center").

Every partitioner is a pure function of ``(labels, num_partitions, rng)``: every rank calls
it with a generator seeded from the run seed and gets the same list of partitions, then keeps
its own. Each returns one sorted int64 index array per partition; the arrays are disjoint.
``iid`` and ``label`` cover every sample; ``dirichlet`` and ``shards`` drop a few samples to
make sizes equal (fewer than ``num_partitions`` resp. ``num_partitions * shards``, see below).
"Classes" below are the distinct label values present, in increasing order.

- ``iid`` -- uniformly random: shuffle, cut into ``num_partitions`` parts whose sizes differ
  by at most one (the first ``N mod K`` parts get the extra sample).

- ``label`` with skew ``p`` -- the Quagmire paper (Hsieh et al., ICML 2020), Section 3,
  "Non-IID Data Partitions": "20% non-IID indicates 20% of the dataset is partitioned by
  labels, while the remaining 80% is partitioned uniformly at random". Made exact here:

  * The p-fraction is chosen per class (stratified): of class c's ``n_c`` samples, a random
    ``floor(p * n_c + 0.5)`` (round half up) form its label-partitioned part; the rest go to
    the random pool.
  * Ownership deals the classes round-robin in a random order: with ``perm`` a seeded random
    permutation of the C classes, class ``perm[i mod C]`` is owned by partition ``i mod K``
    for ``i = 0 .. max(C, K)-1`` (K partitions). The order is random so that which classes
    share a partition varies with the seed instead of always pairing, say, 0 with 5; it
    depends only on C, K and the generator, not on the skew. With K <= C each class has one
    owner and partitions own ``floor(C/K)`` or ``ceil(C/K)`` classes, the first ``C mod K``
    partitions owning one more (K=5, C=10: two classes each; K=3: 4, 3, 3 classes). With
    K > C each partition owns one class and class ``perm[c]`` is shared by partitions
    ``c, c+C, c+2C, ...``; its label-partitioned samples are split among them as evenly as
    possible, the earlier owners taking the extra sample (C=2, K=5, 10 samples per class:
    sizes 4, 5, 3, 5, 3).
  * The random pool is shuffled and cut into K parts whose sizes differ by at most one
    (the first parts get the extra sample), exactly as ``iid``.
  * p = 1 is the paper's "100% non-IID"; p = 0 is uniformly random (the sizes of ``iid``). If a partition would end up with
    no sample at all (a class smaller than its number of owners and no random pool) the
    split raises ``ValueError`` instead of handing a rank an empty partition.

- ``dirichlet`` with concentration ``alpha`` -- Hsu et al. 2019 ("Measuring the effects of
  non-identical data distribution", Section 3) and the sampling procedure of Hsu et al. 2020
  (FedVC/FedIR, Appendix B): client k draws ``q_k ~ Dir(alpha * p)`` with ``p`` the global
  label prior (class frequencies), then receives ``N // K`` samples (balanced clients, as
  Hsu's 100 clients x 500 images) drawn by class according to ``q_k`` without replacement,
  clients in order 0..K-1. When a class is exhausted it is eliminated and later draws use
  ``q_k`` renormalised over the classes that remain (Hsu 2020, App. B). Implementation: the
  client's counts are drawn as ``Multinomial(n, q)`` over available classes; draws above a
  class's remaining stock are clipped and re-drawn from the renormalised ``q`` -- the same
  distribution as drawing one sample at a time, without a Python loop per sample. Within a
  class, samples are taken in a random order. Deviations, both documented here: (1) the
  ``N mod K`` (< K) samples left after the last client are dropped; (2) if ``q_k`` puts
  exactly zero mass on every class still available (it happens for tiny alpha, where
  ``q_k`` is numerically one-hot), renormalising is 0/0, so the client draws a fresh
  ``q ~ Dir(alpha * p)`` restricted to the available classes. Note the convention: with a
  uniform prior over C classes each class's concentration is ``alpha / C`` (Hsu's
  ``Dir(alpha p)``); libraries that draw ``Dir(a * 1)`` with a per-class ``a`` match ours at
  ``alpha = C * a``.

- ``shards`` with ``s`` shards per partition -- McMahan et al. 2017 as described in Hsu et al.
  2019, Section 2 (Related Work): sort by label, cut into ``K * s`` shards of ``N // (K*s)`` samples each,
  give each partition ``s`` distinct random shards. Within a class the order is random (so a
  shard is a random subset of its class(es)); the ``N mod (K*s)`` leftover samples are
  dropped, chosen uniformly at random before sorting so no class is favoured.

Entropy (``partition_report``): van Lier 2018 (BSc thesis, Section 3.2, Figure 3.3)
measures a distribution by the entropy of labels over clients, ``-sum Pr(k, y) log Pr(k, y)``.
We report, per partition, the Shannon entropy in bits (log base 2) of its label histogram,
``H_k = -sum_y q_ky log2 q_ky`` (0 for one class, 1.0 for two equal classes, log2(C) for
uniform over C), their unweighted mean, and the thesis's joint entropy over (partition,
label) in bits as ``joint_entropy_bits``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from geodml.config import PARTITIONS, DataConfig

__all__ = [
    "DirichletPartitioner",
    "IIDPartitioner",
    "LabelSkewPartitioner",
    "Partitioner",
    "ShardsPartitioner",
    "format_partition_table",
    "make_partitioner",
    "partition_report",
]


class Partitioner(Protocol):
    """Splits sample indices into partitions; a pure function of its arguments."""

    def split(self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Return ``num_partitions`` sorted int64 index arrays into ``labels``, pairwise disjoint and non-empty.

        They cover ``range(len(labels))`` except where the partitioner documents dropped
        samples (dirichlet, shards). Raises ``ValueError`` for bad arguments (labels not a 1-D
        array of non-negative integers, ``num_partitions < 1`` or more partitions than samples).
        """
        ...


def _check_split_args(labels: np.ndarray, num_partitions: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {labels.shape}")
    if labels.dtype == np.bool_ or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"labels must be non-negative, found {int(labels.min())}")
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, (int, np.integer)) or num_partitions < 1:
        raise ValueError(f"num_partitions must be an integer >= 1 (one per process), got {num_partitions!r}")
    if num_partitions > len(labels):
        raise ValueError(f"cannot split {len(labels)} samples into {num_partitions} partitions: every partition "
                         f"needs at least one sample; run fewer processes or use a larger dataset")
    return labels


def _finish(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _class_members(labels: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, list[np.ndarray]]:
    """Classes present (ascending) and, per class, its sample indices in a random order."""
    classes = np.unique(labels)
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], classes, side="left")
    ends = np.append(bounds[1:], len(labels))
    return classes, [rng.permutation(order[b:e]) for b, e in zip(bounds, ends)]


@dataclass(frozen=True)
class IIDPartitioner:
    """Uniformly random partitions whose sizes differ by at most one."""

    def split(self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator) -> list[np.ndarray]:
        labels = _check_split_args(labels, num_partitions)
        return _finish(np.array_split(rng.permutation(len(labels)), num_partitions))


@dataclass(frozen=True)
class LabelSkewPartitioner:
    """Quagmire "x% non-IID": a fraction ``skew`` partitioned by label, the rest uniformly at random."""

    skew: float
    """Fraction in [0, 1] of each class partitioned by label (1.0 = 100% non-IID)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.skew, (int, float)) and math.isfinite(self.skew) and 0.0 <= self.skew <= 1.0):
            raise ValueError(f"skew must be a fraction in [0, 1], got {self.skew!r}")

    @staticmethod
    def owners(class_order: np.ndarray, num_partitions: int) -> list[list[int]]:
        """Owner partitions of each class index: class ``class_order[i mod C]`` pairs with partition ``i mod K``."""
        num_classes = len(class_order)
        owners: list[list[int]] = [[] for _ in range(num_classes)]
        for i in range(max(num_classes, num_partitions)):
            owners[class_order[i % num_classes]].append(i % num_partitions)
        return owners

    def split(self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator) -> list[np.ndarray]:
        labels = _check_split_args(labels, num_partitions)
        # Drawn first, so ownership is the same for every skew under one seed.
        class_order = rng.permutation(len(np.unique(labels)))
        classes, members = _class_members(labels, rng)
        owners = self.owners(class_order, num_partitions)
        pieces: list[list[np.ndarray]] = [[] for _ in range(num_partitions)]
        pool = []
        for c, idx in enumerate(members):
            # Round half up, computed once per class so the rule is the same on every rank.
            num_by_label = int(math.floor(self.skew * len(idx) + 0.5))
            for owner, chunk in zip(owners[c], np.array_split(idx[:num_by_label], len(owners[c]))):
                pieces[owner].append(chunk)
            pool.append(idx[num_by_label:])
        shuffled_pool = rng.permutation(np.concatenate(pool))
        for k, chunk in enumerate(np.array_split(shuffled_pool, num_partitions)):
            pieces[k].append(chunk)
        parts = [np.concatenate(p) for p in pieces]
        for k, part in enumerate(parts):
            if len(part) == 0:
                c = next(i for i, o in enumerate(owners) if k in o)
                raise ValueError(f"label partition {k} would be empty: class {int(classes[c])} has "
                                 f"{len(members[c])} samples for {len(owners[c])} owner partitions and skew "
                                 f"{self.skew} leaves no random pool; run fewer processes or lower --skew")
        return _finish(parts)


@dataclass(frozen=True)
class DirichletPartitioner:
    """Hsu et al.: client label mix ``q_k ~ Dir(alpha * prior)``, N // K samples each, without replacement."""

    alpha: float
    """Concentration; large -> every client matches the prior (IID), small -> one class per client."""

    def __post_init__(self) -> None:
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"alpha must be a finite number > 0, got {self.alpha!r}")

    def split(self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator) -> list[np.ndarray]:
        labels = _check_split_args(labels, num_partitions)
        classes, members = _class_members(labels, rng)
        stock = np.array([len(m) for m in members], dtype=np.int64)  # samples not yet given out
        prior = stock / stock.sum()
        taken = np.zeros(len(classes), dtype=np.int64)  # next unused position inside each class
        samples_per_client = len(labels) // num_partitions
        parts = []
        for _ in range(num_partitions):
            q = rng.dirichlet(self._concentration(prior))
            counts = np.zeros(len(classes), dtype=np.int64)
            need = samples_per_client
            while need > 0:
                available = stock - counts
                weights = self._renormalized(q, available > 0, rng, prior)
                draw = np.minimum(rng.multinomial(need, weights), available)
                counts += draw
                need -= int(draw.sum())
            parts.append(np.concatenate([m[t:t + n] for m, t, n in zip(members, taken, counts)]))
            taken += counts
            stock -= counts
        return _finish(parts)

    def _concentration(self, prior: np.ndarray) -> np.ndarray:
        # numpy rejects a zero concentration; an absurdly small alpha must not underflow to one.
        return np.maximum(self.alpha * prior, np.finfo(np.float64).tiny)

    def _renormalized(self, q: np.ndarray, available: np.ndarray, rng: np.random.Generator,
                      prior: np.ndarray) -> np.ndarray:
        """``q`` over the classes still available, renormalised (Hsu 2020, App. B)."""
        weights = np.where(available, q, 0.0)
        total = weights.sum()
        if np.isfinite(total) and total > 0:
            return weights / total
        # q is (numerically) one-hot on exhausted classes: 0/0. Draw a fresh mix over what is left.
        fresh = np.zeros_like(q)
        fresh[available] = rng.dirichlet(self._concentration(prior[available] / prior[available].sum()))
        total = fresh.sum()
        if np.isfinite(total) and total > 0:
            return fresh / total
        return available / available.sum()


@dataclass(frozen=True)
class ShardsPartitioner:
    """McMahan et al.: sort by label, cut into ``K * shards_per_partition`` equal shards, deal them out at random."""

    shards_per_partition: int = 2
    """Shards each partition receives (McMahan et al.: 2)."""

    def __post_init__(self) -> None:
        if isinstance(self.shards_per_partition, bool) or not isinstance(self.shards_per_partition, int) \
                or self.shards_per_partition < 1:
            raise ValueError(f"shards_per_partition must be an integer >= 1, got {self.shards_per_partition!r}")

    def split(self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator) -> list[np.ndarray]:
        labels = _check_split_args(labels, num_partitions)
        num_shards = num_partitions * self.shards_per_partition
        if num_shards > len(labels):
            raise ValueError(f"cannot cut {len(labels)} samples into {num_partitions} partitions x "
                             f"{self.shards_per_partition} shards = {num_shards} non-empty shards; "
                             f"lower --shards-per-partition or run fewer processes")
        shard_size = len(labels) // num_shards
        # Drop the remainder uniformly at random, then a stable sort keeps the random order within a class.
        kept = rng.permutation(len(labels))[:num_shards * shard_size]
        by_label = kept[np.argsort(labels[kept], kind="stable")]
        shards = by_label.reshape(num_shards, shard_size)
        deal = rng.permutation(num_shards).reshape(num_partitions, self.shards_per_partition)
        return _finish([shards[row].reshape(-1) for row in deal])


def make_partitioner(cfg: DataConfig) -> Partitioner:
    """The partitioner ``cfg.partition`` names, with its parameter from ``cfg``."""
    if cfg.partition == "iid":
        return IIDPartitioner()
    if cfg.partition == "label":
        return LabelSkewPartitioner(skew=cfg.skew)
    if cfg.partition == "dirichlet":
        return DirichletPartitioner(alpha=cfg.alpha)
    if cfg.partition == "shards":
        return ShardsPartitioner(shards_per_partition=cfg.shards_per_partition)
    raise ValueError(f"--partition: unknown partitioner {cfg.partition!r}; choose one of {', '.join(PARTITIONS)}")


def _entropy_bits(counts: np.ndarray) -> float:
    total = counts.sum()
    if total == 0:
        return 0.0
    q = counts[counts > 0] / total
    # max(0, .) turns the -0.0 of a one-class partition into 0.0.
    return max(0.0, float(-(q * np.log2(q)).sum()))


def partition_report(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> dict:
    """Sizes, label histograms and label entropies (bits) of ``parts``; plain Python types, JSON-ready.

    Keys: ``num_partitions``, ``num_classes``, ``sizes``, ``label_counts`` (one list of
    ``num_classes`` counts per partition), ``entropy_bits`` (per partition, base 2),
    ``mean_entropy_bits`` (unweighted mean over partitions), ``max_entropy_bits``
    (``log2(num_classes)``), ``joint_entropy_bits`` (van Lier's entropy over (partition, label)).
    """
    labels = np.asarray(labels)
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if labels.size and labels.max() >= num_classes:
        raise ValueError(f"labels go up to {int(labels.max())} but num_classes is {num_classes}")
    counts = np.stack([np.bincount(labels[np.asarray(p, dtype=np.int64)], minlength=num_classes) for p in parts]) \
        if parts else np.zeros((0, num_classes), dtype=np.int64)
    entropies = [_entropy_bits(row) for row in counts]
    return {
        "num_partitions": len(parts),
        "num_classes": int(num_classes),
        "sizes": [int(row.sum()) for row in counts],
        "label_counts": counts.astype(int).tolist(),
        "entropy_bits": entropies,
        "mean_entropy_bits": float(np.mean(entropies)) if entropies else 0.0,
        "max_entropy_bits": math.log2(num_classes),
        "joint_entropy_bits": _entropy_bits(counts.reshape(-1)),
    }


def format_partition_table(report: dict, *, top_classes: int = 3, max_rows: int = 20) -> str:
    """A compact table: one row per partition with size, entropy and its ``top_classes`` largest
    classes; beyond ``max_rows`` partitions, the first and last few rows (partitions.json has all)."""
    sizes, entropies, counts = report["sizes"], report["entropy_bits"], report["label_counts"]
    width_k = max(len("part"), len(str(max(len(sizes) - 1, 0))))
    width_n = max(len("size"), *(len(str(n)) for n in sizes)) if sizes else len("size")
    lines = [f"{'part':>{width_k}}  {'size':>{width_n}}  H[bits]  top classes (label:count)"]
    shown = list(range(len(sizes)))
    if len(sizes) > max_rows:
        shown = shown[: max_rows - 5] + shown[-5:]
    for k in shown:
        size, h, row = sizes[k], entropies[k], counts[k]
        if len(shown) < len(sizes) and k == shown[-5]:
            lines.append(f"{'...':>{width_k}}  ({len(sizes) - len(shown)} more partitions in partitions.json)")
        present = sorted(((n, c) for c, n in enumerate(row) if n > 0), key=lambda t: (-t[0], t[1]))
        top = " ".join(f"{c}:{n}" for n, c in present[:top_classes])
        more = f" +{len(present) - top_classes} more" if len(present) > top_classes else ""
        lines.append(f"{k:>{width_k}}  {size:>{width_n}}  {h:7.3f}  {top}{more}")
    lines.append(f"{report['num_partitions']} partitions, {sum(sizes)} samples, mean entropy "
                 f"{report['mean_entropy_bits']:.3f} of max {report['max_entropy_bits']:.3f} bits "
                 f"(log2 {report['num_classes']} classes)")
    return "\n".join(lines)
