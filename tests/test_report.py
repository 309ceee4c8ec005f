"""``python -m geodml.report``: PNGs and the one-file HTML report from run and study directories
(synthetic runs: fast, exact inputs; tests/test_dashboard.py renders the HTML in a browser)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys

import pytest

from geodml.report import (
    PLOTS,
    ReportError,
    default_target,
    is_study_dir,
    link_matrix,
    load_inputs,
    load_run,
    main,
    markdown_html,
    write_html,
    write_report,
)
from tests.support.files import make_run, make_study
from tests.support.procs import REPO, _env

pytest.importorskip("matplotlib", reason="matplotlib is in the test extra (pip install -e '.[test]')")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_load_run_reads_the_contract(tmp_path):
    run = load_run(make_run(tmp_path, "g", "gaia", bytes_per_step=1000, acc_gain=0.01))
    assert run.label == "gaia t0=0.1 (g)"
    # a FedAvg variant is labelled by what the flags built (summary.json's algo_variant), not --algo fedavg
    p = make_run(tmp_path, "fp", "fedavg", bytes_per_step=10, acc_gain=0.01)
    summary = json.loads((p / "summary.json").read_text())
    (p / "summary.json").write_text(json.dumps({**summary, "algo_variant": "iwds+fedprox"}))
    assert load_run(p).label == "iwds+fedprox (fp)" and load_run(p).algo == "fedavg"
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


@pytest.mark.integration
def test_python_dash_m_entry_point_writes_into_the_run_dir(tmp_path):
    run = make_run(tmp_path, "solo", "gaia", bytes_per_step=10, acc_gain=0.01)
    r = subprocess.run([sys.executable, "-m", "geodml.report", str(run)], cwd=REPO, env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("target accuracy ") and lines[3].split()[0] == "solo"   # the console comparison
    assert lines[-len(PLOTS):] == [str(run / n) for n in PLOTS]  # one run: PNGs go into its directory
    assert all((run / n).read_bytes().startswith(PNG_MAGIC) for n in PLOTS)


# ---- studies and the one-file HTML report ---------------------------------------------------------
def _self_contained(page: str) -> None:
    """No reference leaves the file: every src is a data: URI, no link, script or stylesheet elsewhere."""
    assert re.findall(r'\ssrc="([^"]*)"', page) and all(u.startswith("data:image/png;base64,")
                                                         for u in re.findall(r'\ssrc="([^"]*)"', page))
    assert all(h.startswith("#") for h in re.findall(r'\shref="([^"]*)"', page))
    assert "<script" not in page and "<link" not in page and "@import" not in page and "url(" not in page


def test_html_report_of_runs(tmp_path):
    a = make_run(tmp_path, "bsp", "bsp", bytes_per_step=100_000, acc_gain=0.018)
    b = make_run(tmp_path, "gaia", "gaia", bytes_per_step=3_000, acc_gain=0.016)
    c = make_run(tmp_path, "gaia-live", "gaia", bytes_per_step=3_000, acc_gain=0.01, finished=False)
    out = write_html([a, b, c], tmp_path / "r" / "report.html")
    page = out.read_text()
    _self_contained(page)
    figures = re.findall(r'<figure class="plot" data-plot="([^"]+)"><img alt="[^"]*" src="data:image/png;base64,([^"]+)"',
                         page)
    assert [name for name, _ in figures] == ["accuracy_vs_wan_bytes", "accuracy_vs_emulated_time", "train_loss_vs_steps",
                                             "accuracy_vs_steps", "bytes_by_link", "label_distribution"]
    assert all(base64.b64decode(data).startswith(PNG_MAGIC) and len(data) > 5000 for _, data in figures)
    # summary: one row per run, the running one marked; the target table: 95% of the best accuracy (0.9 -> 0.85)
    assert page.count('<td class="state-finished">finished</td>') == 2 and "running or stopped" in page
    # the runs table is wider than long: one column per run (transposed), one row per field
    assert '<table class="summary transposed"><tr><th>run</th><th>bsp</th><th>gaia</th><th>gaia-live</th></tr>' in page
    assert "<tr><td>knob (final)</td><td>-</td><td>t0=0.1</td><td>-</td></tr>" in page
    assert '<tr><td>final accuracy</td><td class="num">0.9000</td><td class="num">0.8000</td>' in page
    # the settings that differ: only the algorithm (these runs' config.json name nothing else)
    assert ('<h2>Settings that differ between the runs</h2>' in page
            and "<tr><th>run</th><th>algo</th></tr><tr><td>bsp (bsp)</td><td>bsp</td></tr>" in page)
    assert "Bytes and time to accuracy 0.85" in page and "not reached (best 0.5000)" in page
    # bsp reaches it at step 50 (0.018 x 50 = 0.9) having sent 5 MB; gaia (0.016 x 50 = 0.8) does not
    assert '<td>bsp (bsp)</td><td class="num">0.9000</td><td class="num">50</td><td class="num">5 MB</td>' in page
    # bytes per link: every run with a summary, WAN links first, LAN marked
    assert "<th>eu → us</th><th>us → eu</th><th>eu → eu (LAN)</th>" in page
    assert main([str(a), "--html", str(tmp_path / "r2.html"), "--target", "0.5"]) == 0
    assert "Bytes and time to accuracy 0.50" in (tmp_path / "r2.html").read_text()
    assert not (a / PLOTS[0]).exists()  # --html alone writes no PNG


def test_html_report_of_a_study(tmp_path):
    study = make_study(tmp_path)
    assert is_study_dir(study) and not is_study_dir(study / "bsp-iid-s0")
    runs, studies = load_inputs([study, study / "bsp-iid-s0"])  # a run named twice is shown once
    assert [r.name for r in runs] == ["bsp-iid-s0", "bsp-noniid-100-s0", "gaia-t0-0.1-iid-s0", "gaia-t0-0.1-noniid-100-s0"]
    assert runs[2].label == "LeNet Gaia T0=10% iid (gaia-t0-0.1-iid-s0)"  # the study's own series names
    page = write_html([study], tmp_path / "study.html").read_text()
    _self_contained(page)
    assert '<section class="study" id="study-noniid"><h2>Study: noniid (Quagmire Figure 1)</h2>' in page
    # the paper-vs-ours table of geodml.study.paper: ours beside Hsieh et al.'s CIFAR-10 LeNet numbers
    assert "<th>configuration</th><th>iid</th><th>noniid-100%</th><th>paper iid</th><th>paper noniid-100%</th>" in page
    assert "<td>Gaia T0=10%</td><td>85.0% (-5.0 pp)</td><td>30.0% (-60.0 pp)</td><td>76.7% (-0.7 pp)</td>" in page
    assert 'data-plot="noniid_accuracy"' in page and page.count('<tr><td>') >= 4
    paths = write_report([study], tmp_path / "pngs")  # the PNG report takes a study directory too
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in paths)
    assert default_target(runs) == 0.85


def _configure(run, **settings) -> None:
    """Give a synthetic run's config.json sections as a run writes them (config.json's field names)."""
    doc = json.loads((run / "config.json").read_text())
    topology = settings.pop("topology", None)
    for section, fields in settings.items():
        doc["config"].setdefault(section, {}).update(fields)
    if topology:
        doc["topology"] = {"name": topology, "default": False}
    (run / "config.json").write_text(json.dumps(doc))


def test_html_report_shows_topology_lr_and_every_differing_flag(tmp_path):
    """Two Gaia runs at different rates on one topology no longer look the same: the runs table has topology and
    lr, and the settings table lists lr and --comm-timeout (flag names; the same --t0 is not listed)."""
    a = make_run(tmp_path, "g1", "gaia", bytes_per_step=3_000, acc_gain=0.016)
    b = make_run(tmp_path, "g2", "gaia", bytes_per_step=3_000, acc_gain=0.015)
    _configure(a, topology="five-continents", optim={"lr": 0.002}, algo={"t0": 0.1}, comm={"timeout_s": 60.0})
    _configure(b, topology="five-continents", optim={"lr": 0.01}, algo={"t0": 0.1}, comm={"timeout_s": 30.0})
    page = write_html([a, b], tmp_path / "r.html").read_text()
    assert ('<tr><td>topology</td><td>five-continents</td><td>five-continents</td></tr>'
            '<tr><td>lr</td><td class="num">0.002</td><td class="num">0.01</td></tr>') in page
    assert "<tr><th>run</th><th>lr</th><th>comm-timeout</th></tr>" in page
    assert "<td>gaia t0=0.1 (g1)</td><td>0.002</td><td>60</td>" in page and "<th>t0</th>" not in page


def test_a_table_wider_than_long_is_transposed(tmp_path):
    """12 links for 2 runs: one row per link (13 columns would run off the page)."""
    runs = []
    for name in ("x", "y"):
        d = make_run(tmp_path, name, "gaia", bytes_per_step=3_000, acc_gain=0.016)
        summary = json.loads((d / "summary.json").read_text())
        summary["bytes_by_link"] = {f"r{i}->r{j}": 1000 * (i + 1) for i in range(4) for j in range(4) if i != j}
        (d / "summary.json").write_text(json.dumps(summary))
        runs.append(d)
    page = write_html(runs, tmp_path / "r.html").read_text()
    assert '<table class="links transposed"><tr><th>run</th><th>gaia t0=0.1 (x)</th><th>gaia t0=0.1 (y)</th></tr>' in page
    assert '<tr><td>r0 → r1</td><td class="num">1 KB</td><td class="num">1 KB</td></tr>' in page


def test_markdown_subset():
    text = "# Title `x`\n\nSome <b> text\nmore.\n\n| a | b |\n|---|---|\n| 1 | `c` |\n| 2 | 3 |\n\nTail"
    assert markdown_html(text) == (
        "<h3>Title <code>x</code></h3>\n<p>Some &lt;b&gt; text more.</p>\n"
        '<div class="scroll"><table class="study"><tr><th>a</th><th>b</th></tr><tr><td>1</td><td><code>c</code></td></tr>'
        "<tr><td>2</td><td>3</td></tr></table></div>\n<p>Tail</p>")


def test_html_cli_errors(tmp_path, capsys):
    run = make_run(tmp_path, "solo", "gaia", bytes_per_step=10, acc_gain=0.01)
    assert main([str(run), "--html", str(tmp_path / "x.html"), "--target", "1.5"]) == 2
    assert "--target must be in (0, 1]" in capsys.readouterr().err
    assert main([str(tmp_path / "nope"), "--html", str(tmp_path / "x.html")]) == 2
    assert "not a directory" in capsys.readouterr().err and not (tmp_path / "x.html").exists()


def test_console_comparison_by_hand(tmp_path, capsys):
    """BSP: accuracy 0.018 x step, 100 KB a step; Gaia: 0.016 x step, 3 KB a step, partitions' own 0.3 and 0.5.
    At --target 0.5 BSP first reaches it at step 30 (3 MB, 15 emulated s), Gaia at step 40 (120 KB, 20 s). The
    smallest final byte count is Gaia's 150 KB: BSP has no validation within it, Gaia's last (step 50) is 0.80."""
    a = make_run(tmp_path, "bsp", "bsp", bytes_per_step=100_000, acc_gain=0.018)
    b = make_run(tmp_path, "gaia", "gaia", bytes_per_step=3_000, acc_gain=0.016)
    summary = json.loads((b / "summary.json").read_text())
    (b / "summary.json").write_text(json.dumps({**summary, "per_rank_val_accuracy": [0.3, 0.5],
                                                "final_model": "average_of_weights"}))   # as Gaia's, before the headline
    assert main([str(a), str(b), "--target", "0.5", "--out", str(tmp_path / "png")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "target accuracy 50.0% (--target)"
    assert out[1].split() == ["run", "algorithm", "final", "acc.", "measure", "avg.", "of", "weights", "WAN", "bytes",
                              "emulated", "s", "bytes", "to", "50.0%", "emulated", "s", "to", "50.0%", "acc.", "at", "150",
                              "KB"]
    # the headline: BSP's global model; Gaia's partitions' own mean (0.3 + 0.5) / 2 leads, the weights' 0.80 beside it
    assert out[3].split() == ["bsp", "bsp", "0.9000", "global", "model", "-", "5", "MB", "-", "3", "MB", "15.0", "-"]
    assert out[4].split() == ["gaia", "gaia", "0.4000", "partitions'", "own", "(mean)", "0.8000", "150", "KB", "-", "120",
                              "KB", "20.0", "0.8000"]
    assert main([str(a), "--out", str(tmp_path / "png2")]) == 0
    assert capsys.readouterr().out.startswith("target accuracy 85.0% (95% of the best, rounded down; --target sets it)")
