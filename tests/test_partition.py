"""Partitioners against counts worked out by hand (see geodml/data/partition.py for the rules)."""

import math

import numpy as np
import pytest

from geodml.config import DataConfig
from geodml.data.partition import (
    DirichletPartitioner,
    IIDPartitioner,
    LabelSkewPartitioner,
    ShardsPartitioner,
    format_partition_table,
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
       ShardsPartitioner(2)]


# ------------------------------------------------------------------ common contract


@pytest.mark.parametrize("part", ALL, ids=repr)
@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_disjoint_sorted_and_cover(part, k):
    labels = np.random.default_rng(9).integers(0, 10, size=503)
    parts = part.split(labels, k, rng())
    assert len(parts) == k
    exact_cover = isinstance(part, (IIDPartitioner, LabelSkewPartitioner))
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
                                         (lambda: ShardsPartitioner(0), "shards_per_partition"),
                                         (lambda: ShardsPartitioner(1.5), "shards_per_partition")])
def test_bad_parameters(make, match):
    with pytest.raises(ValueError, match=match):
        make()


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
