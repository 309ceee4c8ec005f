"""Files written for the tests: dataset files byte by byte (IDX, CIFAR-10 python batches) in the
real formats, so the readers and the CLI's checks run on them as on downloaded files; and run and
study directories in the run-directory contract, for the report and the HTML report."""

import gzip
import json
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


# ---- run and study directories ------------------------------------------------------------------
def make_run(root: Path, name: str, algo: str, *, bytes_per_step: int, acc_gain: float, finished: bool = True,
             counts=((50, 0, 5), (0, 40, 10))) -> Path:
    d = root / name
    d.mkdir(parents=True)
    regions = ["eu", "us"]
    (d / "config.json").write_text(json.dumps({"region_of_rank": regions, "config": {"algo": {"algo": algo},
                                                                                     "data": {"partition": "label"}}}))
    (d / "partitions.json").write_text(json.dumps({"label_counts": [list(c) for c in counts], "mean_entropy_bits": 0.6}))
    lines = []
    for step in range(10, 60, 10):
        lines.append({"step": step, "emulated_s": step * 0.5, "train_loss": 1.0, "wan_bytes_total": step * bytes_per_step})
        lines.append({"step": step, "accuracy_loss": 0.1, "theta": 0.2})  # a SkewScout line: no accuracy
        lines.append({"step": step, "emulated_s": step * 0.5, "train_loss": 1.0, "wan_bytes_total": step * bytes_per_step,
                      "val_accuracy": min(0.99, acc_gain * step)})
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n" + ('{"step": 6' if not finished else ""))
    if finished:
        total = 50 * bytes_per_step
        (d / "summary.json").write_text(json.dumps({
            "algo": algo, "final_val_accuracy": min(0.99, acc_gain * 50), "wan_bytes_total": total,
            "bytes_by_link": {"eu->us": total // 2, "us->eu": total - total // 2, "eu->eu": 123},
            "theta_name": "t0" if algo == "gaia" else None, "theta_final": 0.1 if algo == "gaia" else None,
            "partition": "label", "skew": 1.0}))
    return d


def make_study(root: Path) -> Path:
    """A noniid study directory written by geodml.study itself (4 runs made here, reused, none launched)."""
    from geodml.study import paper, runner

    argv = ["--budget", "quick", "--algos", "gaia", "--nproc", "2", "--out", str(root / "study")]
    _, _, cells = paper.prepare("noniid", argv)
    quality = {"bsp-iid-s0": (200_000, 0.018), "bsp-noniid-100-s0": (200_000, 0.017), "gaia-t0-0.1-iid-s0": (5_000, 0.017),
               "gaia-t0-0.1-noniid-100-s0": (4_000, 0.006)}
    for c in cells:
        per_step, gain = quality[c.spec.run_id]
        counts = ((50, 0, 5), (0, 40, 10)) if "noniid" in c.setting else ((30, 20, 5), (25, 20, 5))
        d = make_run(c.spec.out.parent, c.spec.out.name, c.algo, bytes_per_step=per_step, acc_gain=gain, counts=counts)
        (d / "launch.json").write_text(json.dumps(runner.launch_record(c.spec)))

    def no_launch(spec, stdout, stderr):
        raise AssertionError(f"launched {spec.run_id}")
    assert paper.noniid(argv, launcher=no_launch) == 0
    return root / "study"
