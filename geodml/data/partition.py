"""Partitioners: split a training set's sample indices into one partition per rank ("data center").

Every partitioner is a pure function of ``(labels, num_partitions, rng)``: every rank calls
it with a generator seeded from the run seed and gets the same list of partitions, then keeps
its own. Each returns one sorted int64 index array per partition; the arrays are disjoint.
``iid``, ``label``, ``lda``, ``longtail`` and ``entropy`` cover every sample; ``dirichlet`` and ``shards``
drop a few samples to make sizes equal (fewer than ``num_partitions`` resp. ``num_partitions *
shards``, see below; ``dirichlet`` with ``client_size`` drops all but ``K * client_size``).
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
  clients in order 0..K-1 (``client_size`` samples each when given: Hsu et al. 2019's CIFAR-10
  setup is 100 clients x 500 images, Section 3). When a class is exhausted it is eliminated and later draws use
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
  ``alpha = C * a``. ``alpha = 0`` is the limit Hsu et al. 2019 (Section 3) describe, "each
  client holds examples from only one class chosen at random": ``q_k`` is one-hot on a class
  drawn from ``p``; if that class runs out mid-client, the client goes on with a class drawn from
  ``p`` over the classes left (exactly one class per client whenever client_size divides every
  class, e.g. 500 | 5,000 on CIFAR-10 and 500 | 6,000 on Fashion-MNIST).
  Imbalanced clients (``size_zipf`` S > 0; Hsu et al. 2020, Section 5.3, study clients of very
  different sizes, whose per-user splits are not available here): the sizes follow Zipf's
  rank-size law, the r-th largest of the K clients holding ``max(1, floor(n_1 * r**-S))``
  samples, ``n_1 = client_size`` (default: the largest ``n_1`` whose sizes fit in N), the ranks
  given to the clients in a random order (one ``rng.permutation(K)``, drawn before anything else;
  S = 0 draws nothing, so equal-size splits are unchanged). The class mix of each client is
  drawn as above. S = 1, n_1 = 3000, K = 100: 3000, 1500, 1000, 750, ..., 30 samples (15,519 in
  all), 47 local steps of B = 64 for the largest client against one for the smallest.

- ``lda`` with concentration ``alpha`` -- the per-class Dirichlet split over clients that most
  federated code bases call LDA or "hetero" (Yurochkin et al. 2019; Wang et al. 2020 (FedMA);
  NIID-Bench; FedML), and the LDA partition of IWDS (Tang et al., FTL-IJCAI'21: alpha_d 0.5 and
  0.1), defined here by the ``"hetero"`` branch of ``partition_data`` in its first author's code
  (github.com/wizard1203/GossipFL ``data_preprocessing/loader.py``, commit ae02e92c, with its
  defaults ``dirichlet_balance=False`` and ``dirichlet_min_p=None``). Unlike ``dirichlet`` the
  draw is per class, over clients, so client sizes differ. For each class c in increasing order:
  its samples in a random order, then ``p ~ Dir(alpha * 1_K)`` over the K clients; a client
  already holding ``N / K`` samples or more (N: all samples) gets no share (``p_k = 0``; the
  code's balance rule), p is renormalised, and the class is cut in client order at
  ``floor(n_c * cumsum(p))`` (the last client takes the rest). If afterwards any client holds
  fewer than C samples (C: the number of classes; the code's ``min_size < class_num``), the whole
  split is drawn again, from the same generator; after 1,000 draws it raises ``ValueError``.
  Every sample is assigned. Example: K = 2, three classes of 10 (cap 15), draws (0.9, 0.1), (0.7,
  0.3), (0.5, 0.5): class 0 cut at 9 (9 | 1), class 1 at 7 (16 | 4), class 2 all to client 1
  because client 0 holds 16 >= 15 (16 | 14). Note the convention: ``alpha`` here is the per-client
  concentration; IWDS's alpha_d is this alpha. One addition: a draw whose mass is (numerically)
  zero on every client under the cap -- possible only for a tiny alpha, where the code would
  divide 0 by 0 -- is redrawn.

- ``shards`` with ``s`` shards per partition -- McMahan et al. 2017 as described in Hsu et al.
  2019, Section 2 (Related Work): sort by label, cut into ``K * s`` shards of ``N // (K*s)`` samples each,
  give each partition ``s`` distinct random shards. Within a class the order is random (so a
  shard is a random subset of its class(es)); the ``N mod (K*s)`` leftover samples are
  dropped, chosen uniformly at random before sorting so no class is favoured.

- ``longtail`` with ``tail`` = alpha_l -- the "LLT" (label long-tail) partition of IWDS (Tang et
  al., "Data Resampling for Federated Learning with Non-IID Labels", FTL-IJCAI'21 workshop; alpha_l
  0.9 and 0.99 with 10 clients). The paper does not define it in its text; the definition here is
  the ``"long-tail"`` branch of ``partition_data`` in its first author's (Zhenheng Tang, GitHub
  wizard1203) federated code bases: github.com/wizard1203/GossipFL ``data_preprocessing/loader.py``
  (commit ae02e92c) and github.com/wizard1203/VHL ``data_preprocessing/loader.py`` (commit
  89d54f89), whose data loader also carries the paper's ``"decay_imb"`` resampler. Rule: with K
  clients and C classes (K a multiple of C, the code's 10 or 100 clients for 10 classes), class
  c's head clients are ``c, c + C, c + 2C, ...`` (``m = K / C`` of them; client k's head class
  is class ``k mod C`` in increasing order); its samples, in a random order, are cut in client
  order 0..K-1 at ``floor(n_c * cumulative share)`` (the last client takes the rest), each head
  taking share ``alpha_l / m`` and each of the other ``K - m`` clients ``(1 - alpha_l) / (K - m)``.
  K=10, n_c=900, alpha_l=0.9: the head gets 810, every other client 10. One deviation, only for
  m > 1: the authors' code sets the tail share to ``(1 - alpha_l/m) / (K - m)`` and renormalises,
  so at K=100 its ten heads hold alpha_l / (1 + alpha_l - alpha_l/m) of a class (0.497 at 0.9),
  not the alpha_l its comment states ("clients share the alpha proportion of data of one class");
  we implement the comment. At m = 1 (IWDS's 10 clients) both are the same. Every sample is
  assigned; a client that would get no sample at all raises ``ValueError``.

- ``entropy`` with ``steps`` N and a label tree -- van Lier 2018 (BSc thesis, Radboud University,
  "Robustness of Federated Averaging for Non-IID Data", Section 3.1.3 "Distribution" and 3.1.5;
  the thesis's code, github.com/stanvanlier/FedAvg_DMOZdistributions ``src/data/make_dataset.py``,
  fixes what the text leaves open: every sample draws uniformly from its client's related clients
  plus its own client listed twice, ``P = 2``). The thesis gives each client one DMOZ topic and
  places every page on the client of its (nearest assigned ancestor) topic: the minimum-entropy
  distribution d_0, with unbalanced clients; d_{i+1} moves every sample of d_i independently to
  a related client (topics linked by DMOZ relations, direction ignored), each with probability
  ``1 / (deg + 2)``, or keeps it where it is with probability ``2 / (deg + 2)``; the relation
  graph is connected, so the entropy rises towards that of a random assignment. Images have no
  sub-topics, so here (our construction, documented in ``EntropyPartitioner.clients``):
  * topics: a two-level label tree, groups of related classes (``LABEL_TREES``: Fashion-MNIST
    tops {0 T-shirt/top, 2 pullover, 4 coat, 6 shirt}, footwear {5 sandal, 7 sneaker, 9 ankle
    boot}, {1 trousers}, {3 dress}, {8 bag}; CIFAR-10 vehicles {0, 1, 8, 9}, animals {2..7};
    digits and MNIST a flat tree, one group of all classes). Each client is a sub-topic of one
    class: K >= C clients in tree order, ``K // C`` per class and one more for the first
    ``K mod C`` classes in tree order.
  * d_0: each class's samples, in a random order, go to its clients only, in unbalanced sizes:
    each client gets ``max(1, n_c // (2 n))`` (n: the class's clients) and the rest of the class
    is cut at ``n - 1`` uniformly random points (so sizes range from about half the class mean to
    a few times it; the thesis's clients are unbalanced by DMOZ's structure, at least 200 pages).
  * relations: two classes are related when they share a group or are both the first class of
    their group; clients of related classes a, b are linked ``i mod n_a`` to ``i mod n_b`` for
    ``i < max(n_a, n_b)``, and the clients of one class form a ring. The graph is connected, so
    as in the thesis every sample can reach every client; labels mix within a group before they
    mix across groups. Its walk's stationary sizes are proportional to ``deg + 2``: clients stay
    unbalanced, as in the thesis (Figure 3.2).
  ``EntropyPartitioner.distributions`` yields d_0..d_N of one chain (the thesis builds d_1..d_100
  from one d_0); ``joint_entropy`` of their label counts is the thesis's Figure 3.3 curve. A
  client emptied by the moves raises ``ValueError`` (it needs very small clients).

Entropy (``partition_report``, ``joint_entropy``): van Lier 2018 (BSc thesis, Section 3.2, Figure 3.3)
measures a distribution by the entropy of labels over clients, ``-sum Pr(k, y) log Pr(k, y)``.
We report, per partition, the Shannon entropy in bits (log base 2) of its label histogram,
``H_k = -sum_y q_ky log2 q_ky`` (0 for one class, 1.0 for two equal classes, log2(C) for
uniform over C), their unweighted mean, and the thesis's joint entropy over (partition,
label) in bits as ``joint_entropy_bits``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Protocol

import numpy as np

from geodml.config import PARTITIONS, DataConfig

__all__ = [
    "CIFAR10_TREE",
    "DirichletPartitioner",
    "EntropyPartitioner",
    "FASHION_MNIST_TREE",
    "IIDPartitioner",
    "LABEL_TREES",
    "LabelSkewPartitioner",
    "LongTailPartitioner",
    "Partitioner",
    "ShardsPartitioner",
    "format_partition_table",
    "joint_entropy",
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
    """Hsu et al.: client label mix ``q_k ~ Dir(alpha * prior)``, ``client_size`` samples each, without replacement."""

    alpha: float
    """Concentration >= 0; large -> every client matches the prior (IID), 0 -> one class per client (the limit)."""
    client_size: int | None = None
    """Samples per client (Hsu et al. 2019: 500); None: ``N // K``, every sample but the remainder.
    With ``size_zipf`` > 0: the largest client's samples (None: the largest that fits)."""
    size_zipf: float = 0.0
    """Zipf exponent S of the client sizes (rank r holds ``floor(n_1 r**-S)``); 0: equal sizes."""

    def __post_init__(self) -> None:
        if not (isinstance(self.alpha, (int, float)) and not isinstance(self.alpha, bool)
                and math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0 (0: one class per client), got {self.alpha!r}")
        if self.client_size is not None and (isinstance(self.client_size, bool)
                                             or not isinstance(self.client_size, int) or self.client_size < 1):
            raise ValueError(f"client_size must be an integer >= 1 or None (N // K), got {self.client_size!r}")
        if not (isinstance(self.size_zipf, (int, float)) and not isinstance(self.size_zipf, bool)
                and math.isfinite(self.size_zipf) and self.size_zipf >= 0):
            raise ValueError(f"size_zipf must be a finite number >= 0 (0: equal client sizes), got {self.size_zipf!r}")

    def client_sizes(self, num_samples: int, num_partitions: int, rng: np.random.Generator) -> np.ndarray:
        """The K clients' sizes: equal (``client_size`` or N // K), or with ``size_zipf`` S > 0 the Zipf
        profile ``max(1, floor(n_1 r**-S))`` over ranks r = 1..K in the order of one ``rng.permutation``."""
        if self.size_zipf == 0:
            n = num_samples // num_partitions if self.client_size is None else self.client_size
            return np.full(num_partitions, n, dtype=np.int64)
        shape = np.arange(1, num_partitions + 1, dtype=np.float64) ** -float(self.size_zipf)
        n_1 = self.client_size if self.client_size is not None else int(num_samples / shape.sum() + 1e-9)
        profile = np.maximum(1, np.floor(n_1 * shape + 1e-9)).astype(np.int64)
        return profile[rng.permutation(num_partitions)]

    def split(self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator) -> list[np.ndarray]:
        labels = _check_split_args(labels, num_partitions)
        sizes = self.client_sizes(len(labels), num_partitions, rng)
        if sizes.sum() > len(labels):
            what = (f"{num_partitions} partitions {sizes[0]} samples each" if self.size_zipf == 0 else
                    f"{num_partitions} partitions Zipf sizes (exponent {self.size_zipf:g}, largest {sizes.max()})")
            raise ValueError(f"cannot give {what} without replacement: that needs {sizes.sum()} samples and the "
                             f"training set has {len(labels)}; lower --client-size or run fewer partitions")
        classes, members = _class_members(labels, rng)
        stock = np.array([len(m) for m in members], dtype=np.int64)  # samples not yet given out
        prior = stock / stock.sum()
        taken = np.zeros(len(classes), dtype=np.int64)  # next unused position inside each class
        parts = []
        for k in range(num_partitions):
            q = self._draw(prior, rng)
            counts = np.zeros(len(classes), dtype=np.int64)
            need = int(sizes[k])
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

    def _draw(self, prior: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One ``q ~ Dir(alpha * prior)``; at alpha = 0 its limit: one-hot on a class drawn from ``prior``."""
        if self.alpha == 0:
            q = np.zeros_like(prior)
            q[rng.choice(len(prior), p=prior)] = 1.0
            return q
        # numpy rejects a zero concentration; an absurdly small alpha must not underflow to one.
        return rng.dirichlet(np.maximum(self.alpha * prior, np.finfo(np.float64).tiny))

    def _renormalized(self, q: np.ndarray, available: np.ndarray, rng: np.random.Generator,
                      prior: np.ndarray) -> np.ndarray:
        """``q`` over the classes still available, renormalised (Hsu 2020, App. B)."""
        weights = np.where(available, q, 0.0)
        total = weights.sum()
        if np.isfinite(total) and total > 0:
            return weights / total
        # q is (numerically) one-hot on exhausted classes: 0/0. Draw a fresh mix over what is left.
        fresh = np.zeros_like(q)
        fresh[available] = self._draw(prior[available] / prior[available].sum(), rng)
        total = fresh.sum()
        if np.isfinite(total) and total > 0:
            return fresh / total
        return available / available.sum()


@dataclass(frozen=True)
class LDAPartitioner:
    """Per-class ``Dir(alpha * 1_K)`` over the K clients, capped at N / K, redrawn until every client
    holds at least C samples (the IWDS authors' "hetero" LDA; unequal client sizes)."""

    alpha: float
    """Per-client concentration > 0; large -> every class spread evenly (IID), small -> few clients per class."""
    max_draws: int = 1000
    """Whole-split draws before giving up on every client holding at least C samples."""

    def __post_init__(self) -> None:
        if not (isinstance(self.alpha, (int, float)) and not isinstance(self.alpha, bool)
                and math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"alpha must be a finite number > 0 for --partition lda, got {self.alpha!r}")
        if isinstance(self.max_draws, bool) or not isinstance(self.max_draws, int) or self.max_draws < 1:
            raise ValueError(f"max_draws must be an integer >= 1, got {self.max_draws!r}")

    def split(self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator) -> list[np.ndarray]:
        labels = _check_split_args(labels, num_partitions)
        classes = np.unique(labels)
        min_size = len(classes)
        if min_size * num_partitions > len(labels):
            raise ValueError(f"--partition lda needs at least {min_size} samples (as many as classes) in each of "
                             f"{num_partitions} partitions and the training set has {len(labels)}; run fewer "
                             f"partitions")
        cap = len(labels) / num_partitions
        members = [np.flatnonzero(labels == c) for c in classes]
        for _ in range(self.max_draws):
            parts = self._draw_split(members, num_partitions, cap, rng)
            if min(len(p) for p in parts) >= min_size:
                return _finish(parts)
        raise ValueError(f"--partition lda with alpha {self.alpha:g}: after {self.max_draws} draws some partition "
                         f"still held fewer than {min_size} samples; raise --alpha or run fewer partitions")

    def _draw_split(self, members: list[np.ndarray], num_partitions: int, cap: float,
                    rng: np.random.Generator) -> list[np.ndarray]:
        """One draw of the whole split: every class in turn, cut by a capped Dirichlet share."""
        pieces: list[list[np.ndarray]] = [[] for _ in range(num_partitions)]
        sizes = np.zeros(num_partitions, dtype=np.int64)
        concentration = np.full(num_partitions, float(self.alpha))
        for m in members:
            order = rng.permutation(m)
            open_ = sizes < cap  # never all False: fewer than N samples are given out before the last class
            for _ in range(self.max_draws):
                p = rng.dirichlet(concentration) * open_
                total = p.sum()
                if np.isfinite(total) and total > 0:
                    break
            else:
                raise ValueError(f"--partition lda with alpha {self.alpha:g}: {self.max_draws} Dirichlet draws put "
                                 f"no mass on a partition that can still take samples; raise --alpha")
            cuts = (np.cumsum(p / total) * len(order)).astype(np.int64)[:-1]
            for k, piece in enumerate(np.split(order, cuts)):
                pieces[k].append(piece)
                sizes[k] += len(piece)
        return [np.concatenate(ps) for ps in pieces]


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


@dataclass(frozen=True)
class LongTailPartitioner:
    """IWDS's "LLT": each class's head client(s) hold ``tail`` of it, the other clients share the rest evenly."""

    tail: float
    """alpha_l in [0, 1]: the share of each class its head client(s) hold (IWDS: 0.9, 0.99)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.tail, (int, float)) and not isinstance(self.tail, bool)
                and math.isfinite(self.tail) and 0.0 <= self.tail <= 1.0):
            raise ValueError(f"tail must be a fraction in [0, 1] (alpha_l, the head clients' share), got {self.tail!r}")

    def shares(self, num_classes: int, num_partitions: int) -> np.ndarray:
        """``(C, K)`` matrix: the share of class index c that client k receives (each row sums to 1)."""
        if num_partitions % num_classes:
            raise ValueError(f"--partition longtail needs the number of partitions to be a multiple of the number of "
                             f"classes (every class gets the same number of head clients): {num_partitions} partitions, "
                             f"{num_classes} classes; run {num_classes * max(1, num_partitions // num_classes)} "
                             f"partitions or choose another --partition")
        heads = num_partitions // num_classes
        head = np.zeros((num_classes, num_partitions), dtype=bool)
        for c in range(num_classes):
            head[c, c::num_classes] = True  # class c's heads: clients c, c + C, c + 2C, ...
        if heads == num_partitions:  # one class: every client is a head
            return np.full((1, num_partitions), 1.0 / num_partitions)
        return np.where(head, self.tail / heads, (1.0 - self.tail) / (num_partitions - heads))

    def split(self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator) -> list[np.ndarray]:
        labels = _check_split_args(labels, num_partitions)
        classes, members = _class_members(labels, rng)
        shares = self.shares(len(classes), num_partitions)
        pieces: list[list[np.ndarray]] = [[] for _ in range(num_partitions)]
        for c, idx in enumerate(members):
            # Cut points floor(cumulative share * n_c) as the authors' code; the tolerance keeps a share
            # sum like 0.9 + 9 * (0.1 / 9) from landing a hair below an integer.
            cuts = np.floor(np.cumsum(shares[c])[:-1] * len(idx) + 1e-9).astype(np.int64)
            for k, chunk in enumerate(np.split(idx, np.minimum(cuts, len(idx)))):
                pieces[k].append(chunk)
        parts = [np.concatenate(p) for p in pieces]
        for k, part in enumerate(parts):
            if len(part) == 0:
                raise ValueError(f"longtail partition {k} would be empty: --tail {self.tail} with {len(labels)} "
                                 f"samples leaves it no sample of any class; lower --tail or run fewer partitions")
        return _finish(parts)


FASHION_MNIST_TREE: tuple[tuple[int, ...], ...] = ((0, 2, 4, 6), (5, 7, 9), (1,), (3,), (8,))
"""Fashion-MNIST's classes by kind: tops (T-shirt/top, pullover, coat, shirt), footwear (sandal,
sneaker, ankle boot), trousers, dress, bag."""
CIFAR10_TREE: tuple[tuple[int, ...], ...] = ((0, 1, 8, 9), (2, 3, 4, 5, 6, 7))
"""CIFAR-10's classes by kind: vehicles (airplane, automobile, ship, truck), animals (bird, cat,
deer, dog, frog, horse)."""
LABEL_TREES: dict[str, tuple[tuple[int, ...], ...]] = {"fashion-mnist": FASHION_MNIST_TREE, "cifar10": CIFAR10_TREE}
"""The label hierarchy ``--partition entropy`` uses per dataset; a dataset not listed (digits,
mnist: digits have no semantic grouping) gets the flat tree, one group of all classes."""

STAY_WEIGHT = 2
"""van Lier: a sample stays on its client with twice the probability of moving to any one related client."""


@dataclass(frozen=True)
class EntropyPartitioner:
    """van Lier 2018: topic-based minimum-entropy clients, then ``steps`` rounds of moving samples to related clients."""

    steps: int = 0
    """Distribution iterations: 0 is the minimum-entropy d_0; the thesis goes to d_100."""
    groups: tuple[tuple[int, ...], ...] | None = None
    """Label tree: groups of related classes, in order (``LABEL_TREES``); None: one group of all classes."""

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise ValueError(f"steps must be an integer >= 0 (distribution iterations), got {self.steps!r}")
        if self.groups is not None:
            flat = [c for g in self.groups for c in g]
            if not self.groups or any(len(g) == 0 for g in self.groups) or any(
                    isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0 for c in flat):
                raise ValueError(f"groups must be non-empty groups of non-negative integer labels, got {self.groups!r}")
            if len(set(flat)) != len(flat):
                raise ValueError(f"groups must name every label at most once, got {self.groups!r}")

    def clients(self, classes: np.ndarray, num_partitions: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """The client graph for the labels ``classes`` present: each client's class label and its related clients.

        Clients are numbered in tree order (the groups' classes in order), each class a contiguous
        block of ``K // C`` clients, the first ``K mod C`` classes one more. Related clients
        (undirected): consecutive clients of one class (a ring); and for related classes a, b
        (same group, or both the first class of their group), client ``i mod n_a`` of a with client
        ``i mod n_b`` of b for ``i < max(n_a, n_b)``. Raises ``ValueError`` when a label present is
        not in the tree or when there are fewer clients than classes.
        """
        classes = [int(c) for c in classes]
        present = set(classes)
        if self.groups is None:
            groups = [sorted(present)]
        else:
            missing = sorted(present - {c for g in self.groups for c in g})
            if missing:
                raise ValueError(f"--partition entropy: label(s) {missing} are not in the label tree {self.groups}")
            groups = [[c for c in g if c in present] for g in self.groups]
            groups = [g for g in groups if g]
        order = [c for g in groups for c in g]
        num_classes = len(order)
        if num_partitions < num_classes:
            raise ValueError(f"--partition entropy needs at least one partition per class (each client holds one "
                             f"topic): {num_partitions} partitions for {num_classes} classes; run at least "
                             f"{num_classes} partitions")
        per_class = [num_partitions // num_classes + (i < num_partitions % num_classes) for i in range(num_classes)]
        starts = np.concatenate([[0], np.cumsum(per_class)])
        block = {c: np.arange(starts[i], starts[i + 1]) for i, c in enumerate(order)}
        client_class = np.repeat(np.array(order, dtype=np.int64), per_class)
        related_classes = [(a, b) for g in groups for i, a in enumerate(g) for b in g[i + 1:]]
        heads = [g[0] for g in groups]
        related_classes += [(a, b) for i, a in enumerate(heads) for b in heads[i + 1:]]
        edges: set[tuple[int, int]] = set()
        for c in order:
            own = block[c]
            edges.update((int(own[i]), int(own[(i + 1) % len(own)])) for i in range(len(own)) if len(own) > 1)
        for a, b in related_classes:
            na, nb = len(block[a]), len(block[b])
            edges.update((int(block[a][i % na]), int(block[b][i % nb])) for i in range(max(na, nb)))
        neighbours: list[set[int]] = [set() for _ in range(num_partitions)]
        for u, v in edges:
            neighbours[u].add(v)
            neighbours[v].add(u)
        return client_class, [np.array(sorted(n), dtype=np.int64) for n in neighbours]

    def distributions(self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
        """Yield d_0, d_1, ..., d_steps: each the client of every sample (an int64 array as long as ``labels``).

        d_t for t < steps is the same array a partitioner with ``steps=t`` ends on under the same
        generator state: one chain, as the thesis builds d_1..d_100.
        """
        labels = _check_split_args(labels, num_partitions)
        classes, members = _class_members(labels, rng)
        client_class, neighbours = self.clients(classes, num_partitions)
        where = np.empty(len(labels), dtype=np.int64)
        for c, idx in zip(classes, members):
            own = np.flatnonzero(client_class == c)
            if len(idx) < len(own):
                raise ValueError(f"--partition entropy: class {int(c)} has {len(idx)} samples for its {len(own)} "
                                 f"clients (one topic each); run fewer partitions")
            # Unbalanced sizes: half the class split evenly (at least one sample each), the rest cut at
            # len(own) - 1 uniformly random points.
            base = max(1, len(idx) // (2 * len(own)))
            rest = len(idx) - base * len(own)
            cuts = np.sort(rng.integers(0, rest + 1, size=len(own) - 1))
            sizes = base + np.diff(np.concatenate([[0], cuts, [rest]]))
            where[idx] = np.repeat(own, sizes)
        yield where.copy()
        # Each client's options: its related clients once, itself STAY_WEIGHT times; a step draws one uniformly.
        width = max(len(n) for n in neighbours) + STAY_WEIGHT
        options = np.empty((num_partitions, width), dtype=np.int64)
        num_options = np.empty(num_partitions, dtype=np.int64)
        for k, n in enumerate(neighbours):
            row = np.concatenate([n, np.full(STAY_WEIGHT, k)])
            options[k, :len(row)] = row
            options[k, len(row):] = k  # padding, never drawn
            num_options[k] = len(row)
        for _ in range(self.steps):
            where = options[where, rng.integers(0, num_options[where])]
            yield where.copy()

    def split(self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator) -> list[np.ndarray]:
        where = None
        for where in self.distributions(labels, num_partitions, rng):
            pass
        assert where is not None
        order = np.argsort(where, kind="stable")
        parts = np.split(order, np.searchsorted(where[order], np.arange(1, num_partitions)))
        for k, part in enumerate(parts):
            if len(part) == 0:
                raise ValueError(f"entropy partition {k} is empty after {self.steps} steps (its samples all moved "
                                 f"away): {len(where)} samples are too few for {num_partitions} partitions; run "
                                 f"fewer partitions")
        return _finish(parts)


class PluginPartitioner:
    """A plugin's partitioner (``--partition MODULE:CLASS``), its output checked: ``num_partitions``
    pairwise disjoint index arrays into ``labels``, returned sorted as int64."""

    def __init__(self, name: str, inner: Partitioner) -> None:
        self.name = name
        self.inner = inner

    def split(self, labels: np.ndarray, num_partitions: int, rng: np.random.Generator) -> list[np.ndarray]:
        labels = _check_split_args(labels, num_partitions)
        parts = list(self.inner.split(labels, num_partitions, rng))
        if len(parts) != num_partitions:
            raise ValueError(f"--partition {self.name}: split returned {len(parts)} partitions for {num_partitions}")
        out = _finish(parts)
        flat = np.concatenate(out) if out else np.zeros(0, np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= len(labels)):
            raise ValueError(f"--partition {self.name}: split returned indices outside 0..{len(labels) - 1}")
        if len(np.unique(flat)) != len(flat):
            raise ValueError(f"--partition {self.name}: split returned partitions that share samples")
        return out


def make_partitioner(cfg: DataConfig) -> Partitioner:
    """The partitioner ``cfg.partition`` names, with its parameter from ``cfg``."""
    if cfg.partition == "iid":
        return IIDPartitioner()
    if cfg.partition == "label":
        return LabelSkewPartitioner(skew=cfg.skew)
    if cfg.partition == "dirichlet":
        return DirichletPartitioner(alpha=cfg.alpha, client_size=cfg.client_size, size_zipf=cfg.size_zipf)
    if cfg.partition == "lda":
        return LDAPartitioner(alpha=cfg.alpha)
    if cfg.partition == "longtail":
        return LongTailPartitioner(tail=cfg.tail)
    if cfg.partition == "entropy":
        return EntropyPartitioner(steps=cfg.entropy_steps, groups=LABEL_TREES.get(cfg.dataset))
    if cfg.partition == "shards":
        return ShardsPartitioner(shards_per_partition=cfg.shards_per_partition)
    if cfg.partition not in PARTITIONS:   # a plugin (geodml.plugins): its class, built from the data config
        from geodml import plugins
        cls = plugins.load("partition", cfg.partition)
        made = cls.from_config(cfg) if hasattr(cls, "from_config") else cls()
        return PluginPartitioner(cfg.partition, made)
    raise ValueError(f"--partition: unknown partitioner {cfg.partition!r}; choose one of {', '.join(PARTITIONS)}")


def _entropy_bits(counts: np.ndarray) -> float:
    return joint_entropy(counts, base=2.0)


def joint_entropy(label_counts: np.ndarray, *, base: float = 2.0) -> float:
    """van Lier 2018 (Section 3.2, Figure 3.3): ``-sum_{k,y} Pr(k, y) log Pr(k, y)``, ``Pr(k, y) = n_ky / N``.

    ``label_counts`` is the ``(K, C)`` matrix of samples of label y on client k (``partition_report``'s
    ``label_counts``); any shape works, all cells are one distribution. ``base`` 2 gives bits
    (the thesis writes ``log`` without a base; pass ``math.e`` for nats). 0 when there is no sample.
    """
    counts = np.asarray(label_counts, dtype=np.float64).reshape(-1)
    if counts.size and (not np.all(np.isfinite(counts)) or counts.min() < 0):
        raise ValueError("label_counts must be finite and non-negative")
    if not (math.isfinite(base) and base > 0 and base != 1):
        raise ValueError(f"base must be a positive number other than 1, got {base!r}")
    total = counts.sum()
    if total == 0:
        return 0.0
    q = counts[counts > 0] / total
    # max(0, .) turns the -0.0 of a one-class partition into 0.0.
    logs = np.log2(q) if base == 2 else np.log(q) / math.log(base)
    return max(0.0, float(-(q * logs).sum()))


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
