"""Scale on one machine: a K=16 run, and the decoded-dataset cache that keeps K ranks' start-up cheap.

The K=16 run goes through launch/run.sh (torchrun, gloo, one thread per rank) with BSP, whose
bytes are exact under the ring cost model: every step K ranks each send 2(K-1) chunks that
together hold the n gradient elements once per ring step, so the run carries
steps * 2(K-1) * n * 4 bytes of kind ``gradient`` (one region per rank: all of it is WAN).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

import pytest
import torch

from geodml.data.datasets import load_dataset, load_dataset_cached, resolve_cache_dir
from tests.support.files import make_idx_dir
from tests.support.procs import REPO, free_port, run_command, run_workers

ARRAYS = ("train_x", "train_y", "test_x", "test_y")


def _digest(ds) -> str:
    h = hashlib.sha256()
    for k in ARRAYS:
        t = getattr(ds, k)
        h.update(f"{k}{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------- the cache, unit level


def test_resolve_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("GEODML_DATA_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_cache_dir("auto") == tmp_path / "xdg" / "geodml" / "datasets"
    assert resolve_cache_dir("off") is None
    assert resolve_cache_dir(str(tmp_path / "c")) == tmp_path / "c"
    monkeypatch.setenv("GEODML_DATA_CACHE", "off")
    assert resolve_cache_dir("auto") is None
    monkeypatch.setenv("GEODML_DATA_CACHE", str(tmp_path / "env"))
    assert resolve_cache_dir("auto") == tmp_path / "env"
    assert resolve_cache_dir(str(tmp_path / "flag")) == tmp_path / "flag"  # an explicit flag beats the environment


def test_cache_is_bit_identical_and_keyed_on_the_source(tmp_path):
    data = tmp_path / "mnist"
    data.mkdir()
    make_idx_dir(data, gz=True, n_train=12, n_test=5, seed=1)
    cache = tmp_path / "cache"
    direct = load_dataset("mnist", str(data))
    first, decoded1 = load_dataset_cached("mnist", str(data), cache_dir=cache)
    again, decoded2 = load_dataset_cached("mnist", str(data), cache_dir=cache)
    assert (decoded1, decoded2) == (True, False)
    assert _digest(first) == _digest(again) == _digest(direct)
    assert again.num_classes == 10 and again.input_shape == (1, 6, 4)
    assert first.pixel_std == again.pixel_std == direct.pixel_std > 1  # kept in meta.json
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1
    # Another file content (and mtime) is another entry: never a stale read.
    time.sleep(0.01)
    arrays = make_idx_dir(data, gz=True, n_train=12, n_test=5, seed=2)
    changed, decoded3 = load_dataset_cached("mnist", str(data), cache_dir=cache)
    assert decoded3 is True
    assert changed.train_y.tolist() == arrays["train-labels-idx1-ubyte"].astype(int).tolist()
    assert _digest(changed) == _digest(load_dataset("mnist", str(data)))
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 2
    # A damaged entry is rebuilt, not trusted.
    entry = next(p for p in cache.iterdir() if p.is_dir() and (p / "train_x.npy").stat().st_mtime_ns ==
                 max(q.stat().st_mtime_ns for q in cache.glob("*/train_x.npy")))
    expected = _digest(changed)
    damaged = (entry / "train_x.npy").read_bytes()[:100]
    (entry / "train_x.npy").unlink()  # a new inode: `changed` still maps the old file's pages
    (entry / "train_x.npy").write_bytes(damaged)
    rebuilt, decoded4 = load_dataset_cached("mnist", str(data), cache_dir=cache)
    assert decoded4 is True and _digest(rebuilt) == expected


def test_digits_seed_is_part_of_the_key(tmp_path):
    a, da = load_dataset_cached("digits", seed=0, cache_dir=tmp_path)
    b, db = load_dataset_cached("digits", seed=1, cache_dir=tmp_path)
    assert (da, db) == (True, True)
    assert (len(a.train_y), len(a.test_y)) == (1438, 359)
    assert _digest(a) == _digest(load_dataset("digits", seed=0))
    assert _digest(b) == _digest(load_dataset("digits", seed=1)) != _digest(a)


def _load_concurrently(rank: int, world_size: int, *, cache_dir: str) -> tuple[bool, str]:
    ds, decoded = load_dataset_cached("digits", seed=5, cache_dir=cache_dir)
    return decoded, _digest(ds)


@pytest.mark.integration
def test_concurrent_ranks_decode_once(tmp_path):
    """Four processes start together on a cold cache: exactly one decodes, all get the same arrays."""
    results = run_workers("tests.test_scale:_load_concurrently", 4, timeout_s=120, cache_dir=str(tmp_path / "c"))
    assert sum(decoded for decoded, _ in results) == 1
    assert {d for _, d in results} == {_digest(load_dataset("digits", seed=5))}
    assert not list((tmp_path / "c").glob(".*tmp*"))  # no temporary directory left behind


# ---------------------------------------------------------------- K=16 on this machine


@pytest.mark.integration
def test_k16_short_run(tmp_path):
    k, steps = 16, 3
    out = tmp_path / "run"
    env = {"NPROC": str(k), "MASTER_PORT": str(free_port()), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "GEODML_DATA_CACHE": str(tmp_path / "cache")}
    t0 = time.monotonic()
    proc = run_command(["bash", str(REPO / "launch" / "run.sh"), "--algo", "bsp", "--steps", str(steps), "--batch-size", "8",
                        "--model", "logreg", "--wan", "virtual", "--eval-every", "1000", "--log-every", "1",
                        "--no-progress", "--metrics-port", "0", "--out", str(out)], timeout_s=150, env=env)
    wall_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert summary["world_size"] == k and summary["steps"] == steps
    assert summary["per_rank_val_accuracy"] is None  # one model on every partition: not scored one by one (auto)
    assert len(set(config["region_of_rank"])) == k  # one region per rank: every byte crosses the WAN
    n = config["parameters"]
    assert n == 8 * 8 * 10 + 10  # logreg on 8x8 digits, 10 classes
    assert summary["wan_bytes_by_kind"]["gradient"] == steps * 2 * (k - 1) * n * 4
    # BSP: every partition holds the same model
    models = [torch.load(out / f"rank{r}" / "model.pt") for r in range(k)]
    for m in models[1:]:
        assert all(torch.equal(m[name], models[0][name]) for name in models[0])
    startup = [json.loads((out / f"rank{r}" / "startup.json").read_text()) for r in range(k)]
    assert [s["rank"] for s in startup] == list(range(k))
    for s in startup:
        assert s["total_s"] > 0 and s["peak_rss_bytes"] > 50 * 2**20
        assert s["total_s"] == pytest.approx(sum(s[p] for p in ("imports_s", "process_group_s", "zmq_mesh_s", "data_s",
                                                                 "model_s")), abs=1e-3)
    assert len([p for p in (tmp_path / "cache").iterdir() if p.is_dir()]) == 1  # decoded once for 16 ranks
    print(f"K=16 BSP {steps} steps: wall {wall_s:.1f} s")
