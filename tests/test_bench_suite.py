"""The benchmark suite's plumbing (registry, argument split, table) and the Gaia selection
optimization it led to (NumPy path == torch path, bit for bit). Single process, tiny sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geodml.algorithms.base import AlgoContext, FlatParams
from geodml.algorithms.gaia import Gaia
from geodml.bench import BENCHMARKS, QUICK_SUPPORTED, SUITE, resolve
from geodml.bench.__main__ import main as bench_main
from geodml.bench.__main__ import parse
from geodml.bench.common import format_table


def test_registry_resolves_and_suite_is_registered():
    for name in BENCHMARKS:
        assert callable(resolve(name)), name
    assert set(SUITE) <= set(BENCHMARKS)
    assert set(SUITE) <= QUICK_SUPPORTED
    assert SUITE == ("throughput", "kernels", "transport", "startup", "scale")


def test_parse_names_and_options():
    assert parse([]) == (list(SUITE), [])
    assert parse(["--quick"]) == (list(SUITE), ["--quick"])
    assert parse(["kernels", "--sizes", "1000"]) == (["kernels"], ["--sizes", "1000"])
    assert parse(["kernels", "startup", "--quick"]) == (["kernels", "startup"], ["--quick"])
    with pytest.raises(ValueError, match="unknown benchmark 'nope'"):
        parse(["nope"])
    with pytest.raises(ValueError, match="one benchmark only"):
        parse(["kernels", "startup", "--sizes", "1000"])
    with pytest.raises(ValueError, match="not supported by \\['dgc'\\]"):
        parse(["kernels", "dgc", "--quick"])


def test_main_bad_input_exits_2(capsys):
    assert bench_main(["nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("unknown benchmark") == 1


def test_federation_refuses_what_it_cannot_measure(capsys, monkeypatch):
    """Checked before any run starts: too few steps for a timed round; --device cuda without CUDA
    (stubbed here, so this holds on a GPU host)."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for argv, why in ((["--steps", "40"], "--steps must be >= 60"),
                      (["--device", "cuda"], "--device cuda needs CUDA")):
        assert bench_main(["federation", *argv]) == 2
        assert why in capsys.readouterr().err, argv


def test_step_refuses_too_few_steps_to_time(capsys):
    """Checked before any run starts: 30 steps log at 10, 20 and 30, and the line at 30 holds the final
    evaluation, so one timed window would be left (it divided by zero)."""
    for argv in (["--steps", "30"], ["--k", "0"]):
        assert bench_main(["step", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.count("python -m geodml.bench step: error: --steps must be >= 40") == 1, argv


def test_format_table_by_hand():
    out = format_table(["name", "ms", "n"], [["a", 1.23456, 1000], ["bb", 1234.5, 7]], title="T")
    assert out.splitlines() == [
        "T",
        "name       ms      n",
        "----  -------  -----",
        "a       1.235  1,000",
        "bb    1,234.5      7",
    ]


def test_kernels_table_small(capsys):
    # 20,000 elements, 2 repeats: the Gaia rows must report the significant fractions the
    # benchmark constructs (2% and 50%, +- sampling noise), and x bound = ms / (B * floor ms / 8).
    from geodml.bench import kernels
    rows = kernels.measure([20_000], repeats=2, stat=min)
    gaia = ["gaia select, fused C", "gaia select, NumPy", "gaia select, torch path"]
    assert [r[0] for r in rows] == gaia * 2 + ["dgc select s=99.9%, fused C", "dgc select s=99.9%, NumPy"]
    for r in rows:
        kernel_ms, floor_ms, b = r[3], r[4], r[2]
        assert r[6] == pytest.approx(kernel_ms / (b * floor_ms / 8), rel=1e-9)
    f2 = float(rows[0][7].split("%")[0]) / 100
    f50 = float(rows[3][7].split("%")[0]) / 100
    assert rows[0][7] == rows[1][7] == rows[2][7] and rows[3][7] == rows[4][7] == rows[5][7]  # all paths agree
    assert abs(f2 - 0.02) < 0.005 and abs(f50 - 0.5) < 0.02
    assert bench_main(["kernels", "--sizes", "20000", "--repeats", "1"]) == 0
    assert "gaia select" in capsys.readouterr().out


def _gaia(n: int, seed: int) -> Gaia:
    g = torch.Generator().manual_seed(seed)
    flat = FlatParams(torch.nn.Linear(n, 1, bias=False))
    flat.data.copy_(torch.randn(n, generator=g))
    ctx = AlgoContext(rank=0, world_size=1, seed=0, steps_per_epoch=1, total_steps=1, batch_size=1,
                      label_counts=np.ones((1, 2), dtype=np.int64))
    algo = Gaia(flat=flat, comm=None, momentum=0.9, ctx=ctx, t0=0.1, lr0=0.1)
    algo.v.copy_(torch.randn(n, generator=g) * 0.1)
    return algo


@pytest.mark.parametrize("scale", [0.05, 0.1, 0.4])  # ~4%, ~8%, ~70% significant (dense)
def test_gaia_numpy_selection_equals_torch(scale):
    n = 5000
    a, b = _gaia(n, 1), _gaia(n, 1)
    a.v.mul_(scale / 0.1)
    b.v.mul_(scale / 0.1)
    b._np = None  # the torch path (what non-CPU devices run)
    na, da = a.select(0.1)
    nb, db = b.select(0.1)
    assert (na, da) == (nb, db) and na > 0
    assert torch.equal(a.v, b.v)
    if da:
        assert torch.equal(a.vals, b.vals)
    else:
        assert torch.equal(a.vals[:na], b.vals[:nb]) and torch.equal(a.idx32[:na], b.idx32[:nb])
    # by hand: exactly the entries with |v| > 0.1 |w| were taken and cleared
    v0 = _gaia(n, 1).v.mul_(scale / 0.1)
    sig = v0.abs() > (a.flat.data.abs() * 0.1)
    assert na == int(sig.sum())
    assert torch.equal(a.v, torch.where(sig, torch.zeros(()), v0))


@pytest.mark.integration
def test_layout_benchmark_runs_both_variants_and_compares_bytes(capsys):
    """``layout --quick`` on one setup: two real geodml runs (NCHW, --channels-last), a ratio, the same bytes."""
    assert bench_main(["layout", "--quick", "--setups", "lenet bsp K=5"]) == 0
    out = capsys.readouterr().out
    row = next(x for x in out.splitlines() if x.startswith("lenet bsp K=5 "))
    nchw, cl, ratio, same = row.split()[-4:]
    assert float(ratio) == pytest.approx(float(nchw) / float(cl), rel=2e-3) and same == "yes", row


def test_layout_benchmark_bad_input_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_main(["layout", "--setups", "nope"])
    assert exc.value.code == 2 and "unknown setup(s) ['nope']" in capsys.readouterr().err


@pytest.mark.integration
def test_layers_benchmark_times_both_paths_and_checks_identical_runs(capsys):
    """``layers --quick``: a row per model and pass with ratio = torch / compiled, and one pair of
    whole runs (GEODML_NO_KERNELS=1 and not) that end with the same accuracy, loss and bytes."""
    assert bench_main(["layers", "--quick"]) == 0
    out = capsys.readouterr().out
    rows = [x for x in out.splitlines() if x.startswith(("cnn ", "lenet ", "bn-lenet ", "cifar-cnn ")) and ", batch " in x]
    assert len(rows) == 8, out
    for row in rows:
        torch_ms, ours_ms, ratio = (float(v) for v in row.split()[-3:])
        assert ratio == pytest.approx(torch_ms / ours_ms, rel=2e-3), row
    run = next(x for x in out.splitlines() if x.startswith("cnn fedavg P=10 C=0.5 "))
    assert run.split()[-1] == "yes", run
