"""Prometheus exporter, scrape config and Grafana dashboard (issue #8).

* the exporter's text: names, labels, WAN/LAN split, absent-until-known values, port errors;
* the exporters of all ranks start together or fail together with one clear error;
* the dashboard JSON is valid Grafana dashboard JSON that queries only metrics (and labels)
  the exporter defines;
* integration: a real Prometheus (Debian package ``prometheus``) scrapes a 3-rank run through
  the run's file_sd targets file and the shipped prometheus.yml, every dashboard expression
  returns data, and the bytes Prometheus sees equal summary.json's.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from geodml.algorithms.knob import KnobSpec
from geodml.cli import parse_config
from geodml.metrics.prometheus import (
    COMMON_LABELS,
    METRICS,
    MetricsError,
    RankExporter,
    advertised_host,
    file_sd_groups,
)
from tests.support.debpkg import debian_binary
from tests.support.monitoring import (
    CUDA_ONLY,
    DASHBOARD,
    PROM_CONFIG,
    dashboard_exprs,
    east_west_topology,
    promql_metrics_and_labels,
    require,
)
from tests.support.procs import REPO, _env, free_base, free_port, run_workers, stop_gracefully

DATASOURCE = REPO / "launch/grafana/provisioning/datasources/geodml.yml"
PROVIDER = REPO / "launch/grafana/provisioning/dashboards/geodml.yml"
LABELS = {"rank": "1", "region": "eu", "algo": "gaia", "run": "r1"}
# Metrics that exist only when the rank uses a GPU.


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _scrape(port: int) -> dict[str, list]:
    text = _get(f"http://127.0.0.1:{port}/metrics").decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


class _State:
    step = 7
    local_train_loss = 0.25


class _Algo:
    knob = KnobSpec("t0", (0.1, 0.2)).bind(get=lambda: 0.2, set=lambda value: None)


ROWS = [
    {"src_region": "eu", "dst_region": "us", "kind": "update", "bytes": 1000, "messages": 3, "emulated_s": 0.5},
    {"src_region": "eu", "dst_region": "asia", "kind": "travel", "bytes": 400, "messages": 1, "emulated_s": 0.25},
    {"src_region": "eu", "dst_region": "eu", "kind": "update", "bytes": 70, "messages": 2, "emulated_s": 0.0},
]


# ---- exporter ---------------------------------------------------------------------------------
def test_exporter_serves_the_design_metrics_with_labels():
    rows = [dict(r) for r in ROWS]
    x = RankExporter(labels=LABELS, ledger_rows=lambda: rows, emulated_s=lambda: 12.5)
    port = free_port()
    x.start("127.0.0.1", port)
    try:
        m = _scrape(port)
        # before the trainer is attached: ledger, clock, steps 0, process metrics; nothing invented
        assert m["geodml_steps_total"][0].value == 0
        for absent in ("geodml_train_loss", "geodml_validation_accuracy", "geodml_skewscout_accuracy_loss",
                       "geodml_skewscout_theta", *CUDA_ONLY):
            assert absent not in m, absent
        wan = {(s.labels["src_region"], s.labels["dst_region"], s.labels["kind"]): s.value
               for s in m["geodml_wan_sent_bytes_total"]}
        assert wan == {("eu", "us", "update"): 1000, ("eu", "asia", "travel"): 400}  # WAN only
        assert [s.value for s in m["geodml_lan_sent_bytes_total"]] == [70]
        assert sum(s.value for s in m["geodml_wan_messages_total"]) == 4
        assert sum(s.value for s in m["geodml_wan_emulated_seconds_total"]) == 0.75
        assert m["geodml_emulated_time_seconds"][0].value == 12.5
        assert m["geodml_process_cpu_seconds_total"][0].value > 0
        assert m["geodml_process_resident_memory_bytes"][0].value > 10e6
        for name, samples in m.items():
            assert name in METRICS, f"{name} is not in METRICS"
            for s in samples:
                assert set(s.labels) == set(METRICS[name][1]), (name, s.labels)
                assert {k: s.labels[k] for k in COMMON_LABELS} == LABELS

        # live sources: read at scrape time, no push needed
        x.watch(state=_State(), algo=_Algo(), accuracy_loss=lambda: 0.03)
        x.log({"step": 7, "train_loss": 1.0})  # no val_accuracy: still absent
        rows.append({"src_region": "eu", "dst_region": "us", "kind": "control", "bytes": 8, "messages": 1,
                     "emulated_s": 0.1})
        m = _scrape(port)
        assert "geodml_validation_accuracy" not in m
        x.log({"step": 10, "val_accuracy": 0.875})
        m = _scrape(port)
        assert m["geodml_validation_accuracy"][0].value == 0.875
        assert m["geodml_steps_total"][0].value == 7
        assert m["geodml_train_loss"][0].value == 0.25
        assert m["geodml_skewscout_accuracy_loss"][0].value == 0.03
        (theta,) = m["geodml_skewscout_theta"]
        assert theta.value == 0.2 and theta.labels["param"] == "t0"
        assert sum(s.value for s in m["geodml_wan_sent_bytes_total"]) == 1408
        x.close()  # the Sink end does not stop the server (the run lingers first)
        assert _scrape(port)["geodml_steps_total"][0].value == 7
    finally:
        t0 = time.monotonic()
        x.stop()
        x.stop()  # idempotent
        assert time.monotonic() - t0 < 3
    with pytest.raises(OSError):
        _get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_exporter_survives_a_failing_source_and_nan_values(capsys):
    def broken():
        raise KeyError("boom")

    class S:
        step = 3
        local_train_loss = math.nan  # no step had a loss yet

    x = RankExporter(labels=LABELS, ledger_rows=broken, emulated_s=lambda: float("nan"))
    x.watch(state=S())
    text = x.exposition().decode()
    assert "geodml_steps_total{" in text and "geodml_wan_sent_bytes_total{" not in text
    assert "geodml_train_loss{" not in text and "geodml_emulated_time_seconds{" not in text
    x.exposition()
    assert capsys.readouterr().err.count("metrics source") == 1  # warned once, not per scrape


def test_port_in_use_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        x = RankExporter(labels=LABELS)
        with pytest.raises(MetricsError, match=rf"cannot listen on 127\.0\.0\.1:{port}: address already in use"):
            x.start("127.0.0.1", port)
    with pytest.raises(MetricsError, match="cannot be resolved"):
        RankExporter(labels=LABELS).start("no-such-host.invalid", free_port())


def _start_collective(rank: int, world: int, bases: list[int]):
    """Phase 1: both ranks start and see each other; phase 2: rank 1's port is taken."""
    from geodml.comm import DistComm
    from geodml.metrics.prometheus import start_rank_exporter
    comm = DistComm(rank=rank, world_size=world, region_of_rank=["eu", "us"])
    results = []
    for phase, base in enumerate(bases):
        blocker = None
        if phase == 1 and rank == 1:
            blocker = socket.socket()
            blocker.bind(("127.0.0.1", base + rank))
            blocker.listen()
        try:
            exporter, targets = start_rank_exporter(comm, rank=rank, local_rank=rank, base_port=base,
                                                    host="127.0.0.1", run="r", algo="bsp")
        except MetricsError as exc:
            results.append(("error", str(exc)))
            continue
        finally:
            if blocker is not None:
                blocker.close()
        try:
            text = _get(f"http://{targets[1 - rank]}/metrics").decode()  # the peer's exporter is up
            results.append(("ok", targets, f'region="{["eu", "us"][1 - rank]}"' in text))
        finally:
            comm.meta_all_gather_object(None)  # don't stop before the peer scraped us
            exporter.stop()
    return results


@pytest.mark.integration
def test_exporters_start_together_or_fail_together():
    base0 = free_base(2)
    bases = [base0, free_base(2, avoid=(base0, base0 + 1))]  # disjoint: phase 2 never meets phase 1's closed sockets
    results = run_workers("tests.test_prometheus:_start_collective", 2, timeout_s=60, bases=bases)
    for ok, (status, msg) in results:
        assert ok == ("ok", [f"127.0.0.1:{bases[0]}", f"127.0.0.1:{bases[0] + 1}"], True)
        # every rank raises the same error, naming rank 1 and its port
        assert status == "error"
        assert (f"rank 1 (port {bases[1]} + local rank 1): cannot listen on 127.0.0.1:{bases[1] + 1}: "
                "address already in use") in msg
        assert "--metrics-port" in msg


def test_file_sd_groups_and_advertised_host():
    groups = file_sd_groups(["h1:9400", "h1:9401", "h2:9400"], ["eu", "eu", "us"], run="r", algo="dgc")
    assert groups[2] == {"targets": ["h2:9400"], "labels": {"run": "r", "algo": "dgc", "rank": "2", "region": "us"}}
    assert advertised_host("127.0.0.1") == "127.0.0.1"
    assert advertised_host("0.0.0.0") == socket.gethostname()


class _Progress:
    def __init__(self, step, loss):
        self.step, self.local_train_loss = step, loss


def test_a_process_exporter_sums_its_partitions_per_region():
    """Above PARTITION_LABEL_LIMIT partitions: counters summed per (process, region), the clock and
    steps their maximum, the loss its mean; process metrics once."""
    x = RankExporter(group_by_region=3, wire_rejected=lambda: {"oversized": 2})
    common = {"algo": "fedavg", "run": "r"}
    eu_us = {"src_region": "eu", "dst_region": "us", "kind": "model"}
    parts = [("eu", [{**eu_us, "bytes": 100, "messages": 1, "emulated_s": 0.5}], 4.0, 10, 1.0),
             ("eu", [{**eu_us, "bytes": 30, "messages": 2, "emulated_s": 0.25},
                     {"src_region": "eu", "dst_region": "eu", "kind": "model", "bytes": 7, "messages": 1,
                      "emulated_s": 0.0}], 6.0, 10, 3.0),
             ("us", [], 1.0, 10, float("nan"))]  # a partition with no loss yet: not in the mean
    for k, (region, rows, clock, step, loss) in enumerate(parts):
        src = x.add_partition(labels={"rank": k, "region": region, **common}, ledger_rows=lambda rows=rows: rows,
                              emulated_s=lambda clock=clock: clock)
        src.watch(state=_Progress(step, loss))
    x.log({"val_accuracy": 0.5})
    m: dict[str, list] = {}
    for fam in text_string_to_metric_families(x.exposition().decode()):
        for smp in fam.samples:
            m.setdefault(smp.name, []).append(smp)

    def by_region(name):
        return {smp.labels["region"]: smp.value for smp in m[name]}

    assert {smp.labels["rank"] for samples in m.values() for smp in samples} == {"p3"}
    assert by_region("geodml_wan_sent_bytes_total") == {"eu": 130}
    assert by_region("geodml_wan_messages_total") == {"eu": 3}
    assert by_region("geodml_wan_emulated_seconds_total") == {"eu": 0.75}
    assert by_region("geodml_lan_sent_bytes_total") == {"eu": 7}
    assert by_region("geodml_emulated_time_seconds") == {"eu": 6.0, "us": 1.0}
    assert by_region("geodml_steps_total") == {"eu": 10, "us": 10}
    assert by_region("geodml_train_loss") == {"eu": 2.0}
    assert by_region("geodml_validation_accuracy") == {"eu": 0.5, "us": 0.5}
    assert len(m["geodml_process_resident_memory_bytes"]) == 1
    assert [(smp.labels["reason"], smp.value) for smp in m["geodml_wire_rejected_messages_total"]] == [("oversized", 2)]


@pytest.mark.integration
@pytest.mark.parametrize("algo,by_region", [(["--algo", "gaia", "--t0", "0.05"], False),
                                            (["--algo", "fedavg", "--client-fraction", "0.5", "--iter-local", "4"], True)])
def test_hosted_partitions_are_served_by_one_exporter_per_process(tmp_path, monkeypatch, algo, by_region):
    """P = 4 on one process: one endpoint; by partition, or (the limit lowered to 2) by region;
    the bytes it serves add up to summary.json's."""
    import threading

    import geodml.metrics.prometheus as prom
    from geodml.cli import main

    if by_region:
        monkeypatch.setattr(prom, "PARTITION_LABEL_LIMIT", 2)
    port, out = free_base(1), tmp_path / "run"
    argv = ["--dataset", "digits", "--partitions", "4", "--steps", "12", "--wan", "virtual", "--no-progress",
            *algo, "--metrics-port", str(port), "--metrics-linger", "5", "--out", str(out)]
    rc: list[int] = []
    runner = threading.Thread(target=lambda: rc.append(main(argv)), daemon=True)
    runner.start()
    deadline = time.monotonic() + 120
    while not (out / "summary.json").exists():
        assert runner.is_alive() and time.monotonic() < deadline, "the run ended or hung before its summary"
        time.sleep(0.2)
    time.sleep(0.5)  # summary.json is written whole, then the linger starts
    m = _scrape(port)
    summary = json.loads((out / "summary.json").read_text())
    regions = json.loads((out / "config.json").read_text())["region_of_rank"]
    ranks = {smp.labels["rank"] for samples in m.values() for smp in samples}
    assert ranks == ({"p0"} if by_region else {"0", "1", "2", "3"})
    assert {smp.labels["region"] for smp in m["geodml_steps_total"]} == set(regions)
    assert all(smp.value == 12 for smp in m["geodml_steps_total"])
    assert sum(smp.value for smp in m["geodml_wan_sent_bytes_total"]) == summary["wan_bytes_total"] > 0
    assert json.loads((out / "prometheus_targets.json").read_text()) == [
        {"targets": [f"127.0.0.1:{port}"], "labels": {"run": "run", "algo": algo[1], "process": "0"}}]
    runner.join(timeout=60)  # the linger ends, the exporter stops, the run returns
    assert rc == [0]


def test_metrics_flags():
    cfg = parse_config(["--metrics-port", "9400", "--metrics-host", "0.0.0.0", "--metrics-linger", "2.5"])
    assert (cfg.metrics_port, cfg.metrics_host, cfg.metrics_linger_s) == (9400, "0.0.0.0", 2.5)
    assert parse_config([]).metrics_port == 0  # off by default
    for argv, msg in ((["--metrics-port", "70000"], "--metrics-port"), (["--metrics-linger", "-1"], "--metrics-linger"),
                      (["--metrics-host", ""], "--metrics-host")):
        with pytest.raises(ValueError, match=msg):
            parse_config(argv)


# ---- dashboard --------------------------------------------------------------------------------
def test_promql_scanner():
    names, labels = promql_metrics_and_labels(
        'sum by (a, b) (rate(m_total{x=~"$v", y!="q{z}"}[$__rate_interval])) / on (a) max by (a) (g)')
    assert names == {"m_total", "g"} and labels == {"a", "b", "x", "y"}


def test_dashboard_is_valid_grafana_json_over_exporter_metrics():
    dash = json.loads(DASHBOARD.read_text())
    for key, typ in (("uid", str), ("title", str), ("panels", list), ("schemaVersion", int), ("templating", dict),
                     ("time", dict), ("annotations", dict)):
        assert isinstance(dash.get(key), typ), key
    assert dash["schemaVersion"] >= 36 and dash.get("id") is None  # provisioned: Grafana assigns the id
    ds_uid = re.search(r"^\s*uid:\s*(\S+)", DATASOURCE.read_text(), re.M).group(1)
    assert re.search(r"^\s*type:\s*prometheus\s*$", DATASOURCE.read_text(), re.M)
    assert "${GF_PATHS_PROVISIONING}/dashboards" in PROVIDER.read_text() and "type: file" in PROVIDER.read_text()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert set(variables) == {"algo", "run"}
    known_vars = set(variables) | {"__rate_interval", "__interval", "__range"}
    ids, cells = set(), set()
    kinds = {"row", "timeseries", "xychart", "table", "bargauge", "stat"}
    transforms = {"merge", "organize", "partitionByValues"}
    for p in dash["panels"]:
        assert isinstance(p["id"], int) and p["id"] not in ids, p["title"]
        ids.add(p["id"])
        assert p["type"] in kinds and p["title"]
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in "xywh") and g["w"] > 0 and g["h"] > 0 and 0 <= g["x"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):  # panels never overlap
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps another panel"
                cells.add((x, y))
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": ds_uid}
        assert isinstance(p["fieldConfig"]["defaults"], dict) and isinstance(p["fieldConfig"]["overrides"], list)
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == ds_uid and t["expr"].strip()
            assert t.get("format", "time_series") in ("time_series", "table")
        for tr in p.get("transformations", []):
            assert tr["id"] in transforms and isinstance(tr["options"], dict)
        if p["type"] == "xychart":  # v2 options: one series per frame (per algorithm and run)
            assert p["pluginVersion"] >= "11.1" and p["options"]["mapping"] == "auto"
            assert all("frame" not in s for s in p["options"]["series"])
    # headline: the first panel with data is bytes-per-accuracy
    head = next(p for p in dash["panels"] if p["type"] != "row")
    assert "bytes per accuracy" in head["title"].lower() and head["gridPos"]["y"] <= 1
    head_names = set().union(*(promql_metrics_and_labels(t["expr"])[0] for t in head["targets"]))
    assert head_names == {"geodml_wan_sent_bytes_total", "geodml_validation_accuracy"}

    var_exprs = []
    for v in variables.values():  # label_values(SELECTOR, LABEL)
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["definition"])
        assert m and v["query"]["query"] == v["definition"], v
        var_exprs.append((f"variable {v['name']}", f"max by ({m.group(2)}) ({m.group(1)})"))
    used = set()
    for title, expr in dashboard_exprs(dash) + var_exprs:
        names, labels = promql_metrics_and_labels(expr)
        assert names, (title, expr)
        unknown = names - set(METRICS)
        assert not unknown, f"panel {title!r} queries {unknown}, which the exporter does not define"
        allowed = set().union(*(METRICS[n][1] for n in names)) | {"job", "instance"}
        assert labels <= allowed, f"panel {title!r} uses labels {labels - allowed} not on {names}"
        assert set(re.findall(r"\$\{?(\w+)", expr)) <= known_vars, (title, expr)
        used |= names
    # every panel family the issue asks for is on the dashboard
    assert {"geodml_wan_sent_bytes_total", "geodml_wan_messages_total", "geodml_wan_emulated_seconds_total",
            "geodml_validation_accuracy", "geodml_emulated_time_seconds", "geodml_skewscout_theta",
            "geodml_skewscout_accuracy_loss", "geodml_process_cpu_seconds_total",
            "geodml_process_resident_memory_bytes"} <= used


CONSOLE = REPO / "launch/prometheus/consoles/geodml.html"
CONSOLE_LIB = REPO / "launch/prometheus/console_libraries/geodml.lib"


def test_console_queries_only_exporter_metrics():
    """The live console (tests/test_dashboard.py renders it) asks for metrics and labels the exporter
    defines, loads nothing from outside Prometheus, and start.sh serves it."""
    page, lib = CONSOLE.read_text(), CONSOLE_LIB.read_text()
    exprs = [e for e in re.findall(r'"((?:[^"\\]|\\.)*)"', page + lib) if "geodml_" in e and "SEL" in e]
    server = re.findall(r'printf "([^"]*geodml_[^"]*)"', lib)  # the runs table's instant queries
    assert len(exprs) >= 14 and len(server) >= 6
    used = set()
    for expr in exprs + server:
        q = expr.replace("SEL", '{run=~".*"}').replace("RATE", "1m").replace("%s", "").replace("%q", '""')
        names, labels = promql_metrics_and_labels(q)
        names -= {"up"}
        assert names <= set(METRICS), (expr, names - set(METRICS))
        allowed = set().union(*(METRICS[n][1] for n in names)) | {"job", "instance"} if names else {"run", "algo"}
        assert labels <= allowed, (expr, labels - allowed)
        used |= names
    assert {"geodml_wan_sent_bytes_total", "geodml_validation_accuracy", "geodml_emulated_time_seconds",
            "geodml_skewscout_theta", "geodml_skewscout_accuracy_loss", "geodml_steps_total", "geodml_train_loss",
            "geodml_process_cpu_seconds_total", "geodml_process_resident_memory_bytes",
            "geodml_wire_rejected_messages_total"} <= used
    panels = re.findall(r'class="col-lg-6 geodml_panel" data-panel="(\w+)"', page)
    assert len(panels) == len(set(panels)) == 12
    for url in re.findall(r'(?:src|href)="([^"]+)"', page + lib):  # only Prometheus's own pages and static files
        assert url.startswith(("{{ pathPrefix }}/", "?")), url
    start = (REPO / "launch/prometheus/start.sh").read_text()
    assert '--web.console.templates="$here/consoles"' in start and '--web.console.libraries="$here/console_libraries"' in start


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
def test_shipped_prometheus_config_is_valid():
    r = subprocess.run(["promtool", "check", "config", str(PROM_CONFIG)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


# ---- integration: a real Prometheus scrapes a 3-rank run --------------------------------------
def _prometheus_binary() -> tuple[str | None, str]:
    """The prometheus binary, installing the Debian package when missing and possible."""
    return debian_binary(("prometheus",), ("prometheus",))


def _query(prom: str, expr: str, at: float) -> list:
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    doc = json.loads(_get(url))
    assert doc["status"] == "success", (expr, doc)
    return doc["data"]["result"]


def _value(prom: str, expr: str, at: float) -> float | None:
    res = _query(prom, expr, at)
    return float(res[0]["value"][1]) if res else None


def _wait(what: str, timeout_s: float, fn, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        if proc is not None and proc.poll() is not None and proc.returncode != 0:
            break
        time.sleep(0.25)
    detail = log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n{detail}")


TOPOLOGY = east_west_topology("metrics-test", wan_mbps=100, latency_ms=20)


@pytest.mark.integration
def test_real_prometheus_scrapes_a_run_through_the_targets_file(tmp_path):
    binary = require(_prometheus_binary(), "Prometheus server")
    # The shipped config, only faster: scrape and rediscover every second.
    prom_dir = tmp_path / "prom"
    (prom_dir / "targets").mkdir(parents=True)
    cfg = PROM_CONFIG.read_text()
    for key, val in (("scrape_interval", "1s"), ("scrape_timeout", "1s"), ("evaluation_interval", "1s"),
                     ("refresh_interval", "1s")):
        cfg, n = re.subn(rf"({key}:\s*)\S+", rf"\g<1>{val}", cfg)
        assert n == 1, key
    (prom_dir / "prometheus.yml").write_text(cfg)
    out = tmp_path / "run-gaia"
    out.mkdir()
    # what launch/prometheus/start.sh does: link the run's targets file into targets/
    (prom_dir / "targets" / "run-gaia.json").symlink_to(out / "prometheus_targets.json")
    (tmp_path / "topo.toml").write_text(TOPOLOGY)

    prom_port = free_port()
    prom = f"http://127.0.0.1:{prom_port}"
    prom_log = tmp_path / "prometheus.log"
    job_log = tmp_path / "job.log"
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(
            [binary, f"--config.file={prom_dir / 'prometheus.yml'}", f"--web.listen-address=127.0.0.1:{prom_port}",
             f"--storage.tsdb.path={prom_dir / 'data'}", "--log.level=warn"],
            stdout=open(prom_log, "w"), stderr=subprocess.STDOUT, start_new_session=True))

        def ready():
            try:
                return _get(f"{prom}/-/ready", timeout=1) is not None
            except OSError:
                return False
        _wait("Prometheus to be ready", 30, ready, procs[0], prom_log)

        base = free_base(3)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=3", "--master_addr=127.0.0.1",
               f"--master_port={free_port(avoid=tuple(range(base, base + 3)))}", "-m", "geodml", "--algo", "gaia",
               "--dataset", "digits",
               "--partition", "label", "--model", "mlp", "--steps", "30", "--eval-every", "10", "--log-every", "5",
               "--skewscout", "--travel-every", "10", "--topology", str(tmp_path / "topo.toml"), "--out", str(out),
               "--no-progress", "--metrics-port", str(base), "--metrics-linger", "10"]
        job = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=open(job_log, "w"), stderr=subprocess.STDOUT,
                               start_new_session=True)
        procs.append(job)
        summary_path = out / "summary.json"
        _wait("the run's summary.json", 150, summary_path.exists, job, job_log)
        summary = json.loads(summary_path.read_text())
        targets = json.loads((out / "prometheus_targets.json").read_text())
        assert [g["targets"] for g in targets] == [[f"127.0.0.1:{base + r}"] for r in range(3)]
        assert summary["wan_bytes_total"] > 0 and summary["lan_bytes_total"] > 0

        sel = '{run="run-gaia"}'
        at = [0.0]

        def final_values_scraped():  # a scrape after the last step of every rank ...
            at[0] = time.time()
            return (_value(prom, f"sum(geodml_wan_sent_bytes_total{sel})", at[0]) == summary["wan_bytes_total"]
                    and _value(prom, f"min(geodml_steps_total{sel})", at[0]) == summary["steps"]
                    and _value(prom, f"count(up{sel} == 1)", at[0]) == 3
                    # ... and enough samples for the dashboard's rate()s: Prometheus applies new
                    # file_sd targets up to 5 s late, a short run may end soon after the first scrape
                    and (_value(prom, f"min(count_over_time(geodml_steps_total{sel}[15s]))", at[0]) or 0) >= 3)
        _wait("Prometheus to scrape the final values", 30, final_values_scraped, job, job_log)
        t = at[0]  # every query below is evaluated at this instant (exporters may stop meanwhile)

        # the bytes Prometheus sees are summary.json's, link by link and kind by kind
        def by(expr: str, *keys: str) -> dict:
            return {"->".join(r["metric"][k] for k in keys): float(r["value"][1]) for r in _query(prom, expr, t)}
        assert by(f"sum by (src_region, dst_region) (geodml_wan_sent_bytes_total{sel})", "src_region", "dst_region") \
            == summary["wan_bytes_by_link"]
        assert by(f"sum by (kind) (geodml_wan_sent_bytes_total{sel})", "kind") == summary["wan_bytes_by_kind"]
        assert _value(prom, f"sum(geodml_lan_sent_bytes_total{sel})", t) == summary["lan_bytes_total"]
        assert _value(prom, f"sum(geodml_wan_messages_total{sel})", t) == summary["wan_messages_total"]
        emu = by(f"sum by (src_region, dst_region) (geodml_wan_emulated_seconds_total{sel})", "src_region", "dst_region")
        assert emu == pytest.approx(summary["wan_emulated_seconds_by_link"])
        assert _value(prom, f"max(geodml_validation_accuracy{sel})", t) == summary["final_val_accuracy"]
        assert _value(prom, f"max(geodml_emulated_time_seconds{sel})", t) == pytest.approx(summary["emulated_seconds"])
        assert _value(prom, 'max(geodml_skewscout_theta{run="run-gaia", param="t0"})', t) == summary["theta_final"]
        assert len(_query(prom, f"geodml_skewscout_accuracy_loss{sel}", t)) == 3  # every rank measured its own
        assert len(_query(prom, f"geodml_train_loss{sel}", t)) == 3

        # every expression of the dashboard returns data (GPU panels exactly when there is a GPU)
        dash = json.loads(DASHBOARD.read_text())
        cuda = torch.cuda.is_available()
        empty = []
        for title, expr in dashboard_exprs(dash):
            q = expr.replace("$algo", "gaia").replace("$run", "run-gaia").replace("$__rate_interval", "15s")
            res = _query(prom, q, t)
            names, _ = promql_metrics_and_labels(expr)
            if names & CUDA_ONLY and not cuda:
                assert res == [], f"{title}: GPU metrics on a CPU run: {res}"
            elif not res:
                empty.append(f"{title}: {q}")
        assert not empty, "dashboard expressions without data:\n" + "\n".join(empty)
        # the template variables' queries find the run
        for var, label in (("algo", "algo"), ("run", "run")):
            url = f"{prom}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": "geodml_steps_total"})
            assert ("gaia" if var == "algo" else "run-gaia") in json.loads(_get(url))["data"]

        # the job lingers, stops its exporters and exits cleanly
        _wait("the run to exit after --metrics-linger", 60, lambda: job.poll() is not None)
        log = job_log.read_text(errors="replace")
        assert job.returncode == 0, log[-4000:]
        assert "metrics: exporters stay up 10 s" in log
    finally:
        stop_gracefully(procs)
