"""Dataset readers against small files written here byte by byte (IDX, CIFAR pickles), plus digits."""

import dataclasses
import gzip
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from geodml.data.datasets import (
    DEFAULT_DATA_DIRS,
    IDX_FILES,
    Dataset,
    DatasetError,
    check_dataset_available,
    load_dataset,
)
from tests.support.files import idx_bytes, make_idx_dir, write_cifar, write_idx

FASHION_DIR = Path(DEFAULT_DATA_DIRS["fashion-mnist"])
FASHION_INSTALLED = all(any((FASHION_DIR / f"{base}{ext}").is_file() for ext in ("", ".gz")) for base in IDX_FILES)


def unnormalize(ds: Dataset, x: torch.Tensor, raw_train: np.ndarray) -> np.ndarray:
    """Undo the per-channel standardization with statistics recomputed from the raw train pixels."""
    raw = raw_train.astype(np.float64)
    mean = raw.mean(axis=(0, 2, 3)).reshape(1, -1, 1, 1)
    std = raw.std(axis=(0, 2, 3)).reshape(1, -1, 1, 1)
    return x.double().numpy() * std + mean


def assert_standardized(x: torch.Tensor):
    per_channel = x.double().transpose(0, 1).reshape(x.shape[1], -1)
    assert torch.allclose(per_channel.mean(dim=1), torch.zeros(x.shape[1], dtype=torch.float64), atol=1e-5)
    assert torch.allclose(per_channel.std(dim=1, unbiased=False), torch.ones(x.shape[1], dtype=torch.float64),
                          atol=1e-5)


# ------------------------------------------------------------------ IDX: fashion-mnist / mnist


@pytest.mark.parametrize("gz", [False, True, [True, False, False, True]], ids=["plain", "gz", "mixed"])
@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_idx_roundtrip(tmp_path, gz, name):
    arrays = make_idx_dir(tmp_path, gz=gz)
    check_dataset_available(name, str(tmp_path))
    ds = load_dataset(name, str(tmp_path))
    assert ds.name == name and ds.num_classes == 10 and ds.input_shape == (1, 6, 4)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert ds.train_x.shape == (12, 1, 6, 4) and ds.test_x.shape == (5, 1, 6, 4)
    assert ds.train_y.tolist() == arrays[IDX_FILES[1]].tolist()
    assert ds.test_y.tolist() == arrays[IDX_FILES[3]].tolist()
    raw_train = arrays[IDX_FILES[0]][:, None]
    np.testing.assert_allclose(unnormalize(ds, ds.train_x, raw_train), raw_train, atol=1e-3)
    np.testing.assert_allclose(unnormalize(ds, ds.test_x, raw_train), arrays[IDX_FILES[2]][:, None], atol=1e-3)
    assert_standardized(ds.train_x)
    assert ds.pixel_std == pytest.approx(float(np.std(raw_train.astype(np.float64))), rel=1e-9)  # 8-bit units


def test_plain_file_preferred_over_gz_and_both_accepted(tmp_path):
    arrays = make_idx_dir(tmp_path, gz=False)
    # A .gz twin with different labels must not be read when the plain file is there.
    write_idx(tmp_path, IDX_FILES[1], np.zeros(12, dtype=np.uint8), gz=True)
    assert load_dataset("mnist", str(tmp_path)).train_y.tolist() == arrays[IDX_FILES[1]].tolist()


def test_mnist_without_data_dir_says_how(tmp_path):
    with pytest.raises(DatasetError, match="pass --data-dir") as err:
        check_dataset_available("mnist", None)
    for base in IDX_FILES:
        assert base in str(err.value)
    with pytest.raises(DatasetError, match="pass --data-dir"):
        load_dataset("mnist")


def test_missing_directory(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset("mnist", str(tmp_path / "nope"))


def test_fashion_default_dir_missing_says_apt_get(tmp_path, monkeypatch):
    monkeypatch.setitem(DEFAULT_DATA_DIRS, "fashion-mnist", str(tmp_path / "absent"))
    with pytest.raises(DatasetError, match="does not exist.*apt-get install dataset-fashion-mnist"):
        check_dataset_available("fashion-mnist", None)


def test_missing_file_is_named(tmp_path):
    make_idx_dir(tmp_path, gz=True)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    for call in (check_dataset_available, load_dataset):
        with pytest.raises(DatasetError, match=r"missing t10k-labels-idx1-ubyte \(or t10k-labels-idx1-ubyte.gz\)"):
            call("fashion-mnist", str(tmp_path))


def test_truncated_plain_file(tmp_path):
    make_idx_dir(tmp_path, gz=False)
    path = tmp_path / IDX_FILES[0]
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(DatasetError, match=f"{IDX_FILES[0]}.*truncated"):
        check_dataset_available("mnist", str(tmp_path))
    with pytest.raises(DatasetError, match=f"{IDX_FILES[0]}: truncated: 281 data bytes, .* promises 288"):
        load_dataset("mnist", str(tmp_path))


def test_truncated_gzip_file(tmp_path):
    make_idx_dir(tmp_path, gz=True)
    path = tmp_path / (IDX_FILES[2] + ".gz")
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(DatasetError, match=f"{IDX_FILES[2]}.gz: corrupt or truncated gzip"):
        load_dataset("mnist", str(tmp_path))


def test_gzip_of_truncated_payload(tmp_path):
    make_idx_dir(tmp_path, gz=True)
    arr = np.zeros((5, 6, 4), dtype=np.uint8)
    (tmp_path / (IDX_FILES[2] + ".gz")).write_bytes(gzip.compress(idx_bytes(arr)[:-1]))
    with pytest.raises(DatasetError, match="truncated: 119 data bytes"):
        load_dataset("mnist", str(tmp_path))


def test_trailing_garbage(tmp_path):
    make_idx_dir(tmp_path, gz=False)
    path = tmp_path / IDX_FILES[1]
    path.write_bytes(path.read_bytes() + b"xx")
    with pytest.raises(DatasetError, match="followed by garbage"):
        check_dataset_available("mnist", str(tmp_path))
    with pytest.raises(DatasetError, match="2 unexpected bytes"):
        load_dataset("mnist", str(tmp_path))


@pytest.mark.parametrize("header, match", [
    (b"\x01\x02\x08\x03", "not an IDX file: magic number 0x01020803"),
    (b"\x00\x00\x0d\x03", r"element type 0x0d, expected 0x08 \(unsigned byte\)"),
    (b"\x00\x00\x08\x02", "2 dimension"),
    (b"\x00\x00", "shorter than the 4-byte magic number"),
    (b"\x00\x00\x08\x03\x00\x00\x00\x05", "truncated IDX header"),
])
def test_malformed_header(tmp_path, header, match):
    make_idx_dir(tmp_path, gz=False)
    path = tmp_path / IDX_FILES[0]
    # A 4-byte header replaces the magic number of a valid file; anything else is the whole file.
    path.write_bytes(header + path.read_bytes()[4:] if len(header) == 4 else header)
    with pytest.raises(DatasetError, match=match):
        check_dataset_available("mnist", str(tmp_path))
    with pytest.raises(DatasetError, match=match):
        load_dataset("mnist", str(tmp_path))


def test_image_label_count_mismatch(tmp_path):
    make_idx_dir(tmp_path, gz=False)
    write_idx(tmp_path, IDX_FILES[1], np.zeros(11, dtype=np.uint8), gz=False)
    with pytest.raises(DatasetError, match="12 images but train-labels-idx1-ubyte holds 11 labels"):
        check_dataset_available("mnist", str(tmp_path))
    with pytest.raises(DatasetError, match="12 images but train-labels-idx1-ubyte holds 11 labels"):
        load_dataset("mnist", str(tmp_path))


def test_train_test_image_size_mismatch(tmp_path):
    make_idx_dir(tmp_path, gz=False)
    write_idx(tmp_path, IDX_FILES[2], np.zeros((5, 7, 4), dtype=np.uint8), gz=False)
    with pytest.raises(DatasetError, match="must come from one dataset"):
        load_dataset("mnist", str(tmp_path))


def test_label_out_of_range(tmp_path):
    make_idx_dir(tmp_path, gz=False)
    write_idx(tmp_path, IDX_FILES[3], np.array([0, 1, 2, 10, 3], dtype=np.uint8), gz=False)
    with pytest.raises(DatasetError, match="label 10, expected labels 0..9"):
        load_dataset("mnist", str(tmp_path))


@pytest.mark.skipif(not FASHION_INSTALLED,
                    reason=f"Debian package dataset-fashion-mnist not installed (no IDX files in {FASHION_DIR}); "
                           "apt-get install dataset-fashion-mnist")
def test_debian_fashion_mnist():
    check_dataset_available("fashion-mnist", None)
    ds = load_dataset("fashion-mnist")
    assert ds.train_x.shape == (60000, 1, 28, 28) and ds.test_x.shape == (10000, 1, 28, 28)
    assert ds.num_classes == 10 and ds.input_shape == (1, 28, 28)
    assert torch.bincount(ds.train_y).tolist() == [6000] * 10
    assert torch.bincount(ds.test_y).tolist() == [1000] * 10
    assert_standardized(ds.train_x)
    assert ds.pixel_std == pytest.approx(0.3530 * 255, abs=0.05)  # the std usually quoted for Fashion-MNIST: 0.3530


# ------------------------------------------------------------------ CIFAR-10


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
@pytest.mark.parametrize("point_at", ["folder", "parent"])
def test_cifar_roundtrip(tmp_path, protocol, point_at):
    folder = tmp_path / "cifar-10-batches-py"
    train_data, train_labels, test_data, test_labels = write_cifar(folder, protocol=protocol)
    data_dir = str(folder if point_at == "folder" else tmp_path)
    check_dataset_available("cifar10", data_dir)
    ds = load_dataset("cifar10", data_dir)
    assert ds.num_classes == 10 and ds.input_shape == (3, 32, 32)
    assert ds.train_x.shape == (20, 3, 32, 32) and ds.test_x.shape == (4, 3, 32, 32)
    assert ds.train_y.tolist() == train_labels.tolist() and ds.test_y.tolist() == test_labels.tolist()
    raw_train = train_data.reshape(-1, 3, 32, 32)
    pixels = unnormalize(ds, ds.train_x, raw_train)
    np.testing.assert_allclose(pixels, raw_train, atol=1e-3)
    # Row layout: 1024 red, then 1024 green, then 1024 blue values, each row-major 32x32.
    np.testing.assert_allclose(pixels[0, 1, 0, :], train_data[0, 1024:1056], atol=1e-3)
    np.testing.assert_allclose(unnormalize(ds, ds.test_x, raw_train), test_data.reshape(-1, 3, 32, 32), atol=1e-3)
    assert_standardized(ds.train_x)
    per_channel = raw_train.astype(np.float64).std(axis=(0, 2, 3))  # one scale: the channels' root mean square
    assert ds.pixel_std == pytest.approx(float(np.sqrt(np.mean(per_channel ** 2))), rel=1e-9)


def test_cifar_numpy1_module_names_accepted(tmp_path):
    # The official batches were pickled by numpy 1.x, whose arrays name numpy.core.multiarray._reconstruct.
    train_data, _, _, _ = write_cifar(tmp_path)
    for path in tmp_path.iterdir():
        blob = path.read_bytes()
        assert b"numpy._core.multiarray" in blob
        path.write_bytes(blob.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    ds = load_dataset("cifar10", str(tmp_path))
    raw_train = train_data.reshape(-1, 3, 32, 32)
    np.testing.assert_allclose(unnormalize(ds, ds.train_x, raw_train), raw_train, atol=1e-3)


def test_cifar_str_keys_accepted(tmp_path):
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(tmp_path / name, "wb") as fh:
            pickle.dump({"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8), "labels": [1, 2]}, fh)
    assert load_dataset("cifar10", str(tmp_path)).train_y.tolist() == [1, 2] * 5


def test_cifar_missing_batches(tmp_path):
    write_cifar(tmp_path / "cifar-10-batches-py")
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DatasetError, match="missing data_batch_3 .*cifar-10-python.tar.gz"):
        check_dataset_available("cifar10", str(tmp_path))
    with pytest.raises(DatasetError, match="cifar10 has no default directory.*--data-dir"):
        check_dataset_available("cifar10", None)


def test_cifar_truncated_batch(tmp_path):
    write_cifar(tmp_path)
    path = tmp_path / "data_batch_2"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DatasetError, match="data_batch_2: not a readable CIFAR-10 python batch"):
        load_dataset("cifar10", str(tmp_path))


def test_cifar_empty_batch_fails_the_cheap_check(tmp_path):
    write_cifar(tmp_path)
    (tmp_path / "test_batch").write_bytes(b"")
    with pytest.raises(DatasetError, match="test_batch is empty"):
        check_dataset_available("cifar10", str(tmp_path))


@pytest.mark.parametrize("batch, match", [
    ({b"data": np.zeros((2, 3071), np.uint8), b"labels": [0, 1]}, r"uint8 array \[n, 3072\], got uint8 \[2, 3071\]"),
    ({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}, "got float32"),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, "2 images but b'labels' has shape"),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, r"labels must be in 0..9"),
    ({b"data": np.zeros((2, 3072), np.uint8)}, "expected keys b'data' and b'labels'"),
    ([1, 2, 3], "expected a pickled dict"),
])
def test_cifar_malformed_batch(tmp_path, batch, match):
    write_cifar(tmp_path)
    with open(tmp_path / "data_batch_4", "wb") as fh:
        pickle.dump(batch, fh, protocol=2)
    with pytest.raises(DatasetError, match=match):
        load_dataset("cifar10", str(tmp_path))


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_cifar_unpickler_refuses_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_cifar(tmp_path)
    with open(tmp_path / "test_batch", "wb") as fh:
        pickle.dump({b"data": _Evil(), b"labels": []}, fh)
    with pytest.raises(DatasetError, match="refusing to load"):
        load_dataset("cifar10", str(tmp_path))
    assert not (tmp_path / "pwned").exists()


# ------------------------------------------------------------------ digits and generic


def test_digits_split_is_stratified_and_seeded():
    a = load_dataset("digits", seed=0)
    assert a.name == "digits" and a.num_classes == 10 and a.input_shape == (1, 8, 8)
    # Class sizes 178,182,177,183,181,182,181,179,174,180; round-half-up(20%) of each to test.
    assert torch.bincount(a.test_y).tolist() == [36, 36, 35, 37, 36, 36, 36, 36, 35, 36]
    assert a.train_x.shape == (1438, 1, 8, 8) and a.test_x.shape == (359, 1, 8, 8)
    assert_standardized(a.train_x)
    b = load_dataset("digits", seed=0)
    c = load_dataset("digits", seed=1)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.test_x, c.test_x)
    assert torch.bincount(c.test_y).tolist() == torch.bincount(a.test_y).tolist()
    # Train + test = the bundled 1797 images, class by class.
    assert (torch.bincount(a.train_y) + torch.bincount(a.test_y)).tolist() == [178, 182, 177, 183, 181, 182, 181,
                                                                               179, 174, 180]


def test_digits_data_dir_warns_it_does_nothing():
    with pytest.warns(UserWarning, match="does nothing for --dataset digits"):
        check_dataset_available("digits", "/somewhere")
    check_dataset_available("digits", None)


def test_unknown_dataset():
    with pytest.raises(DatasetError, match="unknown dataset 'imagenet'; choose one of digits, fashion-mnist"):
        check_dataset_available("imagenet", None)
    with pytest.raises(ValueError):  # DatasetError is a ValueError, so the CLI's handler catches it
        load_dataset("imagenet")


def test_dataset_is_frozen(tmp_path):
    make_idx_dir(tmp_path, gz=False)
    ds = load_dataset("mnist", str(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ds.num_classes = 3
