"""Each WAN link's peak rate (issue 67 item 2: summary.json ``wan_peak_bps_by_link`` and Prometheus
``geodml_wan_peak_bits_per_second``): the windows by hand, a whole run by hand, the exporter's gauge."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

import geodml
from geodml.comm.ledger import PEAK_WINDOW_S, Ledger
from geodml.metrics.prometheus import RankExporter

N = 188_810


def test_windows_and_peaks_by_hand():
    """Rank 0 (eu) sends 1,000 B to us from t = 0.5 s for 1 s: 500 B in window 0, 500 in window 1; rank 1 (eu)
    sends 300 B at t = 1.2 s in no time: window 1 holds 800 B on eu->us, the peak 800 x 8 = 6,400 bit/s. LAN
    bytes are not counted; 2,000 B from eu to asia over 0.25 s from t = 3.9 s: 800 B in window 3 (0.1 s), 1,200 in 4."""
    regions = ["eu", "eu", "us", "asia"]
    a, b = Ledger(0, regions), Ledger(1, regions)
    a.record_window(2, 1000, 0.5, 1.0)
    b.record_window(2, 300, 1.2, 0.0)
    a.record_window(1, 99_999, 0.0, 0.1)                  # eu -> eu: LAN
    a.record_window(3, 2000, 3.9, 0.25)
    assert PEAK_WINDOW_S == 1.0
    assert a.window_bytes() == {"eu->asia": {3: pytest.approx(800), 4: pytest.approx(1200)},
                                "eu->us": {0: 500.0, 1: 500.0}}
    peaks = Ledger.peaks([a.window_bytes(), b.window_bytes()])
    assert peaks == {"eu->asia": pytest.approx(1200 * 8), "eu->us": pytest.approx(6400)}
    restored = Ledger(0, regions)
    restored.load_state_dict(a.state_dict())                 # checkpoints keep the windows
    assert restored.window_bytes() == a.window_bytes()


def test_a_bsp_run_by_hand(tmp_path):
    """BSP, K = 2 on five-continents (africa, americas), each step 1 s of emulated compute (--compute-s-per-step):
    each step's ring all-reduce sends 4 N bytes per rank in about 0.07 s, so every 1 s window holds at most one
    step's: the peak is 4 N x 8 bit/s on both links. Under --wan off there is no clock for the links: null."""
    r = geodml.run(["--algo", "bsp", "--partitions", "2", "--topology", "five-continents", "--wan", "virtual",
                    "--compute-s-per-step", "1", "--steps", "5", "--dataset", "digits", "--no-progress",
                    "--eval-every", "5", "--out", str(tmp_path / "v")])
    assert r.summary["peak_window_s"] == 1.0
    assert r.summary["wan_peak_bps_by_link"] == {"africa->americas": pytest.approx(4 * N * 8),
                                                 "americas->africa": pytest.approx(4 * N * 8)}
    off = geodml.run(["--algo", "bsp", "--partitions", "2", "--wan", "off", "--steps", "2", "--dataset", "digits",
                      "--no-progress", "--eval-every", "2", "--out", str(tmp_path / "off")])
    assert off.summary["wan_peak_bps_by_link"] is None


def test_the_exporter_serves_the_peak_of_its_partitions_together():
    """Two hosted partitions of one region, grouped: their windows add before the max (700 + 500 B in window 2)."""
    x = RankExporter(group_by_region=0)
    for rank, windows in ((0, {"eu->us": {1: 300.0, 2: 700.0}}), (1, {"eu->us": {2: 500.0}})):
        x.add_partition(labels={"rank": rank, "region": "eu", "algo": "bsp", "run": "r"},
                        ledger_rows=lambda: [], ledger_windows=lambda w=windows: w)
    fams = {f.name: f for f in text_string_to_metric_families(x.exposition().decode())}
    (sample,) = fams["geodml_wan_peak_bits_per_second"].samples
    assert sample.value == 1200 * 8 and sample.labels["src_region"] == "eu" and sample.labels["dst_region"] == "us"
