"""``python -m geodml.report``: PNGs from run directories (synthetic runs: fast, exact inputs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from geodml.report import PLOTS, ReportError, link_matrix, load_run, main, write_report
from tests.mp import REPO, _env

pytest.importorskip("matplotlib", reason="matplotlib is in the test extra (pip install -e '.[test]')")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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


def test_load_run_reads_the_contract(tmp_path):
    run = load_run(make_run(tmp_path, "g", "gaia", bytes_per_step=1000, acc_gain=0.01))
    assert run.label == "gaia t0=0.1 (g)"
    assert [r["step"] for r in run.evals] == [10, 20, 30, 40, 50]  # evaluation lines only
    regions, m = link_matrix(run)
    assert regions == ["eu", "us"] and m == [[123, 25000], [25000, 0]]
    running = load_run(make_run(tmp_path, "r", "bsp", bytes_per_step=10, acc_gain=0.01, finished=False))
    assert running.summary is None and len(running.evals) == 5  # a half-written last line is tolerated
    with pytest.raises(ReportError, match="not a geodml run directory"):
        load_run(tmp_path)


def test_report_writes_the_pngs_for_several_runs(tmp_path):
    a = make_run(tmp_path, "bsp", "bsp", bytes_per_step=100_000, acc_gain=0.018)
    b = make_run(tmp_path, "gaia", "gaia", bytes_per_step=3_000, acc_gain=0.016)
    c = make_run(tmp_path, "gaia-live", "gaia", bytes_per_step=3_000, acc_gain=0.01, finished=False,
                 counts=((10, 10, 10), (10, 10, 10)))
    out = tmp_path / "report"
    paths = write_report([a, b, c], out)
    assert [p.name for p in paths] == list(PLOTS)
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, p


def test_cli_errors(tmp_path, capsys):
    assert main([str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_python_dash_m_entry_point_writes_into_the_run_dir(tmp_path):
    run = make_run(tmp_path, "solo", "gaia", bytes_per_step=10, acc_gain=0.01)
    r = subprocess.run([sys.executable, "-m", "geodml.report", str(run)], cwd=REPO, env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(run / n) for n in PLOTS]  # one run: PNGs go into its directory
    assert all((run / n).read_bytes().startswith(PNG_MAGIC) for n in PLOTS)
