"""Dataset readers: digits (bundled), fashion-mnist and mnist (IDX files), cifar10 (python batches).

Every reader returns a :class:`Dataset` whose images are float32 ``[N, C, H, W]`` tensors,
standardized per channel with the *training* set's mean and standard deviation (the test set
uses the same statistics, so nothing about the test set leaks into training), and int64
labels. The test set is the one every partition validates on (the Quagmire paper, Hsieh et
al. 2020, Section 3: "the model is tested on the entire validation set").

Formats, exactly:

- ``digits``: scikit-learn's bundled ``load_digits`` (1797 8x8 grey images, pixel values
  0..16). No files needed. The train/test split is stratified, 20% test, and a pure function
  of ``seed`` (a ``numpy.random.Generator``; per class, round-half-up of 20% of its images go
  to test: 1438 train / 359 test), so every rank holds the same split.
- ``fashion-mnist`` and ``mnist``: the four IDX files ``train-images-idx3-ubyte``,
  ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each
  either plain or gzip-compressed with a ``.gz`` suffix (compression is recognised by the
  gzip magic bytes, not by the name). The IDX header is parsed and checked: two zero bytes,
  element type 0x08 (unsigned byte), 3 dimensions for images / 1 for labels, then the
  big-endian uint32 sizes; the payload must have exactly the bytes the sizes promise.
  fashion-mnist defaults to ``/usr/share/datasets/fashion-mnist``, where the Debian package
  ``dataset-fashion-mnist`` installs the four files as ``*.gz``; mnist has no default.
- ``cifar10``: the python version's pickled batches ``data_batch_1`` .. ``data_batch_5`` and
  ``test_batch`` (dicts with ``b'data'``: uint8 ``[n, 3072]`` in R, G, B planes of 32x32, and
  ``b'labels'``: n ints in 0..9). ``data_dir`` may name the ``cifar-10-batches-py`` folder or
  its parent. The pickles are read with an unpickler that only admits the numpy array
  constructors those files need, so a stray pickle cannot run code.

Any missing, truncated or malformed input raises :class:`DatasetError` (a ``ValueError``)
naming the file, what was expected there, and how to obtain it.

Decoded-dataset cache (``load_dataset(..., cache_dir=DIR)``; the run passes ``--data-cache``).
K ranks on one machine would otherwise each decode the whole dataset (digits: import
scikit-learn, ~1 s of CPU and ~75 MB per rank; fashion-mnist: gunzip + standardize, ~230 MB
private memory per rank). The first rank to arrive decodes it once, under an exclusive
``fcntl.flock`` on ``DIR/<entry>.lock``, writes the standardized arrays as ``.npy`` files into
a temporary directory and renames that directory into place (atomic: a reader sees a whole
entry or none); every rank then maps the files copy-on-write (``np.load(mmap_mode="c")``), so
the pages are shared through the page cache instead of copied K times. The entry's name is a
hash of the dataset name, the format version, and the source's identity (each input file's
resolved path, size and mtime; for digits the seed and scikit-learn's version), so a changed
file or seed never reads a stale entry. The arrays are bit-identical to a direct decode.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import os
import pickle
import shutil
import struct
import time
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from geodml.config import DATASETS

__all__ = [
    "DATASET_NAMES",
    "DEFAULT_DATA_DIRS",
    "Dataset",
    "DatasetError",
    "check_dataset_available",
    "load_dataset",
    "load_dataset_cached",
    "resolve_cache_dir",
]

DATASET_NAMES = DATASETS  # the registry is geodml.config's

# Where the Debian package dataset-fashion-mnist puts its files (checked with `dpkg -L`).
DEFAULT_DATA_DIRS: dict[str, str] = {"fashion-mnist": "/usr/share/datasets/fashion-mnist"}

# IDX base names (the files may also carry a .gz suffix).
IDX_TRAIN_IMAGES = "train-images-idx3-ubyte"
IDX_TRAIN_LABELS = "train-labels-idx1-ubyte"
IDX_TEST_IMAGES = "t10k-images-idx3-ubyte"
IDX_TEST_LABELS = "t10k-labels-idx1-ubyte"
IDX_FILES = (IDX_TRAIN_IMAGES, IDX_TRAIN_LABELS, IDX_TEST_IMAGES, IDX_TEST_LABELS)
IDX_UBYTE = 0x08
IDX_NUM_CLASSES = 10

CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST_BATCH = "test_batch"
CIFAR_SIDE_PX = 32
CIFAR_CHANNELS = 3
CIFAR_ROW_BYTES = CIFAR_CHANNELS * CIFAR_SIDE_PX * CIFAR_SIDE_PX  # 3072
CIFAR_NUM_CLASSES = 10

DIGITS_TEST_FRACTION = 0.2

_GZIP_MAGIC = b"\x1f\x8b"

_HOW_TO_GET = {
    "fashion-mnist": (
        "install them with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu; files land in "
        "/usr/share/datasets/fashion-mnist) or download them from "
        "https://github.com/zalandoresearch/fashion-mnist (data/fashion/) and pass --data-dir DIR"
    ),
    "mnist": (
        "get the four files from http://yann.lecun.com/exdb/mnist/ or a mirror such as "
        "https://ossci-datasets.s3.amazonaws.com/mnist/ and keep them in one directory"
    ),
    "cifar10": (
        "download https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz, extract it, and pass "
        f"--data-dir pointing at the extracted {CIFAR_FOLDER}/ folder or its parent"
    ),
}


class DatasetError(ValueError):
    """A dataset is missing or malformed; the message says what was expected where and how to get it."""


@dataclass(frozen=True)
class Dataset:
    """A standardized image-classification dataset, identical on every rank.

    ``train_x``/``test_x`` are float32 ``[N, C, H, W]`` standardized with the training set's
    per-channel mean/std; ``train_y``/``test_y`` are int64 ``[N]`` in ``0..num_classes-1``.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    pixel_std: float = 1.0
    """The training set's per-channel pixel standard deviation before standardization (root mean
    square over channels), in 8-bit units (0-255; digits' 0-16 scaled by 255/16). A standardized
    image times this is (close to) the mean-subtracted raw image Caffe feeds its networks: the
    authors' LeNet takes its input at that scale (geodml.models.lenet, ``input_scale``)."""

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one image."""
        c, h, w = self.train_x.shape[1:]
        return (int(c), int(h), int(w))


# ----------------------------------------------------------------------------- public API


def load_dataset(name: str, data_dir: str | None = None, *, seed: int = 0,
                 cache_dir: str | os.PathLike | None = None) -> Dataset:
    """Read and standardize dataset ``name``.

    ``data_dir`` is where its files are (ignored by ``digits``; ``fashion-mnist`` defaults to
    the Debian package's directory). ``seed`` only affects ``digits``, whose train/test split
    it fixes. Raises :class:`DatasetError` if the files are missing or malformed. With
    ``cache_dir``, the decoded arrays are shared through that directory (module docstring;
    :func:`load_dataset_cached`); the values are the same either way.
    """
    if name not in DATASET_NAMES and ":" in name or _registered_plugin(name):
        return load_plugin_dataset(name, data_dir, seed=seed)   # a plugin's (not cached: its code may change)
    if cache_dir is not None:
        return load_dataset_cached(name, data_dir, seed=seed, cache_dir=cache_dir)[0]
    return _decode_dataset(name, data_dir, seed)


def _registered_plugin(name: str) -> bool:
    from geodml import plugins
    return name not in DATASET_NAMES and plugins.is_plugin_name("dataset", name)


def _decode_dataset(name: str, data_dir: str | None, seed: int) -> Dataset:
    _check_name(name)
    if name == "digits":
        train_x, train_y, test_x, test_y = _load_digits(seed)
        num_classes = 10
    elif name in ("fashion-mnist", "mnist"):
        train_x, train_y, test_x, test_y = _load_idx_dataset(name, _idx_dir(name, data_dir))
        num_classes = IDX_NUM_CLASSES
    else:
        train_x, train_y, test_x, test_y = _load_cifar10(_cifar_dir(data_dir))
        num_classes = CIFAR_NUM_CLASSES
    train_t, test_t, std = _standardize(train_x, test_x)
    unit = 255.0 / DIGITS_MAX if name == "digits" else 1.0  # digits' pixels are 0..16, the rest 8-bit
    return Dataset(
        pixel_std=float(np.sqrt(np.mean(np.square(std)))) * unit,
        name=name,
        train_x=train_t,
        train_y=torch.from_numpy(train_y.astype(np.int64)),
        test_x=test_t,
        test_y=torch.from_numpy(test_y.astype(np.int64)),
        num_classes=num_classes,
    )


def check_dataset_available(name: str, data_dir: str | None) -> None:
    """Cheap check that ``load_dataset(name, data_dir)`` will find well-formed files.

    Checks existence, IDX headers (and, for uncompressed IDX files, their exact sizes) and
    the presence of all CIFAR batches, without decoding pixels. Meant for the CLI before any
    process group exists; raises :class:`DatasetError` with an actionable message. A plugin's dataset
    (``MODULE:FUNCTION``) is checked when it is loaded.
    """
    if name not in DATASET_NAMES and (":" in name or _registered_plugin(name)):
        return
    _check_name(name)
    if name == "digits":
        if data_dir is not None:
            warnings.warn(f"--data-dir {data_dir!r} does nothing for --dataset digits (bundled with scikit-learn)",
                          stacklevel=2)
        return
    if name in ("fashion-mnist", "mnist"):
        directory = _idx_dir(name, data_dir)
        dims = {base: _check_idx_header(_find_idx_file(name, directory, base), _idx_ndim(base)) for base in IDX_FILES}
        _check_idx_pair(name, dims[IDX_TRAIN_IMAGES][0], dims[IDX_TRAIN_LABELS][0],
                        directory, IDX_TRAIN_IMAGES, IDX_TRAIN_LABELS)
        _check_idx_pair(name, dims[IDX_TEST_IMAGES][0], dims[IDX_TEST_LABELS][0],
                        directory, IDX_TEST_IMAGES, IDX_TEST_LABELS)
        if dims[IDX_TRAIN_IMAGES][1:] != dims[IDX_TEST_IMAGES][1:]:
            raise DatasetError(f"{name}: train images are {dims[IDX_TRAIN_IMAGES][1:]} pixels but test images are "
                               f"{dims[IDX_TEST_IMAGES][1:]} in {directory}; both files must come from one dataset")
        return
    folder = _cifar_dir(data_dir)
    for batch in (*CIFAR_TRAIN_BATCHES, CIFAR_TEST_BATCH):
        path = folder / batch
        if path.stat().st_size == 0:
            raise DatasetError(f"cifar10: {path} is empty; expected a pickled CIFAR-10 batch; {_HOW_TO_GET['cifar10']}")


# ----------------------------------------------------------------------------- decoded-dataset cache

CACHE_FORMAT = 2  # 2: meta.json has pixel_std
DIGITS_MAX = 16.0  # scikit-learn digits: pixel values 0..16
CACHE_ENV = "GEODML_DATA_CACHE"
CACHE_LOCK_TIMEOUT_S = 600.0
_CACHE_ARRAYS = ("train_x", "train_y", "test_x", "test_y")


def resolve_cache_dir(setting: str | None) -> Path | None:
    """``--data-cache`` -> directory or None (off).

    ``off`` (or empty) disables the cache; ``auto`` uses ``$GEODML_DATA_CACHE`` when set (which
    may itself be ``off``), else ``$XDG_CACHE_HOME/geodml/datasets`` (``~/.cache/...``); any
    other value is the directory.
    """
    if setting is None or setting.strip() in ("", "off"):
        return None
    if setting == "auto":
        env = os.environ.get(CACHE_ENV)
        if env is not None:
            return resolve_cache_dir(env if env != "auto" else "off")
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "geodml" / "datasets"
    return Path(setting).expanduser()


def _source_identity(name: str, data_dir: str | None, seed: int) -> dict:
    """What the decoded arrays depend on (cheap: stat calls, no decoding)."""
    if name == "digits":
        from importlib.metadata import PackageNotFoundError, version
        try:
            sklearn_version = version("scikit-learn")
        except PackageNotFoundError:
            sklearn_version = "unknown"
        return {"seed": int(seed), "scikit-learn": sklearn_version}
    if name in ("fashion-mnist", "mnist"):
        directory = _idx_dir(name, data_dir)
        paths = [_find_idx_file(name, directory, base) for base in IDX_FILES]
    else:
        folder = _cifar_dir(data_dir)
        paths = [folder / b for b in (*CIFAR_TRAIN_BATCHES, CIFAR_TEST_BATCH)]
    files = []
    for path in paths:
        st = path.stat()
        files.append([str(path.resolve()), st.st_size, st.st_mtime_ns])
    return {"files": files}


def _cache_entry_name(name: str, data_dir: str | None, seed: int) -> str:
    ident = {"format": CACHE_FORMAT, "name": name, **_source_identity(name, data_dir, seed)}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]
    return f"{name}-{digest}"


def _read_cache_entry(entry: Path) -> Dataset | None:
    """The dataset an entry holds, mapped copy-on-write; None if there is no (valid) entry."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        arrays = {k: np.load(entry / f"{k}.npy", mmap_mode="c", allow_pickle=False) for k in _CACHE_ARRAYS}
    except (OSError, ValueError):
        return None
    ok = (meta.get("format") == CACHE_FORMAT and arrays["train_x"].dtype == np.float32
          and arrays["test_x"].dtype == np.float32 and arrays["train_y"].dtype == np.int64
          and arrays["test_y"].dtype == np.int64 and arrays["train_x"].ndim == 4
          and arrays["train_x"].shape[1:] == arrays["test_x"].shape[1:]
          and len(arrays["train_x"]) == len(arrays["train_y"]) == meta.get("num_train")
          and len(arrays["test_x"]) == len(arrays["test_y"]) == meta.get("num_test")
          and isinstance(meta.get("pixel_std"), float))
    if not ok:
        return None
    tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
    return Dataset(name=meta["name"], num_classes=int(meta["num_classes"]), pixel_std=meta["pixel_std"], **tensors)


def _write_cache_entry(entry: Path, ds: Dataset) -> None:
    """Write-then-rename: the entry directory appears whole or not at all."""
    tmp = entry.parent / f".{entry.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for k in _CACHE_ARRAYS:
            with open(tmp / f"{k}.npy", "wb") as fh:
                np.save(fh, getattr(ds, k).numpy(), allow_pickle=False)
        meta = {"format": CACHE_FORMAT, "name": ds.name, "num_classes": ds.num_classes,
                "num_train": len(ds.train_y), "num_test": len(ds.test_y), "pixel_std": float(ds.pixel_std)}
        (tmp / "meta.json").write_text(json.dumps(meta) + "\n")
        if entry.exists():  # an invalid leftover (we hold the lock, so nobody is writing it)
            shutil.rmtree(entry, ignore_errors=True)
        os.rename(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _FileLock:
    """Exclusive ``flock`` on a file, acquired within ``timeout_s`` (polling; never hangs)."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        self.path, self.timeout_s, self.fd = path, timeout_s, -1

    def __enter__(self) -> "_FileLock":
        import fcntl
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout_s
        delay = 0.01
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    raise TimeoutError(f"{self.path} stayed locked for {self.timeout_s:g} s") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # closing releases the flock


def load_dataset_cached(name: str, data_dir: str | None = None, *, seed: int = 0, cache_dir: str | os.PathLike,
                        lock_timeout_s: float = CACHE_LOCK_TIMEOUT_S) -> tuple[Dataset, bool]:
    """:func:`load_dataset` through the decoded-dataset cache in ``cache_dir``.

    Returns ``(dataset, decoded)``: ``decoded`` is True when this call decoded the source (the
    cache had no entry) and False when it mapped an existing entry. Safe when many processes
    call it at once: one decodes, the rest wait on the entry's lock and then map its files.
    If the cache cannot be used (directory not writable, lock held past ``lock_timeout_s``)
    it warns and decodes directly. Raises :class:`DatasetError` as :func:`load_dataset` does.
    """
    _check_name(name)
    root = Path(cache_dir)
    entry = root / _cache_entry_name(name, data_dir, seed)
    ds = _read_cache_entry(entry)
    if ds is not None:
        return ds, False
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _FileLock(root / f"{entry.name}.lock", lock_timeout_s):
            ds = _read_cache_entry(entry)  # another process may have built it while we waited
            if ds is not None:
                return ds, False
            decoded = _decode_dataset(name, data_dir, seed)
            _write_cache_entry(entry, decoded)
    except (OSError, TimeoutError) as exc:
        warnings.warn(f"dataset cache {root} not usable ({exc}); decoding {name} in this process "
                      f"(--data-cache off silences this)", stacklevel=2)
        return _decode_dataset(name, data_dir, seed), True
    mapped = _read_cache_entry(entry)
    return (mapped if mapped is not None else decoded), True


# ----------------------------------------------------------------------------- helpers


def load_plugin_dataset(name: str, data_dir: str | None, *, seed: int) -> Dataset:
    """``--dataset MODULE:FUNCTION`` (geodml.plugins): ``FUNCTION(seed=seed, data_dir=data_dir)`` returns a
    :class:`Dataset` as it is, or the arrays ``(train_x, train_y, test_x, test_y)`` (images ``[N, C, H, W]``,
    integer labels ``0..C-1``), standardized here per channel with the training set's statistics as geodml's
    own readers do. A pure function of ``seed`` and the files: every rank calls it. DatasetError when
    its result is neither."""
    from geodml import plugins

    got = plugins.load("dataset", name)(seed=seed, data_dir=data_dir)
    if isinstance(got, Dataset):
        return got
    if not (isinstance(got, tuple) and len(got) == 4):
        raise DatasetError(f"--dataset {name}: returned {type(got).__name__}; expected a geodml.data.Dataset or "
                           "the arrays (train_x, train_y, test_x, test_y)")
    train_x, train_y, test_x, test_y = (np.asarray(a) for a in got)
    if train_x.ndim != 4 or test_x.ndim != 4 or train_x.shape[1:] != test_x.shape[1:]:
        raise DatasetError(f"--dataset {name}: images must be [N, C, H, W] arrays of one shape, got train "
                           f"{train_x.shape} and test {test_x.shape}")
    for what, x, y in (("train", train_x, train_y), ("test", test_x, test_y)):
        if y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer) or (y.size and y.min() < 0):
            raise DatasetError(f"--dataset {name}: {what} labels must be {len(x)} integers >= 0, got shape "
                               f"{y.shape} of {y.dtype}")
    num_classes = int(max(train_y.max(initial=0), test_y.max(initial=0))) + 1
    if num_classes < 2:
        raise DatasetError(f"--dataset {name}: needs at least 2 classes, got labels of {num_classes}")
    train_t, test_t, std = _standardize(train_x, test_x)
    return Dataset(name=name, train_x=train_t, train_y=torch.from_numpy(train_y.astype(np.int64)), test_x=test_t,
                   test_y=torch.from_numpy(test_y.astype(np.int64)), num_classes=num_classes,
                   pixel_std=float(np.sqrt(np.mean(np.square(std)))))


def _check_name(name: str) -> None:
    if name not in DATASET_NAMES:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")


def _standardize(train: np.ndarray, test: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Return float32 tensors standardized per channel with the train set's mean/std (population std),
    and that std per channel (float64; 1 for a constant channel).

    Moments are accumulated in float64 from float32 pixels; for 8-bit images every value and
    square is an integer, so the sums are exact. No float64 copy of the set is made (CIFAR's
    would be 1.2 GB).
    """
    train_f = np.ascontiguousarray(train, dtype=np.float32)
    test_f = np.ascontiguousarray(test, dtype=np.float32)
    count = train_f.shape[0] * train_f.shape[2] * train_f.shape[3]
    mean = train_f.sum(axis=(0, 2, 3), dtype=np.float64) / count
    mean_sq = np.einsum("nchw,nchw->c", train_f, train_f, dtype=np.float64) / count
    std = np.sqrt(np.maximum(mean_sq - mean * mean, 0.0))
    # A constant channel would divide by zero; leave its scale alone instead.
    std[std == 0] = 1.0
    shape = (1, train_f.shape[1], 1, 1)
    mean_t = torch.from_numpy(mean.astype(np.float32).reshape(shape))
    std_t = torch.from_numpy(std.astype(np.float32).reshape(shape))
    return (torch.from_numpy(train_f).sub_(mean_t).div_(std_t),
            torch.from_numpy(test_f).sub_(mean_t).div_(std_t), std)


def _load_digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits with a stratified split: per class, round-half-up(20% of its count) go to test.

    The split draws from ``np.random.default_rng(seed)`` only (no scipy import, no global
    state); with the bundled 1797 images it yields 1438 train / 359 test for every seed.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = bunch.images.astype(np.float32)[:, None, :, :]  # [1797, 1, 8, 8], values 0..16
    labels = bunch.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    test_parts = []
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        num_test = int(np.floor(DIGITS_TEST_FRACTION * len(members) + 0.5))
        test_parts.append(members[:num_test])
    is_test = np.zeros(len(labels), dtype=bool)
    is_test[np.concatenate(test_parts)] = True
    # Ascending index order, so the order inside each split depends on membership only.
    return images[~is_test], labels[~is_test], images[is_test], labels[is_test]


# --- IDX (fashion-mnist, mnist)


def _idx_dir(name: str, data_dir: str | None) -> Path:
    expected = ", ".join(f"{f}[.gz]" for f in IDX_FILES)
    if data_dir is None:
        if name not in DEFAULT_DATA_DIRS:
            raise DatasetError(f"{name} has no default directory: pass --data-dir DIR where DIR holds {expected}; "
                               f"{_HOW_TO_GET[name]}")
        data_dir = DEFAULT_DATA_DIRS[name]
    directory = Path(data_dir)
    if not directory.is_dir():
        raise DatasetError(f"{name}: directory {directory} does not exist; expected it to hold {expected}; "
                           f"{_HOW_TO_GET[name]}")
    return directory


def _find_idx_file(name: str, directory: Path, base: str) -> Path:
    for candidate in (directory / base, directory / f"{base}.gz"):
        if candidate.is_file():
            return candidate
    present = sorted(p.name for p in directory.iterdir())[:12]
    raise DatasetError(f"{name}: missing {base} (or {base}.gz) in {directory} (it holds: "
                       f"{', '.join(present) if present else 'nothing'}); {_HOW_TO_GET[name]}")


def _idx_ndim(base: str) -> int:
    return 3 if "images" in base else 1


def _open_idx_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DatasetError(f"{path}: corrupt or truncated gzip data ({exc}); re-download the file") from exc


def _parse_idx_header(buf: bytes, path: Path, expected_ndim: int) -> tuple[tuple[int, ...], int]:
    """Return (dims, header length in bytes) of an IDX file, or raise naming what is wrong."""
    if len(buf) < 4:
        raise DatasetError(f"{path}: truncated IDX file: {len(buf)} bytes, shorter than the 4-byte magic number")
    if buf[:2] != b"\x00\x00":
        raise DatasetError(f"{path}: not an IDX file: magic number 0x{buf[:4].hex()} must start with two zero bytes")
    if buf[2] != IDX_UBYTE:
        raise DatasetError(f"{path}: IDX element type 0x{buf[2]:02x}, expected 0x{IDX_UBYTE:02x} (unsigned byte)")
    ndim = buf[3]
    if ndim != expected_ndim:
        what = "images (count, rows, cols)" if expected_ndim == 3 else "labels (count)"
        raise DatasetError(f"{path}: IDX file has {ndim} dimension(s), expected {expected_ndim} for {what}")
    header_len = 4 + 4 * ndim
    if len(buf) < header_len:
        raise DatasetError(f"{path}: truncated IDX header: {len(buf)} bytes, expected {header_len}")
    dims = struct.unpack(f">{ndim}I", buf[4:header_len])
    return tuple(int(d) for d in dims), header_len


def _check_idx_header(path: Path, expected_ndim: int) -> tuple[int, ...]:
    """Header-only check (cheap); for plain files also the exact file size."""
    try:
        with open(path, "rb") as fh:
            compressed = fh.read(2) == _GZIP_MAGIC
        opener = gzip.open if compressed else open
        with opener(path, "rb") as fh:
            head = fh.read(4 + 4 * 3)
    except (OSError, EOFError, zlib.error) as exc:
        raise DatasetError(f"{path}: unreadable ({exc}); re-download the file") from exc
    dims, header_len = _parse_idx_header(head, path, expected_ndim)
    if not compressed:
        expected_size = header_len + int(np.prod(dims))
        actual_size = path.stat().st_size
        if actual_size != expected_size:
            raise DatasetError(f"{path}: {actual_size} bytes, but its header {dims} promises {expected_size}; "
                               f"the file is {'truncated' if actual_size < expected_size else 'followed by garbage'}")
    return dims


def _read_idx(path: Path, expected_ndim: int) -> np.ndarray:
    buf = _open_idx_bytes(path)
    dims, header_len = _parse_idx_header(buf, path, expected_ndim)
    payload_bytes = int(np.prod(dims))
    have = len(buf) - header_len
    if have < payload_bytes:
        raise DatasetError(f"{path}: truncated: {have} data bytes, but its header {dims} promises {payload_bytes}")
    if have > payload_bytes:
        raise DatasetError(f"{path}: {have - payload_bytes} unexpected bytes after the {dims} data the header promises")
    return np.frombuffer(buf, dtype=np.uint8, count=payload_bytes, offset=header_len).reshape(dims)


def _check_idx_pair(name: str, num_images: int, num_labels: int, directory: Path, images: str, labels: str) -> None:
    if num_images != num_labels:
        raise DatasetError(f"{name}: {images} holds {num_images} images but {labels} holds {num_labels} labels "
                           f"in {directory}; the two files must belong together")


def _load_idx_dataset(name: str, directory: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    arrays = {base: _read_idx(_find_idx_file(name, directory, base), _idx_ndim(base)) for base in IDX_FILES}
    _check_idx_pair(name, len(arrays[IDX_TRAIN_IMAGES]), len(arrays[IDX_TRAIN_LABELS]),
                    directory, IDX_TRAIN_IMAGES, IDX_TRAIN_LABELS)
    _check_idx_pair(name, len(arrays[IDX_TEST_IMAGES]), len(arrays[IDX_TEST_LABELS]),
                    directory, IDX_TEST_IMAGES, IDX_TEST_LABELS)
    if arrays[IDX_TRAIN_IMAGES].shape[1:] != arrays[IDX_TEST_IMAGES].shape[1:]:
        raise DatasetError(f"{name}: train images are {arrays[IDX_TRAIN_IMAGES].shape[1:]} pixels but test images "
                           f"are {arrays[IDX_TEST_IMAGES].shape[1:]} in {directory}; both must come from one dataset")
    for base in (IDX_TRAIN_LABELS, IDX_TEST_LABELS):
        labels = arrays[base]
        if labels.size and labels.max() >= IDX_NUM_CLASSES:
            raise DatasetError(f"{name}: {_find_idx_file(name, directory, base)} holds label {int(labels.max())}, "
                               f"expected labels 0..{IDX_NUM_CLASSES - 1}")
    return (arrays[IDX_TRAIN_IMAGES][:, None], arrays[IDX_TRAIN_LABELS],
            arrays[IDX_TEST_IMAGES][:, None], arrays[IDX_TEST_LABELS])


# --- CIFAR-10 python batches


def _numpy_pickle_globals() -> dict:
    """The numpy constructors a pickled array refers to, under both numpy 1.x and 2.x module names."""
    try:  # numpy >= 2 moved the private module; importing numpy.core there warns.
        from numpy._core.multiarray import _reconstruct, scalar
        from numpy._core.numeric import _frombuffer
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
        from numpy.core.numeric import _frombuffer
    allowed: dict = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): codecs.encode}
    for prefix in ("numpy.core", "numpy._core"):
        allowed[(f"{prefix}.multiarray", "_reconstruct")] = _reconstruct
        allowed[(f"{prefix}.multiarray", "scalar")] = scalar
        allowed[(f"{prefix}.numeric", "_frombuffer")] = _frombuffer
    return allowed


_CIFAR_PICKLE_GLOBALS = _numpy_pickle_globals()


class _CifarUnpickler(pickle.Unpickler):
    """Admits only what a CIFAR-10 batch needs (numpy arrays, dtypes, bytes), so a stray pickle cannot run code."""

    def find_class(self, module: str, name: str):
        try:
            return _CIFAR_PICKLE_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a CIFAR-10 batch holds only numpy "
                                         f"arrays and lists") from None


def _cifar_dir(data_dir: str | None) -> Path:
    if data_dir is None:
        raise DatasetError(f"cifar10 has no default directory; {_HOW_TO_GET['cifar10']}")
    base = Path(data_dir)
    folder = base / CIFAR_FOLDER if (base / CIFAR_FOLDER).is_dir() else base
    expected = [*CIFAR_TRAIN_BATCHES, CIFAR_TEST_BATCH]
    missing = [b for b in expected if not (folder / b).is_file()]
    if missing:
        raise DatasetError(f"cifar10: missing {', '.join(missing)} in {folder} (looked in {base} and "
                           f"{base / CIFAR_FOLDER}); expected {', '.join(expected)}; {_HOW_TO_GET['cifar10']}")
    return folder


def _dict_get(batch: dict, key: str):
    # Python-2 pickles decoded with encoding="bytes" have bytes keys; Python-3 ones have str keys.
    if key.encode() in batch:
        return batch[key.encode()]
    return batch.get(key)


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as fh:
            batch = _CifarUnpickler(fh, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            MemoryError, struct.error) as exc:
        raise DatasetError(f"{path}: not a readable CIFAR-10 python batch ({type(exc).__name__}: {exc}); "
                           f"{_HOW_TO_GET['cifar10']}") from exc
    if not isinstance(batch, dict):
        raise DatasetError(f"{path}: expected a pickled dict with b'data' and b'labels', got {type(batch).__name__}")
    data, labels = _dict_get(batch, "data"), _dict_get(batch, "labels")
    if data is None or labels is None:
        raise DatasetError(f"{path}: expected keys b'data' and b'labels', found {sorted(map(repr, batch))}")
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
            and data.shape[1] == CIFAR_ROW_BYTES):
        got = f"{data.dtype} {list(data.shape)}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DatasetError(f"{path}: b'data' must be a uint8 array [n, {CIFAR_ROW_BYTES}], got {got}")
    try:
        labels_arr = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise DatasetError(f"{path}: b'labels' must be a list of integers ({exc})") from exc
    if labels_arr.shape != (len(data),):
        raise DatasetError(f"{path}: {len(data)} images but b'labels' has shape {list(labels_arr.shape)}")
    if labels_arr.size and (labels_arr.min() < 0 or labels_arr.max() >= CIFAR_NUM_CLASSES):
        raise DatasetError(f"{path}: labels must be in 0..{CIFAR_NUM_CLASSES - 1}, found "
                           f"{int(labels_arr.min())}..{int(labels_arr.max())}")
    images = data.reshape(len(data), CIFAR_CHANNELS, CIFAR_SIDE_PX, CIFAR_SIDE_PX)
    return images, labels_arr


def _load_cifar10(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    train = [_read_cifar_batch(folder / b) for b in CIFAR_TRAIN_BATCHES]
    test_x, test_y = _read_cifar_batch(folder / CIFAR_TEST_BATCH)
    train_x = np.concatenate([x for x, _ in train])
    train_y = np.concatenate([y for _, y in train])
    return train_x, train_y, test_x, test_y
