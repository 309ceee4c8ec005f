"""Monitoring a person can see, rendered in a real browser (README "Monitoring").

* Live: launch/prometheus/start.sh runs a real Prometheus (Debian package) with the geodml console
  on loopback; it scrapes a short Gaia + SkewScout run (3 ranks in 2 regions, ``--wan real`` so the
  run lasts seconds). Headless Chromium (Debian ``chromium-headless-shell``) opens
  ``/consoles/geodml.html`` while the run trains and waits until every panel has drawn a curve;
  after the run, every panel holds a plotted curve (SVG path vertices, and coloured pixels in the
  screenshot), the page had no errors and the runs table shows the run. The screenshot is kept
  as an artifact (``runs/test-artifacts/`` or ``$GEODML_TEST_ARTIFACTS``).
* Every Grafana panel expression (dashboard variables substituted) returns data from the same
  Prometheus, GPU panels excepted on a machine without CUDA.
* The one-file HTML report (``python -m geodml.report --html``) of that run, and of a study
  directory written by geodml.study itself, loads in Chromium without errors and without any
  request, and shows its plots.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import torch

from geodml.metrics.prometheus import file_sd_groups
from tests.support.browser import Browser, chromium_binary
from tests.support.debpkg import debian_binary
from tests.support.files import make_study
from tests.support.monitoring import (
    CUDA_ONLY,
    DASHBOARD,
    PROM_CONFIG,
    dashboard_exprs,
    east_west_topology,
    promql_metrics_and_labels,
    require,
)
from tests.support.procs import REPO, _env, free_base, free_port, stop_gracefully

pytestmark = pytest.mark.integration
pytest.importorskip("matplotlib", reason="matplotlib is in the test extra (pip install -e '.[test]')")

START_SH = REPO / "launch/prometheus/start.sh"
ARTIFACTS = Path(os.environ.get("GEODML_TEST_ARTIFACTS", REPO / "runs" / "test-artifacts"))
RUN = "dash-gaia"
RANKS = 3
# Two ranks share a region, so the run sends LAN bytes too (the Grafana LAN panel needs them); slow
# links, so that --wan real makes the run last several seconds of wall time.
TOPOLOGY = east_west_topology("dashboard-test", wan_mbps=50, latency_ms=30)
REGIONS = ["east", "east", "west"]
# The console's panels (consoles/geodml.html, data-panel) and the fewest vertices a drawn curve has.
PANELS = ("accuracy_vs_wan_bytes", "accuracy_vs_emulated_time", "accuracy", "train_loss", "wan_bytes_by_link",
          "wan_bytes_by_kind", "skewscout_theta", "skewscout_accuracy_loss", "steps_per_second", "wire_rejections", "cpu",
          "resident_memory")
MIN_VERTICES = {"accuracy_vs_wan_bytes": 4, "accuracy_vs_emulated_time": 4}  # one dot per evaluation; time series: 8
PANEL_STATS_JS = """Array.from(document.querySelectorAll('.geodml_panel')).map(function (d) {
  var curves = Array.from(d.querySelectorAll('svg path.path, svg path.line'));
  var vertices = curves.reduce(function (n, p) { return n + ((p.getAttribute('d') || '').match(/[ML]/g) || []).length; }, 0);
  var svg = curves.length ? curves[0].closest('svg') : d;
  var r = svg.getBoundingClientRect();
  return {panel: d.dataset.panel, curves: curves.length, vertices: vertices, dots: d.querySelectorAll('circle').length,
          error: (d.querySelector('.prom_graph_error') || {textContent: ''}).textContent,
          legend: Array.from(d.querySelectorAll('.rickshaw_legend .label, .geodml_legend')).map(function (e) {
            return e.textContent; }).join(' | '),
          box: [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height]};
})"""


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _query(prom: str, expr: str, at: float | None = None) -> list:
    q = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
    doc = json.loads(_get(f"{prom}/api/v1/query?" + urllib.parse.urlencode(q)))
    assert doc["status"] == "success", (expr, doc)
    return doc["data"]["result"]


def _wait(what: str, timeout_s: float, fn, *logs: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = fn()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.25)
    detail = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{detail}")


def _fast_config(path: Path) -> None:
    """The shipped prometheus.yml, scraping every 250 ms (a run of seconds still draws curves)."""
    cfg = PROM_CONFIG.read_text()
    for key, val in (("scrape_interval", "250ms"), ("scrape_timeout", "250ms"), ("evaluation_interval", "1s"),
                     ("refresh_interval", "1s")):
        cfg, n = re.subn(rf"({key}:\s*)\S+", rf"\g<1>{val}", cfg)
        assert n == 1, key
    path.write_text(cfg)


def _coloured_pixels(png: Path, box: list[float]) -> int:
    """Pixels in ``box`` (a plot's SVG: x, y, w, h; CSS px = screenshot px) whose colour is saturated:
    the curves (axes, grid and labels are grey or black)."""
    from PIL import Image
    img = Image.open(png).convert("RGB")
    x, y, w, h = (int(round(v)) for v in box)
    hsv = img.crop((x, y, min(img.width, x + w), min(img.height, y + h))).convert("HSV").tobytes()
    return sum(1 for i in range(0, len(hsv), 3) if hsv[i + 1] > 90 and hsv[i + 2] > 60)


def _artifact(src: Path, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    dst = ARTIFACTS / name
    dst.write_bytes(src.read_bytes())
    return dst


def _report_html(args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "geodml.report", *args], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=timeout_s)


def _render(browser: Browser, page_path: Path, shot: Path) -> dict:
    """Open a local HTML file; what a reader would see: images and whether they decoded, tables, errors."""
    page = browser.open(page_path.resolve().as_uri(), width=1280, height=900)
    page.wait_for("Array.from(document.images).every(function (i) { return i.complete; })", timeout_s=20)
    info = page.evaluate("""({
      images: Array.from(document.images).map(function (i) {
        return {plot: (i.closest('figure') || {dataset: {}}).dataset.plot, width: i.naturalWidth, height: i.naturalHeight,
                src: i.src.slice(0, 22)}; }),
      requests: performance.getEntriesByType('resource').map(function (e) { return e.name; }),
      tables: Array.from(document.querySelectorAll('table')).map(function (t) { return t.className; }),
      text: document.body.innerText})""")
    page.screenshot(shot)
    info["errors"] = list(page.errors)
    return info


# ---- the live run -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Everything the live tests look at, gathered in one pass (every process is gone when it returns:
    tests/conftest.py reaps children after each test, so nothing may outlive the fixture)."""
    prom_bin = require(debian_binary(("prometheus",), ("prometheus",)), "Prometheus server")
    chrome = require(chromium_binary(), "headless Chromium")
    tmp = tmp_path_factory.mktemp("dashboard")
    out = tmp / RUN
    _fast_config(tmp / "prometheus.yml")
    logs = {name: tmp / f"{name}.log" for name in ("prometheus", "run")}
    prom_port = free_port()
    prom = f"http://127.0.0.1:{prom_port}"
    env = _env({"GEODML_PROMETHEUS_CONFIG": str(tmp / "prometheus.yml"), "GEODML_PROMETHEUS_TARGETS": str(tmp / "targets"),
                "GEODML_PROMETHEUS_DATA": str(tmp / "data"), "GEODML_PROMETHEUS_LISTEN": f"127.0.0.1:{prom_port}",
                "GEODML_PROMETHEUS_ARGS": "--log.level=error"})
    env["PATH"] = f"{Path(prom_bin).parent}{os.pathsep}{env.get('PATH', '')}"
    procs: list[subprocess.Popen] = []
    result: dict = {"tmp": tmp, "out": out, "prom": prom}
    try:
        # start.sh links the run's targets file ahead of the run and serves the console
        procs.append(subprocess.Popen(["bash", str(START_SH), str(out)], cwd=REPO, env=env, stdout=open(logs["prometheus"], "w"),
                                      stderr=subprocess.STDOUT, start_new_session=True))
        _wait("Prometheus to be ready", 30, lambda: _get(f"{prom}/-/ready", 1), logs["prometheus"])
        base = free_base(RANKS)
        # Prometheus applies new file_sd targets up to 5 s late, which would lose the first seconds of a
        # short run: write the targets file the run will write (same function, same ports and labels;
        # the topology's regions) and let Prometheus discover it before the run starts
        out.mkdir()
        (tmp / "topology.toml").write_text(TOPOLOGY)
        groups = file_sd_groups([f"127.0.0.1:{base + r}" for r in range(RANKS)], REGIONS, run=RUN, algo="gaia")
        (out / "prometheus_targets.json").write_text(json.dumps(groups))

        def discovered():
            doc = json.loads(_get(f"{prom}/api/v1/targets?state=active"))
            return sum(t["labels"].get("run") == RUN for t in doc["data"]["activeTargets"]) == RANKS
        _wait("Prometheus to discover the run's targets", 30, discovered, logs["prometheus"])
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={RANKS}", "--master_addr=127.0.0.1",
               f"--master_port={free_port(avoid=tuple(range(base, base + RANKS)))}", "-m", "geodml", "--algo", "gaia",
               "--dataset", "digits",
               "--topology", str(tmp / "topology.toml"), "--steps", "60",
               "--eval-every", "10", "--log-every", "5", "--skewscout", "--travel-every", "20", "--wan", "real",
               "--metrics-port", str(base), "--metrics-linger", "5", "--out", str(out), "--no-progress"]
        job = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=open(logs["run"], "w"), stderr=subprocess.STDOUT,
                               start_new_session=True)
        procs.append(job)
        sel = f'{{run="{RUN}"}}'

        def scraped():
            if job.poll() not in (None, 0):
                raise AssertionError(f"the run failed:\n{logs['run'].read_text(errors='replace')[-4000:]}")
            return len(_query(prom, f"up{sel} == 1")) == RANKS
        _wait("Prometheus to scrape every rank", 120, scraped, logs["run"], logs["prometheus"])
        first_scrape = time.time()

        with Browser(tmp / "chromium-profile", binary=chrome) as browser:
            # live: the page redraws every second; wait until every panel has drawn a curve
            url = f"{prom}/consoles/geodml.html?run={RUN}&range=20s&refresh=1"
            page = browser.open(url, width=1400, height=1000)

            def all_drawn():
                stats = page.evaluate(PANEL_STATS_JS)
                return stats if all(s["vertices"] >= 2 for s in stats) and len(stats) == len(PANELS) else None
            _wait("every console panel to draw a curve", 60, all_drawn, logs["run"])
            result["drawn_while_training"] = job.poll() is None

            # the run ends; the last values are scraped; the page redraws them
            _wait("summary.json", 120, (out / "summary.json").exists, logs["run"])
            summary = json.loads((out / "summary.json").read_text())
            at = [0.0]

            def final_values():
                at[0] = time.time()
                bytes_seen = _query(prom, f"sum(geodml_wan_sent_bytes_total{sel})", at[0])
                steps_seen = _query(prom, f"min(geodml_steps_total{sel})", at[0])
                return (bytes_seen and float(bytes_seen[0]["value"][1]) == summary["wan_bytes_total"]
                        and steps_seen and float(steps_seen[0]["value"][1]) == summary["steps"])
            _wait("Prometheus to scrape the final values", 30, final_values, logs["run"])
            result["final_at"] = at[0]
            # the live page redraws its runs table with the graphs: wait for the final numbers there
            final = (f"\t{summary['steps']}\t", f"\t{summary['final_val_accuracy']:.4f}\t")
            table_js = "document.querySelector('table.geodml_runs').innerText"
            try:
                _wait("the live runs table to show the final numbers", 15,
                      lambda: all(x in page.evaluate(table_js) for x in final))
            except AssertionError:
                pass  # test_console_redraws_while_the_run_trains reports what the table showed
            result["live_panels_at_end"] = page.evaluate(PANEL_STATS_JS)
            result["live_runs_table"] = page.evaluate(table_js)
            # what a person opening the page now sees: the range fitted to the run
            page.navigate(f"{prom}/consoles/geodml.html?run={RUN}&range={int(time.time() - first_scrape) + 2}s&refresh=0")
            _wait("every console panel to draw the finished run", 30, all_drawn, logs["run"])
            result["panels"] = page.evaluate(PANEL_STATS_JS)
            result["runs_table"] = page.evaluate("document.querySelector('table.geodml_runs').innerText")
            result["console_png"] = page.screenshot(tmp / "console.png")
            # the full-page screenshot resized the viewport: panel boxes in page coordinates, read again
            result["panels_in_shot"] = page.evaluate(PANEL_STATS_JS)
            result["console_errors"] = list(page.errors)
            result["summary"] = summary

            # every Grafana panel expression, against the same Prometheus at the same instant
            result["grafana"] = {}
            for title, expr in dashboard_exprs(json.loads(DASHBOARD.read_text())):
                q = expr.replace("$algo", "gaia").replace("$run", RUN).replace("$__rate_interval", "15s")
                result["grafana"][f"{title}: {q}"] = (len(_query(prom, q, at[0])), promql_metrics_and_labels(expr)[0])

            _wait("the run to exit after --metrics-linger", 60, lambda: job.poll() is not None)
            result["run_returncode"] = job.returncode
            report = tmp / "report.html"
            r = _report_html([str(out), "--html", str(report)])
            result["report_cli"] = r
            if r.returncode == 0:
                result["report"] = _render(browser, report, tmp / "report.png")
                result["report_png"] = tmp / "report.png"
    finally:
        stop_gracefully(procs)
    return result


def test_console_draws_every_panel_live(live):
    assert live["run_returncode"] == 0, live["tmp"]
    stats = {s["panel"]: s for s in live["panels"]}
    assert tuple(stats) == PANELS
    png = _artifact(live["console_png"], "console-dashboard.png")
    shot_boxes = {s["panel"]: s["box"] for s in live["panels_in_shot"]}
    for name, s in stats.items():
        assert not s["error"], f"{name}: {s['error']}"
        assert s["curves"] >= 1 and s["vertices"] >= MIN_VERTICES.get(name, 8), (name, s)
        assert RUN in s["legend"], (name, s["legend"])
        assert _coloured_pixels(png, shot_boxes[name]) > 200, f"{name}: no coloured curve in {png}"
    assert stats["accuracy_vs_wan_bytes"]["dots"] >= 4  # one per evaluation that changed the accuracy
    assert "update" in stats["wan_bytes_by_kind"]["legend"] and "travel" in stats["wan_bytes_by_kind"]["legend"]
    assert "east → west" in stats["wan_bytes_by_link"]["legend"] and "t0" in stats["skewscout_theta"]["legend"]
    s = live["summary"]
    table = live["runs_table"]
    assert RUN in table and "gaia" in table and f"{s['final_val_accuracy']:.4f}" in table
    assert f"t0={s['theta_final']:.3g}" in table
    print(f"console screenshot: {png} (curves drawn while the run trained: {live['drawn_while_training']})")


def test_console_redraws_while_the_run_trains(live):
    """Opened before the run's first evaluation, the page (refresh=1) drew every panel during the
    run and, at its end, shows the final numbers in the runs table (redrawn with the graphs)."""
    assert all(s["vertices"] >= 2 for s in live["live_panels_at_end"]), live["live_panels_at_end"]
    s = live["summary"]
    table = live["live_runs_table"]
    assert f"\t{s['steps']}\t{s['final_val_accuracy']:.4f}\t" in table, table


def test_console_page_loads_without_errors(live):
    assert live["console_errors"] == []


def test_every_grafana_expression_returns_data(live):
    cuda = torch.cuda.is_available()
    empty = []
    for what, (count, names) in live["grafana"].items():
        if names & CUDA_ONLY and not cuda:
            assert count == 0, f"GPU metrics on a CPU run: {what}"
        elif count == 0:
            empty.append(what)
    assert not empty, "Grafana expressions without data:\n" + "\n".join(empty)
    assert len(live["grafana"]) >= 24  # every target of every panel was evaluated
    print("\n".join(f"{count:3d} series  {what}" for what, (count, _) in live["grafana"].items()))


def test_html_report_of_the_live_run_renders(live):
    r = live["report_cli"]
    assert r.returncode == 0, r.stderr
    info = live["report"]
    _artifact(live["report_png"], "report-run.png")
    assert info["errors"] == [] and info["requests"] == []  # self-contained: nothing fetched
    plots = {i["plot"]: i for i in info["images"]}
    assert set(plots) == {"accuracy_vs_wan_bytes", "accuracy_vs_emulated_time", "train_loss_vs_steps", "accuracy_vs_steps",
                          "bytes_by_link", "label_distribution"}
    assert all(i["width"] > 300 and i["height"] > 200 and i["src"].startswith("data:image/png") for i in plots.values())
    classes = {c for t in info["tables"] for c in t.split()}   # (a wide table is also "transposed")
    assert "summary" in classes and "links" in classes
    assert f"{live['summary']['final_val_accuracy']:.4f}" in info["text"]


# ---- a study directory ------------------------------------------------------------------------
def test_html_report_of_a_study_renders(tmp_path):
    chrome = require(chromium_binary(), "headless Chromium")
    study = make_study(tmp_path)
    report = tmp_path / "study.html"
    r = _report_html([str(study), "--html", str(report)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(report)]  # --html alone writes the page only
    with Browser(tmp_path / "chromium-profile", binary=chrome) as browser:
        info = _render(browser, report, tmp_path / "study.png")
    _artifact(tmp_path / "study.png", "report-study.png")
    assert info["errors"] == [] and info["requests"] == []
    plots = {i["plot"]: i for i in info["images"]}
    assert {"noniid_accuracy", "accuracy_vs_wan_bytes", "accuracy_vs_emulated_time", "bytes_by_link",
            "label_distribution"} <= set(plots)
    assert all(i["width"] > 300 for i in plots.values())
    classes = {c for t in info["tables"] for c in t.split()}
    assert "study" in classes and "summary" in classes
    # the paper's CIFAR-10 LeNet numbers beside ours (geodml.study.paper's table)
    assert "paper iid" in info["text"] and "76.7% (-0.7 pp)" in info["text"]
