"""Dataset files written byte by byte for the tests (IDX, CIFAR-10 python batches): small, seeded,
and in the real formats, so the readers and the CLI's checks run on them as on downloaded files."""

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np

from geodml.data.datasets import IDX_FILES


def idx_bytes(arr: np.ndarray, *, dtype_code: int = 0x08) -> bytes:
    arr = np.asarray(arr, dtype=np.uint8)
    header = bytes([0, 0, dtype_code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.tobytes()


def write_idx(directory: Path, base: str, arr: np.ndarray, *, gz: bool) -> Path:
    data = idx_bytes(arr)
    path = directory / (base + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def make_idx_dir(directory: Path, *, gz, n_train=12, n_test=5, rows=6, cols=4, seed=0):
    """Four IDX files of random pixels/labels; ``gz`` is a bool or a per-file list. Returns the arrays."""
    rng = np.random.default_rng(seed)
    arrays = {
        IDX_FILES[0]: rng.integers(0, 256, size=(n_train, rows, cols), dtype=np.uint8),
        IDX_FILES[1]: rng.integers(0, 10, size=n_train, dtype=np.uint8),
        IDX_FILES[2]: rng.integers(0, 256, size=(n_test, rows, cols), dtype=np.uint8),
        IDX_FILES[3]: rng.integers(0, 10, size=n_test, dtype=np.uint8),
    }
    flags = gz if isinstance(gz, list) else [gz] * 4
    for (base, arr), flag in zip(arrays.items(), flags):
        write_idx(directory, base, arr, gz=flag)
    return arrays


def write_cifar(folder: Path, *, per_batch=4, protocol=2, seed=0):
    """Six CIFAR-10 python batches; returns (train data, train labels, test data, test labels) as written."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        with open(folder / name, "wb") as fh:
            pickle.dump({b"batch_label": name.encode(), b"data": data, b"labels": labels}, fh, protocol=protocol)
        written[name] = (data, labels)
    train = [written[f"data_batch_{i}"] for i in range(1, 6)]
    return (np.concatenate([d for d, _ in train]), np.concatenate([lab for _, lab in train]),
            written["test_batch"][0], np.array(written["test_batch"][1]))
