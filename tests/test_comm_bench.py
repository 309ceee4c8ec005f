"""Smoke test of ``python -m geodml.bench transport --quick`` (the full run is for the README table)."""

import json
import sys

import pytest

from tests.support.procs import run_command


@pytest.mark.integration
def test_transport_benchmark_runs_and_reports(tmp_path):
    out = tmp_path / "bench.json"
    r = run_command([sys.executable, "-m", "geodml.bench", "transport", "--quick", "--rates-mbps", "10,100",
                     "--json", str(out)], timeout_s=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "1 MB sparse update" in r.stdout and "8 B round trip" in r.stdout and "Mbit/s" in r.stdout
    res = json.loads(out.read_text())
    assert set(res["throughput_bytes_per_s"]) == {"geodml", "geodml-nowait", "geodml-noauth", "geodml-nowait-noauth",
                                                  "raw", "raw-tracked", "raw-copy"}
    assert set(res["round_trip_s"]) == {"geodml", "geodml-noauth", "raw"}
    assert set(res["auth_throughput_cost"]) == {"geodml", "geodml-nowait"}
    assert "--wire-auth off" in r.stdout
    assert set(res["send_ratio_to_raw_same_guarantee"]) == {"raw-tracked", "raw-copy"}
    assert [p["rate_mbps"] for p in res["pacing"]] == [10, 100]
    for p in res["pacing"]:
        # Loose here (quick mode, shared machine); the benchmark's own target is 2%.
        assert abs(p["achieved_mbps"] / p["rate_mbps"] - 1) < 0.1, p
        assert p["latency_error_median_ms"] > -0.05, p  # never delivered before the model allows


def test_bench_registry_lists_transport():
    from geodml.bench import BENCHMARKS, resolve
    from geodml.bench.transport import main

    assert BENCHMARKS["transport"] == "geodml.bench.transport:main"
    assert resolve("transport") is main
