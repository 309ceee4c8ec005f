"""Partitioners against counts worked out by hand (see geodml/data/partition.py for the rules)."""

import math

import numpy as np
import pytest

from geodml.config import DataConfig
from geodml.data.partition import (
    FASHION_MNIST_TREE,
    DirichletPartitioner,
    EntropyPartitioner,
    IIDPartitioner,
    LabelSkewPartitioner,
    LDAPartitioner,
    LongTailPartitioner,
    ShardsPartitioner,
    format_partition_table,
    joint_entropy,
    make_partitioner,
    partition_report,
)

TEN_BY_TEN = np.repeat(np.arange(10), 10)  # 10 classes x 10 samples, sorted by label


def rng(seed=0):
    return np.random.default_rng(seed)


def counts(labels, parts, num_classes=10):
    return np.array(partition_report(labels, parts, num_classes)["label_counts"])


def assert_disjoint_sorted(parts, n, *, cover):
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0), "each partition is sorted and free of duplicates"
        assert len(p) > 0
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "partitions are disjoint"
    assert allidx.min() >= 0 and allidx.max() < n
    if cover:
        assert len(allidx) == n


ALL = [IIDPartitioner(), LabelSkewPartitioner(1.0), LabelSkewPartitioner(0.3), DirichletPartitioner(0.5),
       ShardsPartitioner(2), LDAPartitioner(0.5)]


# ------------------------------------------------------------------ common contract


@pytest.mark.parametrize("part", ALL, ids=repr)
@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_disjoint_sorted_and_cover(part, k):
    labels = np.random.default_rng(9).integers(0, 10, size=503)
    parts = part.split(labels, k, rng())
    assert len(parts) == k
    exact_cover = isinstance(part, (IIDPartitioner, LabelSkewPartitioner, LDAPartitioner))
    assert_disjoint_sorted(parts, len(labels), cover=exact_cover)
    if isinstance(part, DirichletPartitioner):
        assert [len(p) for p in parts] == [503 // k] * k  # 503 mod k samples dropped
    if isinstance(part, ShardsPartitioner):
        assert [len(p) for p in parts] == [2 * (503 // (2 * k))] * k


@pytest.mark.parametrize("part", ALL, ids=repr)
def test_seed_stable(part):
    labels = np.random.default_rng(1).integers(0, 10, size=400)
    a = part.split(labels, 4, rng(7))
    b = part.split(labels, 4, rng(7))
    c = part.split(labels, 4, rng(8))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("part", ALL, ids=repr)
@pytest.mark.parametrize("k, match", [(0, "num_partitions must be an integer >= 1"),
                                      (-2, "num_partitions must be an integer >= 1"),
                                      (2.5, "num_partitions must be an integer >= 1"),
                                      (True, "num_partitions must be an integer >= 1"),
                                      (11, "cannot split 10 samples into 11 partitions")])
def test_bad_num_partitions(part, k, match):
    with pytest.raises(ValueError, match=match):
        part.split(np.arange(10) % 3, k, rng())


@pytest.mark.parametrize("labels, match", [(np.zeros((2, 5), dtype=int), "1-D"),
                                           (np.array([0.0, 1.0, 2.0]), "integers"),
                                           (np.array([0, -1, 2]), "non-negative")])
def test_bad_labels(labels, match):
    with pytest.raises(ValueError, match=match):
        IIDPartitioner().split(labels, 2, rng())


@pytest.mark.parametrize("make, match", [(lambda: LabelSkewPartitioner(1.5), "skew"),
                                         (lambda: LabelSkewPartitioner(-0.1), "skew"),
                                         (lambda: LabelSkewPartitioner(float("nan")), "skew"),
                                         (lambda: DirichletPartitioner(-0.1), "alpha"),
                                         (lambda: DirichletPartitioner(float("inf")), "alpha"),
                                         (lambda: LDAPartitioner(0), "alpha must be a finite number > 0"),
                                         (lambda: LDAPartitioner(float("nan")), "alpha must be a finite number > 0"),
                                         (lambda: LDAPartitioner(0.5, max_draws=0), "max_draws"),
                                         (lambda: ShardsPartitioner(0), "shards_per_partition"),
                                         (lambda: ShardsPartitioner(1.5), "shards_per_partition")])
def test_bad_parameters(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ------------------------------------------------------------------ lda (the IWDS authors' "hetero")


class ScriptedRng:
    """Stands in for the generator: permutations keep their order, Dirichlet draws come from a script."""

    def __init__(self, draws):
        self.draws = [np.asarray(d, dtype=np.float64) for d in draws]
        self.dirichlet_calls = 0

    def permutation(self, x):
        return np.array(x, copy=True)

    def dirichlet(self, concentration):
        assert len(concentration) == len(self.draws[0])
        self.dirichlet_calls += 1
        return self.draws.pop(0)


def test_lda_cuts_and_cap_by_hand():
    """The docstring's example: K = 2, three classes of 10, cap N/K = 15. Class 0 (0.9, 0.1): cut at
    floor(9.0) = 9 -> 9 | 1. Class 1 (0.7, 0.3): both under 15, cut at floor(7.0) = 7 -> 16 | 4.
    Class 2 (0.5, 0.5): client 0 holds 16 >= 15, so its share is zeroed and client 1 takes all 10."""
    labels = np.repeat(np.arange(3), 10)
    parts = LDAPartitioner(1.0).split(labels, 2, ScriptedRng([(0.9, 0.1), (0.7, 0.3), (0.5, 0.5)]))
    assert parts[0].tolist() == list(range(0, 9)) + list(range(10, 17))
    assert parts[1].tolist() == [9] + list(range(17, 20)) + list(range(20, 30))


def test_lda_redraws_whole_split_until_every_client_holds_c_samples():
    """Two classes of 4, K = 2, cap 4, C = 2. Draw 1: class 0 (0.9, 0.1) cut at floor(3.6) = 3 -> 3 | 1;
    class 1 (1, 0) cut at 4 -> 7 | 1: client 1 holds 1 < 2, so the split is drawn again. Draw 2: (0.5,
    0.5) twice -> 2 | 2 and 2 | 2."""
    labels = np.repeat(np.arange(2), 4)
    rng_ = ScriptedRng([(0.9, 0.1), (1.0, 0.0), (0.5, 0.5), (0.5, 0.5)])
    parts = LDAPartitioner(1.0).split(labels, 2, rng_)
    assert [p.tolist() for p in parts] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert rng_.dirichlet_calls == 4


def test_lda_redraws_a_share_with_no_mass_on_open_clients():
    """Three classes of 4, K = 2, cap 6. Class 0 (1, 0) -> 4 | 0; class 1 (0.5, 0.5) -> 6 | 2; class 2:
    client 0 is full, the draw (1, 0) leaves no mass on client 1 and is redrawn: (0.2, 0.8) -> 6 | 6."""
    labels = np.repeat(np.arange(3), 4)
    rng_ = ScriptedRng([(1.0, 0.0), (0.5, 0.5), (1.0, 0.0), (0.2, 0.8)])
    parts = LDAPartitioner(1.0).split(labels, 2, rng_)
    assert [p.tolist() for p in parts] == [list(range(6)), list(range(6, 12))]


def test_lda_tiny_alpha_one_whole_class_per_client():
    """alpha -> 0 makes every class's draw (numerically) one-hot; a client that takes a whole class of
    600 reaches the cap N/K = 600 and is closed, so the 10 classes land on 10 different clients."""
    labels = np.repeat(np.arange(10), 600)
    parts = LDAPartitioner(1e-6).split(labels, 10, rng(3))
    c = counts(labels, parts)
    assert sorted(c.max(axis=1).tolist()) == [600] * 10
    assert (c > 0).sum(axis=1).tolist() == [1] * 10
    assert sorted(c.argmax(axis=1).tolist()) == list(range(10))


def test_lda_huge_alpha_is_near_uniform():
    """alpha = 1e6: every share is 1/K to about 1e-3, so each client gets floor-cut pieces of 60 +- 1 of
    each 600-sample class."""
    labels = np.repeat(np.arange(10), 600)
    c = counts(labels, LDAPartitioner(1e6).split(labels, 10, rng(4)))
    assert np.abs(c - 60).max() <= 1
    assert c.sum() == 6000


def test_lda_iwds_setting_unequal_sizes_and_seeded():
    """IWDS's LDA alpha_d = 0.1 on a Fashion-MNIST-shaped set (10 classes x 6,000, 10 clients): every
    sample assigned, at least 10 per client, sizes unequal, the same split for the same seed."""
    labels = np.repeat(np.arange(10), 6000)
    a = LDAPartitioner(0.1).split(labels, 10, rng(0))
    b = LDAPartitioner(0.1).split(labels, 10, rng(0))
    assert_disjoint_sorted(a, len(labels), cover=True)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    sizes = [len(p) for p in a]
    assert min(sizes) >= 10 and max(sizes) > 6000 > min(sizes)


def test_lda_needs_c_samples_per_partition():
    labels = np.repeat(np.arange(5), 3)  # 15 samples, 5 classes: at most 3 partitions of 5
    with pytest.raises(ValueError, match="needs at least 5 samples"):
        LDAPartitioner(0.5).split(labels, 4, rng())


def test_lda_gives_up_after_max_draws():
    labels = np.repeat(np.arange(2), 4)
    with pytest.raises(ValueError, match="after 1 draws some partition"):
        LDAPartitioner(1.0, max_draws=1).split(labels, 2, ScriptedRng([(0.9, 0.1), (1.0, 0.0)]))


# ------------------------------------------------------------------ iid


def test_iid_sizes_differ_by_at_most_one():
    parts = IIDPartitioner().split(np.zeros(103, dtype=int), 5, rng())
    assert [len(p) for p in parts] == [21, 21, 21, 20, 20]  # 103 = 5*20 + 3: the first 3 get one more
    assert_disjoint_sorted(parts, 103, cover=True)


# ------------------------------------------------------------------ label skew (Quagmire)


def owned_classes(labels, k, seed, num_classes=10):
    """Classes each partition owns under ``seed``: ownership does not depend on the skew, so read it off skew 1."""
    c = counts(labels, LabelSkewPartitioner(1.0).split(labels, k, rng(seed)), num_classes)
    return [np.flatnonzero(row).tolist() for row in c]


def test_label_full_skew_two_classes_each():
    parts = LabelSkewPartitioner(1.0).split(TEN_BY_TEN, 5, rng())
    c = counts(TEN_BY_TEN, parts)
    for k in range(5):  # partition k owns exactly 2 classes, all 10 samples of each
        assert sorted(c[k][c[k] > 0].tolist()) == [10, 10]
    assert c.sum(axis=0).tolist() == [10] * 10  # every class has exactly one owner
    assert [len(p) for p in parts] == [20] * 5
    assert partition_report(TEN_BY_TEN, parts, 10)["entropy_bits"] == [1.0] * 5


def test_label_ownership_is_seeded_round_robin():
    assert LabelSkewPartitioner.owners(np.arange(10), 5) == [[0], [1], [2], [3], [4], [0], [1], [2], [3], [4]]
    assert LabelSkewPartitioner.owners(np.array([2, 0, 1]), 2) == [[1], [0], [0]]
    pairings = {tuple(map(tuple, owned_classes(TEN_BY_TEN, 5, seed))) for seed in range(5)}
    assert len(pairings) > 1, "which classes share a partition varies with the seed"


def test_label_half_skew_exact_counts():
    # Per class: floor(0.5*10 + 0.5) = 5 to its owner, 5 to the pool. Pool 50 -> 10 per partition.
    owned = owned_classes(TEN_BY_TEN, 5, seed=4)
    parts = LabelSkewPartitioner(0.5).split(TEN_BY_TEN, 5, rng(4))
    c = counts(TEN_BY_TEN, parts)
    assert [len(p) for p in parts] == [20] * 5
    assert c.sum(axis=0).tolist() == [10] * 10
    for k in range(5):
        assert len(owned[k]) == 2
        assert c[k, owned[k]].min() >= 5  # the label-partitioned half of each owned class
        assert np.delete(c[k], owned[k]).sum() <= 10  # foreign classes only come from the pool


def test_label_quarter_skew_rounds_half_up():
    # floor(0.25*10 + 0.5) = 3 per class to its owner (2.5 rounds up); pool 70 -> 14 per partition.
    owned = owned_classes(TEN_BY_TEN, 5, seed=5)
    parts = LabelSkewPartitioner(0.25).split(TEN_BY_TEN, 5, rng(5))
    c = counts(TEN_BY_TEN, parts)
    assert [len(p) for p in parts] == [20] * 5
    for k in range(5):
        assert c[k, owned[k]].min() >= 3
        assert np.delete(c[k], owned[k]).sum() <= 14


def test_label_partial_skew_proportions_large():
    # 10 classes x 1000, K=5, skew 0.5: an owned class holds 500 (label part) + 500/5 (pool) = 600
    # in expectation, a foreign class 100; the pool split makes the deviations hypergeometric (sd < 10).
    labels = np.repeat(np.arange(10), 1000)
    owned = owned_classes(labels, 5, seed=3)
    c = counts(labels, LabelSkewPartitioner(0.5).split(labels, 5, rng(3)))
    for k in range(5):
        assert np.all(np.abs(c[k, owned[k]] - 600) < 50)
        assert np.all(np.abs(np.delete(c[k], owned[k]) - 100) < 50)


def test_label_k_not_dividing_classes_round_robin():
    # K=3, C=10: partition 0 owns ceil(10/3) = 4 classes, partitions 1 and 2 floor = 3 each.
    parts = LabelSkewPartitioner(1.0).split(TEN_BY_TEN, 3, rng())
    c = counts(TEN_BY_TEN, parts)
    assert [int((row > 0).sum()) for row in c] == [4, 3, 3]
    assert c.sum(axis=0).tolist() == [10] * 10 and set(c[c > 0].tolist()) == {10}
    assert [len(p) for p in parts] == [40, 30, 30]


def test_label_k_not_dividing_with_pool():
    # skew 0.5, K=3: label parts 4*5=20, 3*5=15, 3*5=15; pool 50 -> 17, 17, 16.
    parts = LabelSkewPartitioner(0.5).split(TEN_BY_TEN, 3, rng())
    assert [len(p) for p in parts] == [37, 32, 31]


def test_label_more_partitions_than_classes_share_classes():
    # C=2, K=5: partitions 0,2,4 share one class (10 samples -> 4,3,3), partitions 1,3 the other (5,5).
    labels = np.repeat(np.arange(2), 10)
    for seed in range(4):
        parts = LabelSkewPartitioner(1.0).split(labels, 5, rng(seed))
        c = counts(labels, parts, 2)
        assert [len(p) for p in parts] == [4, 5, 3, 5, 3]
        first = int(np.argmax(c[0]))
        assert [int(np.argmax(row)) for row in c] == [first, 1 - first, first, 1 - first, first]
        assert np.all((c > 0).sum(axis=1) == 1)


def test_label_twenty_partitions_ten_classes():
    # K=20, C=10: each class is shared by partitions k and k+10, 5 samples each.
    parts = LabelSkewPartitioner(1.0).split(TEN_BY_TEN, 20, rng())
    c = counts(TEN_BY_TEN, parts)
    for k in range(10):
        assert np.flatnonzero(c[k]).tolist() == np.flatnonzero(c[k + 10]).tolist()
        assert c[k].max() == 5 and (c[k] > 0).sum() == 1
    assert c.sum(axis=0).tolist() == [10] * 10


def test_label_zero_skew_is_uniform():
    parts = LabelSkewPartitioner(0.0).split(np.repeat(np.arange(10), 103), 5, rng())
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1030


def test_label_empty_partition_is_an_error():
    # C=2, K=4: class 1 has one sample but two owners (partitions 0 and 2, or 1 and 3, depending on
    # the seeded class order); with skew 1 there is no pool, so its second owner gets nothing.
    with pytest.raises(ValueError, match=r"label partition [23] would be empty"):
        LabelSkewPartitioner(1.0).split(np.array([0, 0, 0, 1]), 4, rng())


# ------------------------------------------------------------------ dirichlet (Hsu et al.)


def test_dirichlet_balanced_sizes_drop_remainder():
    labels = np.random.default_rng(2).integers(0, 10, size=1003)
    parts = DirichletPartitioner(0.3).split(labels, 5, rng())
    assert [len(p) for p in parts] == [200] * 5  # 1003 // 5; 3 samples dropped
    assert_disjoint_sorted(parts, 1003, cover=False)


def test_dirichlet_huge_alpha_matches_prior():
    labels = np.repeat(np.arange(10), 1000)
    parts = DirichletPartitioner(1e6).split(labels, 5, rng())
    report = partition_report(labels, parts, 10)
    c = np.array(report["label_counts"])
    # q ~ prior = 0.1 each; 2000 draws per client: mean 200, sd ~ 13.4.
    assert np.all(np.abs(c - 200) < 70)
    assert report["mean_entropy_bits"] > 3.25


def test_dirichlet_huge_alpha_follows_imbalanced_prior():
    labels = np.array([0] * 9000 + [1] * 1000)
    c = counts(labels, DirichletPartitioner(1e6).split(labels, 5, rng()), 2)
    assert np.all(np.abs(c[:, 0] - 1800) < 80) and np.all(np.abs(c[:, 1] - 200) < 80)


def test_dirichlet_tiny_alpha_one_class_per_client():
    labels = np.repeat(np.arange(10), 100)
    parts = DirichletPartitioner(1e-3).split(labels, 50, rng())
    c = counts(labels, parts)
    top_fraction = c.max(axis=1) / c.sum(axis=1)
    assert np.median(top_fraction) == 1.0
    assert top_fraction.mean() > 0.9
    assert partition_report(labels, parts, 10)["mean_entropy_bits"] < 0.3


def test_dirichlet_exhausted_classes_are_renormalized_away():
    # Class 1 has 5 samples; whatever q says, every client gets its 50 and class 1 is never overdrawn.
    labels = np.array([0] * 95 + [1] * 5)
    for seed in range(20):
        parts = DirichletPartitioner(0.01).split(labels, 2, rng(seed))
        assert [len(p) for p in parts] == [50, 50]
        assert_disjoint_sorted(parts, 100, cover=True)


def test_dirichlet_client_size_hsu_setup():
    # Hsu et al. 2019: 100 clients x 500 images, without replacement; Fashion-MNIST has 60,000 so 10,000 stay unused.
    labels = np.repeat(np.arange(10), 6000)
    parts = DirichletPartitioner(0.1, client_size=500).split(labels, 100, rng())
    assert [len(p) for p in parts] == [500] * 100
    assert_disjoint_sorted(parts, len(labels), cover=False)


def test_dirichlet_client_size_needs_enough_samples():
    with pytest.raises(ValueError, match="needs 1010 samples and the training set has 1000; lower --client-size"):
        DirichletPartitioner(0.5, client_size=101).split(TEN_BY_TEN.repeat(10), 10, rng())


def test_dirichlet_alpha_zero_one_class_per_client():
    # 10 classes x 50, 100 clients x 5: 5 divides 50, so no class runs out inside a client.
    labels = np.repeat(np.arange(10), 50)
    for seed in range(3):
        parts = DirichletPartitioner(0.0, client_size=5).split(labels, 100, rng(seed))
        c = counts(labels, parts)
        assert np.all((c > 0).sum(axis=1) == 1) and np.all(c.sum(axis=1) == 5)
        assert c.sum(axis=0).tolist() == [50] * 10  # every sample given out once: the population is the whole set
        assert partition_report(labels, parts, 10)["mean_entropy_bits"] == 0.0


def test_dirichlet_alpha_zero_is_seeded_and_random():
    labels = np.repeat(np.arange(10), 50)

    def client_classes(seed):
        c = counts(labels, DirichletPartitioner(0.0, client_size=5).split(labels, 100, rng(seed)))
        return np.argmax(c, axis=1).tolist()

    assert client_classes(0) == client_classes(0) != client_classes(1)


@pytest.mark.parametrize("size", [0, -5, 2.5, True])
def test_dirichlet_bad_client_size(size):
    with pytest.raises(ValueError, match="client_size must be an integer >= 1"):
        DirichletPartitioner(0.5, client_size=size)


# ------------------------------------------------------------------ longtail (IWDS's LLT)


def test_longtail_iwds_ten_clients_hand_counts():
    # K=10, C=10, 900 per class: the head (client c for class c) gets 0.9 * 900 = 810, the
    # other 9 clients (1 - 0.9) / 9 * 900 = 10 each; at 0.99: 891 and 1.
    labels = np.repeat(np.arange(10), 900)
    for tail, head, rest in [(0.9, 810, 10), (0.99, 891, 1)]:
        parts = LongTailPartitioner(tail).split(labels, 10, rng())
        c = counts(labels, parts)
        assert np.array_equal(c, np.where(np.eye(10, dtype=bool), head, rest))
        assert_disjoint_sorted(parts, len(labels), cover=True)


def test_longtail_floor_cuts_last_client_takes_rest():
    # 100 per class, tail 0.9: tail share 0.1/9*100 = 1.11 per client; cut points floor(cumulative):
    # class 0 -> head 90, clients 1..8 one each (floor(90 + 1.11 j)), client 9 the remaining 2;
    # class 9 -> clients 0..8 at floor(1.11 j) = 1, 2, ..., 8, 10 (9 * 1.11 = 10), so client 8 gets 2,
    # and the head, client 9, the rest: 90.
    c = counts(TEN_BY_TEN.repeat(10), LongTailPartitioner(0.9).split(TEN_BY_TEN.repeat(10), 10, rng()))
    assert c[:, 0].tolist() == [90, 1, 1, 1, 1, 1, 1, 1, 1, 2]
    assert c[:, 9].tolist() == [1, 1, 1, 1, 1, 1, 1, 1, 2, 90]
    assert c.sum(axis=0).tolist() == [100] * 10


def test_longtail_twenty_clients_two_heads_share_alpha():
    # K=20, C=10: heads of class c are clients c and c+10, 0.9/2 each of 1800 = 810; the 18 others
    # (1 - 0.9) / 18 * 1800 = 10 each.
    labels = np.repeat(np.arange(10), 1800)
    c = counts(labels, LongTailPartitioner(0.9).split(labels, 20, rng()))
    for k in range(20):
        assert c[k, k % 10] == 810 and np.delete(c[k], k % 10).tolist() == [10] * 9


def test_longtail_shares_hand_numbers():
    s = LongTailPartitioner(0.9).shares(2, 4)  # heads: class 0 -> clients 0, 2; class 1 -> clients 1, 3
    assert np.allclose(s, [[0.45, 0.05, 0.45, 0.05], [0.05, 0.45, 0.05, 0.45]])
    assert np.allclose(LongTailPartitioner(0.3).shares(1, 3), [[1 / 3] * 3])


def test_longtail_extremes():
    labels = np.repeat(np.arange(10), 900)
    full = counts(labels, LongTailPartitioner(1.0).split(labels, 10, rng()))
    assert np.array_equal(full, 900 * np.eye(10, dtype=int))  # one class per client
    flat = counts(labels, LongTailPartitioner(0.1).split(labels, 10, rng()))
    assert np.all(flat == 90)  # alpha_l = 1/C: the head's share equals everyone's


def test_longtail_covers_and_is_seeded():
    labels = np.random.default_rng(3).integers(0, 10, size=2003)
    a = LongTailPartitioner(0.9).split(labels, 20, rng(5))
    b = LongTailPartitioner(0.9).split(labels, 20, rng(5))
    c = LongTailPartitioner(0.9).split(labels, 20, rng(6))
    assert_disjoint_sorted(a, len(labels), cover=True)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    assert np.array_equal(counts(labels, a), counts(labels, c))  # the counts are fixed; which samples is random


def test_longtail_needs_multiple_of_classes():
    with pytest.raises(ValueError, match="multiple of the number of classes.*15 partitions, 10 classes"):
        LongTailPartitioner(0.9).split(TEN_BY_TEN, 15, rng())


def test_longtail_empty_partition_is_an_error():
    # Class 0 has one sample and two heads (0 and 10); tail 1.0: client 0 gets nothing of any class.
    labels = np.concatenate([[0], np.repeat(np.arange(1, 10), 4)])
    with pytest.raises(ValueError, match="longtail partition 0 would be empty"):
        LongTailPartitioner(1.0).split(labels, 20, rng())


@pytest.mark.parametrize("tail", [-0.1, 1.5, float("nan"), True, "0.9"])
def test_longtail_bad_tail(tail):
    with pytest.raises(ValueError, match="tail must be a fraction in"):
        LongTailPartitioner(tail)


# ------------------------------------------------------------------ entropy (van Lier 2018)


def test_joint_entropy_hand_numbers():
    assert joint_entropy(np.array([[2, 2, 0], [0, 0, 4]])) == pytest.approx(1.5)  # 1/4, 1/4, 1/2
    assert joint_entropy(np.array([[2, 2, 0], [0, 0, 4]]), base=math.e) == pytest.approx(1.5 * math.log(2))
    assert joint_entropy(np.ones((2, 2))) == pytest.approx(2.0)  # four equal cells
    assert joint_entropy(np.array([[3, 0], [1, 0]])) == pytest.approx(0.75 * math.log2(4 / 3) + 0.25 * 2)  # 0.8113
    assert joint_entropy(np.array([[5]])) == 0.0
    assert joint_entropy(np.zeros((3, 2))) == 0.0


@pytest.mark.parametrize("counts_, base, match", [(np.array([[1, -1]]), 2.0, "non-negative"),
                                                  (np.array([[1.0, np.nan]]), 2.0, "finite"),
                                                  (np.ones((2, 2)), 1.0, "base must be")])
def test_joint_entropy_bad_input(counts_, base, match):
    with pytest.raises(ValueError, match=match):
        joint_entropy(counts_, base=base)


def test_entropy_fashion_mnist_graph_one_client_per_class():
    # Tree order 0 2 4 6 | 5 7 9 | 1 | 3 | 8 -> clients 0..9. Related classes: within a group, and the
    # groups' first classes 0, 5, 1, 3, 8 with each other.
    client_class, nb = EntropyPartitioner(0, FASHION_MNIST_TREE).clients(np.arange(10), 10)
    assert client_class.tolist() == [0, 2, 4, 6, 5, 7, 9, 1, 3, 8]
    assert [n.tolist() for n in nb] == [
        [1, 2, 3, 4, 7, 8, 9],  # class 0: tops 2, 4, 6; heads 5, 1, 3, 8
        [0, 2, 3], [0, 1, 3], [0, 1, 2],  # classes 2, 4, 6: the other tops
        [0, 5, 6, 7, 8, 9],  # class 5: footwear 7, 9; heads 0, 1, 3, 8
        [4, 6], [4, 5],  # classes 7, 9: the other footwear
        [0, 4, 8, 9], [0, 4, 7, 9], [0, 4, 7, 8],  # trousers, dress, bag: the other heads
    ]


def test_entropy_graph_uneven_clients_per_class():
    # K=12: the first two classes in tree order (0, 2) get two clients each: 0 -> {0, 1}, 2 -> {2, 3},
    # 4 -> 4, 6 -> 5, 5 -> 6, 7 -> 7, 9 -> 8, 1 -> 9, 3 -> 10, 8 -> 11. Class 0's clients form a ring
    # (0-1) and pair i mod 2 with i mod n of each related class: 0-2, 1-3; 0-4, 1-4; 0-5, 1-5; ...
    client_class, nb = EntropyPartitioner(0, FASHION_MNIST_TREE).clients(np.arange(10), 12)
    assert client_class.tolist() == [0, 0, 2, 2, 4, 6, 5, 7, 9, 1, 3, 8]
    assert nb[0].tolist() == [1, 2, 4, 5, 6, 9, 10, 11]
    assert nb[1].tolist() == [0, 3, 4, 5, 6, 9, 10, 11]
    assert nb[3].tolist() == [1, 2, 4, 5]
    assert nb[6].tolist() == [0, 1, 7, 8, 9, 10, 11]


def test_entropy_flat_tree_is_complete_over_classes():
    client_class, nb = EntropyPartitioner(0).clients(np.array([3, 5, 7]), 3)
    assert client_class.tolist() == [3, 5, 7]
    assert [n.tolist() for n in nb] == [[1, 2], [0, 2], [0, 1]]


def test_entropy_d0_is_one_topic_per_client():
    # steps 0, one client per class: d_0 is the split by label, whatever the seed.
    labels = np.array([0, 0, 0, 1])
    for seed in range(3):
        parts = EntropyPartitioner(0).split(labels, 2, rng(seed))
        assert [p.tolist() for p in parts] == [[0, 1, 2], [3]]
        r = partition_report(labels, parts, 2)
        assert r["entropy_bits"] == [0.0, 0.0]
        assert r["joint_entropy_bits"] == pytest.approx(0.75 * math.log2(4 / 3) + 0.25 * 2)  # 0.811 bits


def test_entropy_d0_unbalanced_sizes():
    # One class of 100 on 4 clients: each gets 100 // 8 = 12, the other 52 are cut at 3 random points.
    labels = np.zeros(100, dtype=int)
    sizes = {tuple(len(p) for p in EntropyPartitioner(0).split(labels, 4, rng(s))) for s in range(10)}
    assert all(sum(t) == 100 and min(t) >= 12 for t in sizes)
    assert len(sizes) > 1 and any(max(t) - min(t) > 10 for t in sizes)


def test_entropy_one_step_hand_probabilities():
    # Two classes, two clients, one relation: a sample picks from [other, self, self], so it moves with
    # probability 1/3 (after two steps 2 * 1/3 * 2/3 = 4/9). Pr(k, y) after one step: 1/3, 1/6, 1/6, 1/3
    # -> H = 2/3 log2 3 + 1/3 log2 6 = 1.9183 bits.
    n = 30000
    labels = np.repeat([0, 1], n)
    chain = list(EntropyPartitioner(2).distributions(labels, 2, rng()))
    assert len(chain) == 3 and np.array_equal(chain[0], labels)
    moved1, moved2 = np.mean(chain[1] != labels), np.mean(chain[2] != labels)
    assert abs(moved1 - 1 / 3) < 0.015 and abs(moved2 - 4 / 9) < 0.015
    c1 = np.array([[np.sum((chain[1] == k) & (labels == y)) for y in (0, 1)] for k in (0, 1)])
    assert joint_entropy(c1) == pytest.approx(2 / 3 * math.log2(3) + 1 / 3 * math.log2(6), abs=0.01)


def test_entropy_chain_prefix_and_seed():
    labels = np.random.default_rng(4).integers(0, 10, size=1500)
    chain = list(EntropyPartitioner(8, FASHION_MNIST_TREE).distributions(labels, 20, rng(3)))
    for steps in (0, 3, 8):  # d_t of a longer chain is what a steps=t partitioner ends on
        parts = EntropyPartitioner(steps, FASHION_MNIST_TREE).split(labels, 20, rng(3))
        assert all(np.array_equal(p, np.flatnonzero(chain[steps] == k)) for k, p in enumerate(parts))
        assert_disjoint_sorted(parts, len(labels), cover=True)
    other = EntropyPartitioner(8, FASHION_MNIST_TREE).split(labels, 20, rng(4))
    assert not all(np.array_equal(np.flatnonzero(chain[8] == k), p) for k, p in enumerate(other))


def test_entropy_rises_and_mixes_within_groups_first():
    labels = np.repeat(np.arange(10), 300)
    chain = list(EntropyPartitioner(20, FASHION_MNIST_TREE).distributions(labels, 30, rng()))
    h = [joint_entropy(np.stack([np.bincount(labels[d == k], minlength=10) for k in range(30)])) for d in chain]
    sizes = np.bincount(chain[0], minlength=30)
    assert h[0] == pytest.approx(joint_entropy(sizes))  # d_0: one label per client, H = H(sizes)
    assert h[0] < h[1] < h[5] < h[20] <= math.log2(30) + math.log2(10)
    # Class 7 (sneaker) is not its group's first class: after one step its clients hold footwear only.
    client_class, _ = EntropyPartitioner(0, FASHION_MNIST_TREE).clients(np.arange(10), 30)
    on_sneaker_clients = labels[np.isin(chain[1], np.flatnonzero(client_class == 7))]
    assert set(on_sneaker_clients.tolist()) <= {5, 7, 9} and len(set(on_sneaker_clients.tolist())) == 3


def test_entropy_report_of_split():
    labels = np.repeat(np.arange(10), 60)
    r = partition_report(labels, EntropyPartitioner(0, FASHION_MNIST_TREE).split(labels, 10, rng()), 10)
    assert r["entropy_bits"] == [0.0] * 10 and r["joint_entropy_bits"] == pytest.approx(math.log2(10))


def test_entropy_emptied_partition_is_an_error():
    # Two samples, two clients: after one step both sit on one client with probability 2 * 1/3 * 2/3.
    outcomes = []
    for seed in range(20):
        try:
            parts = EntropyPartitioner(1).split(np.array([0, 1]), 2, rng(seed))
            outcomes.append([p.tolist() for p in parts])
        except ValueError as exc:
            assert "is empty after 1 steps" in str(exc) and "run fewer partitions" in str(exc)
            outcomes.append(None)
    assert None in outcomes and [[0], [1]] in outcomes and [[1], [0]] in outcomes


@pytest.mark.parametrize("make, match", [
    (lambda: EntropyPartitioner(-1), "steps must be an integer >= 0"),
    (lambda: EntropyPartitioner(2.0), "steps must be an integer >= 0"),
    (lambda: EntropyPartitioner(True), "steps must be an integer >= 0"),
    (lambda: EntropyPartitioner(1, ((0, 1), (1, 2))), "at most once"),
    (lambda: EntropyPartitioner(1, ((0, 1), ())), "non-empty groups"),
    (lambda: EntropyPartitioner(1, ((0, -1),)), "non-negative integer"),
])
def test_entropy_bad_parameters(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("labels, k, groups, match", [
    (TEN_BY_TEN, 5, None, "at least one partition per class.*5 partitions for 10 classes"),
    (TEN_BY_TEN, 10, ((0, 1, 2),), r"label\(s\) \[3, 4, 5, 6, 7, 8, 9\] are not in the label tree"),
    (np.array([0, 0, 0, 1]), 4, None, "class 1 has 1 samples for its 2 clients"),  # K=4, C=2: two clients each
])
def test_entropy_bad_split(labels, k, groups, match):
    with pytest.raises(ValueError, match=match):
        EntropyPartitioner(0, groups).split(labels, k, rng())


# ------------------------------------------------------------------ shards (McMahan et al.)


def test_shards_two_classes_of_ten_each():
    parts = ShardsPartitioner(2).split(TEN_BY_TEN, 5, rng())
    c = counts(TEN_BY_TEN, parts)
    for k in range(5):  # 10 shards of 10 = one class each; partition k gets 2 distinct shards
        assert sorted(c[k][c[k] > 0].tolist()) == [10, 10]
    assert c.sum(axis=0).tolist() == [10] * 10


def test_shards_are_contiguous_label_runs():
    labels = np.arange(100)  # every sample its own label: a shard is a run of 10 consecutive labels
    parts = ShardsPartitioner(2).split(labels, 5, rng())
    starts = []
    for p in parts:
        runs = labels[p].reshape(2, 10)
        for run in runs:
            assert run[0] % 10 == 0 and np.array_equal(run, np.arange(run[0], run[0] + 10))
            starts.append(int(run[0]))
    assert sorted(starts) == list(range(0, 100, 10))


def test_shards_equal_sizes_drop_remainder():
    parts = ShardsPartitioner(3).split(np.repeat(np.arange(10), 10), 5, rng())
    assert [len(p) for p in parts] == [18] * 5  # 15 shards of 100 // 15 = 6; 10 samples dropped


def test_shards_need_enough_samples():
    with pytest.raises(ValueError, match="10 non-empty shards"):
        ShardsPartitioner(2).split(np.arange(9), 5, rng())


# ------------------------------------------------------------------ factory, report, table


@pytest.mark.parametrize("cfg, expected", [
    (DataConfig(partition="iid"), IIDPartitioner()),
    (DataConfig(partition="label", skew=0.2), LabelSkewPartitioner(0.2)),
    (DataConfig(partition="dirichlet", alpha=0.1), DirichletPartitioner(0.1)),
    (DataConfig(partition="shards", shards_per_partition=3), ShardsPartitioner(3)),
    (DataConfig(partition="dirichlet", alpha=0, client_size=500), DirichletPartitioner(0, client_size=500)),
    (DataConfig(partition="longtail", tail=0.99), LongTailPartitioner(0.99)),
    (DataConfig(partition="lda", alpha=0.1), LDAPartitioner(0.1)),
    (DataConfig(partition="entropy", entropy_steps=7, dataset="fashion-mnist"), EntropyPartitioner(7, FASHION_MNIST_TREE)),
    (DataConfig(partition="entropy", dataset="digits"), EntropyPartitioner(0, None)),
])
def test_make_partitioner(cfg, expected):
    assert make_partitioner(cfg) == expected


def test_report_hand_numbers():
    labels = np.array([0, 0, 1, 1, 2, 2, 2, 2])
    parts = [np.array([0, 1, 2, 3]), np.array([4, 5, 6, 7])]
    r = partition_report(labels, parts, 3)
    assert r["num_partitions"] == 2
    assert r["sizes"] == [4, 4]
    assert r["label_counts"] == [[2, 2, 0], [0, 0, 4]]
    assert r["entropy_bits"] == [1.0, 0.0]  # two equal classes: 1 bit; one class: 0
    assert r["mean_entropy_bits"] == 0.5
    assert r["max_entropy_bits"] == pytest.approx(math.log2(3))
    # van Lier's joint entropy: Pr(k, y) = 1/4, 1/4, 1/2 -> 0.5 + 0.5 + 0.5 = 1.5 bits
    assert r["joint_entropy_bits"] == pytest.approx(1.5)


def test_report_uniform_ten_classes_is_log2_10():
    r = partition_report(TEN_BY_TEN, [np.arange(100)], 10)
    assert r["entropy_bits"][0] == pytest.approx(math.log2(10))
    assert r["max_entropy_bits"] == pytest.approx(math.log2(10))


def test_report_rejects_labels_beyond_num_classes():
    with pytest.raises(ValueError, match="num_classes"):
        partition_report(np.array([0, 5]), [np.array([0, 1])], 3)


def test_format_table():
    labels = np.array([0, 0, 1, 1, 2, 2, 2, 2])
    r = partition_report(labels, [np.array([0, 1, 2, 3]), np.array([4, 5, 6, 7])], 3)
    lines = format_partition_table(r).splitlines()
    assert len(lines) == 2 + 2  # header, one row per partition, footer
    assert lines[1].split() == ["0", "4", "1.000", "0:2", "1:2"]
    assert lines[2].split() == ["1", "4", "0.000", "2:4"]
    assert "mean entropy 0.500 of max 1.585 bits" in lines[3]
    many = partition_report(TEN_BY_TEN, [np.arange(100)], 10)
    assert "+7 more" in format_partition_table(many)


# ---- imbalanced client sizes (--size-zipf, for Hsu et al. 2020's FedVC study) -----------------------

def test_dirichlet_size_zipf_profile_by_hand():
    # S = 1, n_1 = 12, K = 4: floor(12/1), floor(12/2), floor(12/3), floor(12/4) = 12, 6, 4, 3, in permutation order.
    labels = np.repeat(np.arange(10), 10)
    part = DirichletPartitioner(1.0, client_size=12, size_zipf=1.0)
    perm = rng(7).permutation(4)  # the first draw of the split's generator
    parts = part.split(labels, 4, rng(7))
    assert [len(p) for p in parts] == [[12, 6, 4, 3][r] for r in perm]
    assert_disjoint_sorted(parts, len(labels), cover=False)
    # S = 0.5: floor(9 / sqrt(r)) for r = 1..4 = 9, 6, 5, 4; the smallest client keeps at least one sample
    assert sorted(DirichletPartitioner(1.0, client_size=9, size_zipf=0.5).client_sizes(100, 4, rng()), reverse=True) \
        == [9, 6, 5, 4]
    assert DirichletPartitioner(1.0, client_size=2, size_zipf=3.0).client_sizes(100, 3, rng()).min() == 1


def test_dirichlet_size_zipf_fashion_mnist_population():
    # the hsu2020 study's population: 100 clients, largest 3000 (iNaturalist-Geo-3k's cap), S = 1
    labels = np.repeat(np.arange(10), 6000)
    parts = DirichletPartitioner(1.0, client_size=3000, size_zipf=1.0).split(labels, 100, rng())
    sizes = sorted((len(p) for p in parts), reverse=True)
    assert sizes[:4] == [3000, 1500, 1000, 750] and sizes[-1] == 30 and sum(sizes) == sum(3000 // r for r in range(1, 101))
    assert math.ceil(sizes[0] / 64) == 47 and math.ceil(sizes[-1] / 64) == 1   # local steps at E = 1, B = 64
    assert_disjoint_sorted(parts, len(labels), cover=False)


def test_dirichlet_size_zipf_default_largest_fits_and_zero_is_unchanged():
    labels = np.repeat(np.arange(10), 100)
    sizes = DirichletPartitioner(0.5, size_zipf=1.0).client_sizes(len(labels), 10, rng())
    assert sizes.max() == int(1000 / sum(1 / r for r in range(1, 11))) == 341 and sizes.sum() <= 1000
    # S = 0 draws no permutation: the split is exactly the equal-size one
    a = DirichletPartitioner(0.5, client_size=50).split(labels, 10, rng(3))
    b = DirichletPartitioner(0.5, client_size=50, size_zipf=0.0).split(labels, 10, rng(3))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    cfg = DataConfig(partition="dirichlet", alpha=0.5, client_size=12, size_zipf=1.0)
    assert make_partitioner(cfg) == DirichletPartitioner(0.5, client_size=12, size_zipf=1.0)


def test_dirichlet_size_zipf_bad_values():
    with pytest.raises(ValueError, match="needs 2000 samples and the training set has 1000"):
        DirichletPartitioner(0.5, client_size=1000, size_zipf=0.0).split(np.repeat(np.arange(10), 100), 2, rng())
    with pytest.raises(ValueError, match=r"Zipf sizes \(exponent 1, largest 900\) without replacement: that needs 1350"):
        DirichletPartitioner(0.5, client_size=900, size_zipf=1.0).split(np.repeat(np.arange(10), 100), 2, rng())
    for bad in (-1.0, float("nan"), True):
        with pytest.raises(ValueError, match="size_zipf must be a finite number >= 0"):
            DirichletPartitioner(0.5, size_zipf=bad)
    with pytest.raises(ValueError, match="--size-zipf must be a finite number >= 0"):
        DataConfig(size_zipf=-0.5)
