"""Datasets (digits, fashion-mnist, mnist, cifar10) and partitioners (iid, label, dirichlet, shards)."""

from geodml.data.datasets import Dataset, DatasetError, check_dataset_available, load_dataset
from geodml.data.partition import (
    DirichletPartitioner,
    IIDPartitioner,
    LabelSkewPartitioner,
    Partitioner,
    ShardsPartitioner,
    format_partition_table,
    make_partitioner,
    partition_report,
)

__all__ = [
    "Dataset",
    "DatasetError",
    "DirichletPartitioner",
    "IIDPartitioner",
    "LabelSkewPartitioner",
    "Partitioner",
    "ShardsPartitioner",
    "check_dataset_available",
    "format_partition_table",
    "load_dataset",
    "make_partitioner",
    "partition_report",
]
