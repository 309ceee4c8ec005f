"""The fused C selection kernels (geodml/_kernels.c) against the NumPy path they replace: the
same results bit for bit (signed zeros included), at every density and on every DGC path."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from geodml import kernels
from geodml.algorithms.base import AlgoContext, FlatParams
from geodml.algorithms.gaia import Gaia
from geodml.algorithms.topk import TopSelector, target_count


def test_extension_is_built():
    """The bootstrap builds geodml._kernels (setuptools, optional C extension); the suite must
    exercise it, so its absence is a failure here unless the NumPy path is forced on purpose."""
    if os.environ.get("GEODML_NO_KERNELS", "") not in ("", "0"):
        assert kernels.compiled is None and "GEODML_NO_KERNELS" in kernels.describe()
        return
    assert kernels.compiled is not None, f"geodml._kernels is not importable: {kernels.UNAVAILABLE_REASON}"
    assert kernels.describe().startswith("fused C")


needs_ext = pytest.mark.skipif(kernels.compiled is None, reason=f"geodml._kernels unavailable: {kernels.UNAVAILABLE_REASON}")


def _gaia(n: int, seed: int, scale: float) -> Gaia:
    g = torch.Generator().manual_seed(seed)
    flat = FlatParams(torch.nn.Linear(n, 1, bias=False))
    flat.data.copy_(torch.randn(n, generator=g))
    flat.data[::97] = 0.0                        # zero weights: significant whenever v != 0
    ctx = AlgoContext(rank=0, world_size=1, seed=0, steps_per_epoch=1, total_steps=1, batch_size=1,
                      label_counts=np.ones((1, 2), dtype=np.int64))
    algo = Gaia(flat=flat, comm=None, momentum=0.9, ctx=ctx, t0=0.1, lr0=0.1)
    algo.v.copy_(torch.randn(n, generator=g) * scale)
    algo.v[::89] = -0.0                          # signed zeros must survive as they do in NumPy
    return algo


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.numpy().view(np.uint32).copy()


@needs_ext
@pytest.mark.parametrize("scale", [0.0, 0.002, 0.01, 0.05, 0.4, 100.0])  # 0% .. ~1-2% .. ~70% .. 100%
@pytest.mark.parametrize("n", [1, 1000, 65536 + 7, 200_003])
def test_gaia_fused_equals_numpy_bit_for_bit(scale, n):
    a, b = _gaia(n, 1, scale), _gaia(n, 1, scale)
    assert a.fused and b.fused
    b.fused = False
    na, da = a.select(0.1)
    nb, db = b.select(0.1)
    assert (na, da) == (nb, db)
    assert np.array_equal(_bits(a.v), _bits(b.v))
    if da:
        assert np.array_equal(_bits(a.vals), _bits(b.vals))
    elif na:
        assert np.array_equal(_bits(a.vals[:na]), _bits(b.vals[:nb])) and torch.equal(a.idx32[:na], b.idx32[:nb])
        assert a.vals.numel() == na and a.idx32.numel() == na   # resized like the NumPy path
    # by hand: exactly the entries with |v| > fl32(0.1) |w| were taken and cleared to +0
    v0 = _gaia(n, 1, scale).v
    sig = v0.abs() > a.flat.data.abs() * np.float32(0.1)
    assert na == int(sig.sum())
    if da:
        assert torch.equal(a.vals, v0 * sig)   # -0.0 where a negative entry is not selected
    else:
        assert torch.equal(a.idx32[:na].long(), torch.nonzero(sig).view(-1))


@needs_ext
def test_gaia_dense_edge_and_by_hand():
    """N = 4, T = 0.5: entry 0 |v| = 1 > 0.5 x 1; entry 1 not (0.1 <= 0.5 x 1); entry 2 w = 0 so any
    v != 0 is significant; entry 3 -2 > 0.5 x 2 = 1. Three of four: dense (2 x 3 > 4)."""
    v = np.array([1.0, -0.1, 0.25, -2.0], dtype=np.float32)
    w = np.array([1.0, 1.0, 0.0, 2.0], dtype=np.float32)
    vals = np.full(4, 9.0, dtype=np.float32)
    idx = np.full(4, -1, dtype=np.int32)
    n, dense = kernels.compiled.gaia_select(v, w, 0.5, vals, idx)
    assert (n, dense) == (3, True)
    assert vals.tolist() == [1.0, -0.0, 0.25, -2.0] and np.signbit(vals[1])
    assert v.tolist() == [0.0, np.float32(-0.1), 0.0, 0.0] and not np.signbit(v[0]) and not np.signbit(v[3])
    v[:] = [-1.0, 0.0, 5.0, 0.5]                 # two of four: 2 x 2 > 4 is false, still sparse
    n, dense = kernels.compiled.gaia_select(v, w, 0.5, vals, idx)
    assert (n, dense) == (2, False) and idx[:2].tolist() == [0, 2] and vals[:2].tolist() == [-1.0, 5.0]
    assert v.tolist() == [0.0, 0.0, 0.0, 0.5]
    v[:] = [0.1, 0.0, 0.0, 3.0]                  # one of four: sparse
    n, dense = kernels.compiled.gaia_select(v, w, 0.5, vals, idx)
    assert (n, dense) == (1, False) and idx[0] == 3 and vals[0] == 3.0 and v.tolist() == [np.float32(0.1), 0.0, 0.0, 0.0]


@needs_ext
def test_abs_ge_indices_matches_numpy_with_ties():
    rng = np.random.default_rng(0)
    v = rng.standard_normal(100_003).astype(np.float32)
    v[::1000] = np.float32(0.75)
    v[1::1000] = np.float32(-0.75)               # ties at the threshold count (>=)
    out = np.empty(v.size, dtype=np.int64)
    for thr in (0.0, 0.75, 2.5, 10.0):
        c = kernels.compiled.abs_ge_indices(v, thr, out)
        assert np.array_equal(out[:c], np.flatnonzero(np.abs(v) >= np.float32(thr)))


@needs_ext
def test_bad_buffers_are_errors_not_crashes():
    v = np.zeros(8, dtype=np.float32)
    with pytest.raises(ValueError, match="at least N"):
        kernels.compiled.gaia_select(v, v.copy(), 0.1, np.zeros(4, dtype=np.float32), np.zeros(8, dtype=np.int32))
    with pytest.raises(ValueError, match="4-byte"):
        kernels.compiled.gaia_select(v.astype(np.float64), v, 0.1, v.copy(), np.zeros(8, dtype=np.int32))
    with pytest.raises((BufferError, TypeError, ValueError)):
        kernels.compiled.gaia_select(v, v.copy(), 0.1, v.copy(), np.zeros(8, dtype=np.int32)[::2])
    with pytest.raises(ValueError, match="at least N int64"):
        kernels.compiled.abs_ge_indices(v, 0.5, np.zeros(4, dtype=np.int64))


@needs_ext
@pytest.mark.parametrize("sparsity", [0.75, 0.99, 0.999])
@pytest.mark.parametrize("margin", [None, 40.0, -40.0])  # sampled/refined as it comes, forced refined, forced fallback
def test_dgc_fused_selector_equals_numpy(sparsity, margin, monkeypatch):
    if margin is not None:
        monkeypatch.setattr(TopSelector, "MARGIN_SD", margin)
    numel = 100_000
    g = torch.Generator().manual_seed(5)
    for trial in range(3):
        v = torch.randn(numel, generator=g) * torch.rand(numel, generator=g) ** 3
        sels = [TopSelector(numel, sample_ratio=0.01, sparsities=(sparsity,), backend=b,
                            generator=torch.Generator().manual_seed(trial)) for b in ("fused", "numpy")]
        got = [s.select(v, sparsity) for s in sels]
        assert sels[0].path == sels[1].path
        assert torch.equal(got[0], got[1])
        k = target_count(sparsity, numel)
        assert set(torch.topk(v.abs(), k).indices.tolist()) <= set(got[0].tolist())
    if margin == -40.0:  # the sample misses; at 99.9% of 100,000 the sample would be too big: exact
        assert sels[0].path == ("exact" if sparsity == 0.999 else "fallback")


@needs_ext
def test_dgc_fused_is_the_cpu_default_and_exact_path_matches():
    sel = TopSelector(1000, sample_ratio=0.01, sparsities=(0.9,), generator=torch.Generator().manual_seed(0))
    assert sel.backend == "fused"
    ref = TopSelector(1000, sample_ratio=0.01, sparsities=(0.9,), generator=torch.Generator().manual_seed(0),
                      backend="numpy")
    v = torch.tensor([1.0, -1.0] * 500)
    v[7] = -3.0
    a, b = sel.select(v, 0.9), ref.select(v, 0.9)
    assert sel.path == ref.path == "exact" and torch.equal(a, b) and 7 in a.tolist()
