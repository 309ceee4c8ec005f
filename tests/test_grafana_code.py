"""The Grafana dashboard as code (launch/grafana/dashboard.py, grafana-foundation-sdk), checked
without Grafana (docs/monitoring.md, "The Grafana dashboard"):

* the shipped ``launch/grafana/provisioning/dashboards/geodml.json`` is exactly what the code builds
  (``python launch/grafana/dashboard.py --check``);
* every panel's PromQL expression, and the selectors of the template variables, parse offline
  (promql-parser) with Grafana's variables substituted -- and a broken expression fails that check;
* the headline is the first panel: the xychart of validation accuracy against WAN bytes;
* every metric an expression names is one the exporter (geodml/metrics/prometheus.py) defines.

The same expressions run against a live Prometheus in tests/test_dashboard.py and
tests/test_prometheus.py.
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from geodml.metrics.prometheus import METRICS
from tests.support.monitoring import DASHBOARD, dashboard_exprs, promql_metrics_and_labels
from tests.support.procs import REPO

pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk is in the test extra (pip install -e '.[test]')")
promql_parser = pytest.importorskip("promql_parser", reason="promql-parser is in the test extra (pip install -e '.[test]')")

CODE = REPO / "launch/grafana/dashboard.py"
GRAFANA_VARS = re.compile(r"\$\{?(algo|run)\}?")
LABEL_VALUES = re.compile(r"label_values\((.*),\s*(\w+)\)")


def _load_code():
    spec = importlib.util.spec_from_file_location("geodml_grafana_dashboard", CODE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def code():
    return _load_code()


@pytest.fixture(scope="module")
def dash():
    return json.loads(DASHBOARD.read_text())


def substituted(expr: str) -> str:
    """``expr`` as Grafana sends it with every variable at All: ``$algo``/``$run`` -> ``.*`` inside
    regex matchers, ``$__rate_interval`` -> ``1m``; any other ``$`` is left (and fails the parse)."""
    expr = re.sub(r'(=~|!~)(\s*)"((?:[^"\\]|\\.)*)"', lambda m: f'{m[1]}{m[2]}"{GRAFANA_VARS.sub(".*", m[3])}"', expr)
    return expr.replace("$__rate_interval", "1m")


def parse(expr: str):
    """The parsed expression; raises ValueError on a PromQL error or an unsubstituted variable."""
    q = substituted(expr)
    if "$" in q:
        raise ValueError(f"unsubstituted Grafana variable in {q!r}")
    return promql_parser.parse(q)


def variable_selectors(dash: dict) -> list[tuple[str, str]]:
    """(variable name, metric selector) of every ``label_values(SELECTOR, LABEL)`` variable."""
    out = []
    for v in dash["templating"]["list"]:
        m = LABEL_VALUES.fullmatch(v["query"]["query"])
        assert m and m[2] == v["name"], v
        out.append((v["name"], m[1]))
    return out


def test_shipped_json_is_what_the_code_builds(code, dash):
    assert code.build() == dash
    assert code.render() == DASHBOARD.read_text()  # byte for byte: indent 2, trailing newline
    assert code.render() == code.render()  # deterministic
    assert code.main(["--check"]) == 0


def test_check_fails_on_a_stale_file(code, tmp_path, monkeypatch, capsys):
    stale = json.loads(DASHBOARD.read_text())
    stale["panels"][1]["title"] = "edited by hand"
    monkeypatch.setattr(code, "OUT", tmp_path / "geodml.json")
    code.OUT.write_text(json.dumps(stale, indent=2) + "\n")
    assert code.main(["--check"]) == 1
    out, err = capsys.readouterr()
    assert '-      "title": "edited by hand",' in out and "out of date" in err


def test_the_panels_the_dashboard_had(dash):
    panels = dash["panels"]
    assert dash["uid"] == "geodml" and dash["refresh"] == "5s" and dash["time"] == {"from": "now-30m", "to": "now"}
    assert [p["title"] for p in panels if p["type"] == "row"] == [
        "Bytes per accuracy", "Accuracy and time", "WAN traffic", "SkewScout", "Processes"]
    kinds = [p["type"] for p in panels if p["type"] != "row"]
    assert len(kinds) == 19 and set(kinds) == {"xychart", "table", "timeseries", "bargauge"}
    assert [p["id"] for p in panels] == list(range(1, 25))
    for p in panels:
        if p["type"] == "row":
            continue
        for t in p["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": "geodml-prometheus"}, p["title"]
            assert t["instant"] == (p["type"] in ("table", "bargauge")) and t["range"] != t["instant"], p["title"]
            assert t["format"] == ("table" if p["type"] in ("table", "xychart") else "time_series"), p["title"]


def test_every_expression_parses_offline(dash):
    exprs = dashboard_exprs(dash)
    assert len(exprs) == 25  # every target of every panel
    for title, expr in exprs:
        assert "$" not in substituted(expr), (title, expr)
        try:
            parse(expr)
        except ValueError as e:
            pytest.fail(f"panel {title!r}: {expr}\n{e}")
    selectors = variable_selectors(dash)
    assert [name for name, _ in selectors] == ["algo", "run"]
    for name, selector in selectors:
        assert isinstance(parse(selector), promql_parser.VectorSelector), (name, selector)


@pytest.mark.parametrize("broken", [
    'sum by (algo, run (geodml_steps_total{algo=~"$algo"})',  # unclosed parenthesis
    'rate(geodml_steps_total{run=~"$run"}[$__interval])',  # a variable the check does not substitute
    'geodml_steps_total{run="$run"}',  # a variable outside a regex matcher
    'max by (algo) (geodml_steps_total{algo=~"$algo"}) /',  # dangling operator
    'sum by (run) (rates(geodml_steps_total[$__rate_interval]))',  # no such function
])
def test_a_broken_expression_is_rejected(broken):
    with pytest.raises(ValueError):
        parse(broken)


def test_headline_is_wan_bytes_against_validation_accuracy(dash):
    head = next(p for p in dash["panels"] if p["type"] != "row")
    assert head is dash["panels"][1] and head["type"] == "xychart"
    assert head["title"].lower().startswith("bytes per accuracy") and head["gridPos"]["y"] <= 1
    names = {t["refId"]: promql_metrics_and_labels(t["expr"])[0] for t in head["targets"]}
    assert names == {"A": {"geodml_wan_sent_bytes_total"}, "B": {"geodml_validation_accuracy"}}
    organize = next(tr for tr in head["transformations"] if tr["id"] == "organize")
    assert organize["options"]["renameByName"] == {"Value #A": "WAN bytes", "Value #B": "validation accuracy"}
    units = {o["matcher"]["options"]: {p["id"]: p["value"] for p in o["properties"]} for o in head["fieldConfig"]["overrides"]}
    assert units["WAN bytes"]["unit"] == "decbytes" and units["validation accuracy"]["unit"] == "percentunit"
    assert [tr["id"] for tr in head["transformations"]] == ["merge", "organize", "partitionByValues"]
    assert head["options"]["mapping"] == "auto"


def test_every_metric_is_one_geodml_exports(dash):
    used = set()
    for title, expr in dashboard_exprs(dash) + variable_selectors(dash):
        names, _ = promql_metrics_and_labels(expr)
        assert names, (title, expr)
        assert names <= set(METRICS), f"{title!r} queries {names - set(METRICS)}, which geodml does not export"
        used |= names
    assert "geodml_wan_sent_bytes_total" in used and "geodml_validation_accuracy" in used
