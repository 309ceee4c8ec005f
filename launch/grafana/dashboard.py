"""The geodml Grafana dashboard as code (grafana-foundation-sdk).

This script is the source of ``launch/grafana/provisioning/dashboards/geodml.json``, the dashboard
Grafana provisions (``launch/grafana/start.sh``): edit the panels here, never the JSON. Regenerate
with

    python launch/grafana/dashboard.py           # writes the JSON
    python launch/grafana/dashboard.py --check   # exit 1 if the shipped JSON differs from the code

``tests/test_grafana_code.py`` checks that the shipped file equals ``build()`` and that every PromQL
expression parses. Rows and panels are listed in ``LAYOUT``, one helper per panel kind; the
headline, bytes per accuracy, stays the first panel.

Two things the SDK cannot express are added after encoding (``_sdk_gaps``): the ``definition`` of
the query variables and ``builtIn`` of Grafana's built-in annotation. The SDK's xychart builder
models the xychart options before Grafana 11.1 (``seriesMapping``/``dims``), so the xychart panels
use the generic panel builder with the 11.1+ options (``mapping``, ``series``) as plain values.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, common, dashboard, prometheus, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat, QueryEditorMode

OUT = Path(__file__).resolve().parent / "provisioning/dashboards/geodml.json"
DS = dm.DataSourceRef(type_val="prometheus", uid="geodml-prometheus")
SEL = '{algo=~"$algo", run=~"$run"}'
"""The dashboard variables' selector every expression carries."""
WAN = f"sum by (algo, run) (geodml_wan_sent_bytes_total{SEL})"
ACC = f"max by (algo, run) (geodml_validation_accuracy{SEL})"
EMU = f"max by (algo, run) (geodml_emulated_time_seconds{SEL})"
XYCHART_VERSION = "11.3.0"
"""xychart options in the 11.1+ form (one series per frame, after partitionByValues)."""


# ---- building blocks ----------------------------------------------------------------------------
def _query(ref: str, expr: str, *, instant: bool = False, table_format: bool = False,
           legend: str | None = None) -> prometheus.Dataquery:
    q = (prometheus.Dataquery().datasource(DS).ref_id(ref).expr(expr).editor_mode(QueryEditorMode.CODE)
         .format(PromQueryFormat.TABLE if table_format else PromQueryFormat.TIME_SERIES))
    q = q.instant() if instant else q.range()
    return q.legend_format(legend) if legend is not None else q


def _common(panel, pid: int, title: str, description: str, pos: tuple[int, int, int, int], targets):
    """Id, title, description, grid position (x, y, w, h), datasource, targets, classic palette."""
    x, y, w, h = pos
    panel = (panel.id(pid).title(title).description(description).datasource(DS)
             .grid_pos(dm.GridPos(x=x, y=y, w=w, h=h))
             .color_scheme(dashboard.FieldColor().mode(dm.FieldColorModeId.PALETTE_CLASSIC)))
    return panel.targets(targets)


def _prop(id_val: str, value: object) -> dm.DynamicConfigValue:
    return dm.DynamicConfigValue(id_val=id_val, value=value)


def _transform(id_val: str, options: dict) -> dm.DataTransformerConfig:
    return dm.DataTransformerConfig(id_val=id_val, options=options)


def _legend() -> common.VizLegendOptions:
    return (common.VizLegendOptions().show_legend(True).display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM))


def row(pid: int, title: str, y: int) -> dashboard.Row:
    return dashboard.Row(title).id(pid).collapsed(False).grid_pos(dm.GridPos(x=0, y=y, w=24, h=1))


def ts(pid: int, title: str, description: str, pos, unit: str, *targets: tuple[str, str, str]) -> timeseries.Panel:
    """A time series panel; targets are (refId, expr, legendFormat), range queries."""
    panel = _common(timeseries.Panel(), pid, title, description, pos,
                    [_query(ref, expr, legend=legend) for ref, expr, legend in targets])
    return (panel.unit(unit).draw_style(cm.GraphDrawStyle.LINE).line_width(2).show_points(cm.VisibilityMode.AUTO)
            .span_nulls(True).legend(_legend())
            .tooltip(common.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)))


def bar(pid: int, title: str, description: str, pos, unit: str, expr: str, legend: str) -> bargauge.Panel:
    """A horizontal bar gauge of one instant query's last values."""
    panel = _common(bargauge.Panel(), pid, title, description, pos, [_query("A", expr, instant=True, legend=legend)])
    return (panel.unit(unit).orientation(cm.VizOrientation.HORIZONTAL).display_mode(cm.BarGaugeDisplayMode.GRADIENT)
            .show_unfilled(True)
            .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)))


def xy(pid: int, title: str, description: str, pos, x: tuple[str, str, str], y: tuple[str, str, str]) -> dashboard.Panel:
    """An xychart of y against x, one line per algorithm and run; x and y are (name, unit, expr).

    Both are range queries in table format, merged on (Time, algo, run) and split into one frame
    per (algo, run)."""
    panel = _common(dashboard.Panel().type("xychart").plugin_version(XYCHART_VERSION), pid, title, description, pos,
                    [_query("A", x[2], table_format=True), _query("B", y[2], table_format=True)])
    for name, unit, _ in (x, y):
        panel = panel.override_by_name(name, [_prop("unit", unit), _prop("custom.axisLabel", name)])
    return (panel.custom({"show": "points+lines", "pointSize": {"fixed": 6}, "lineWidth": 2, "axisPlacement": "auto"})
            .options({"mapping": "auto", "series": [{}],
                      "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom"},
                      "tooltip": {"mode": "single", "sort": "none"}})
            .transformations([
                _transform("merge", {}),
                _transform("organize", {
                    "excludeByName": {},
                    "indexByName": {"Time": 0, "algo": 1, "run": 2, "Value #A": 3, "Value #B": 4},
                    "renameByName": {"Value #A": x[0], "Value #B": y[0]}}),
                _transform("partitionByValues", {"fields": ["algo", "run"], "keepFields": False,
                                                 "naming": {"asLabels": True}}),
            ]))


def runs_table(pid: int, title: str, description: str, pos, columns: list[tuple[str, str, str]],
               sort_by: str) -> table.Panel:
    """One row per (algo, run): each column (name, unit, expr) an instant query in table format."""
    refs = [chr(ord("A") + i) for i in range(len(columns))]
    panel = _common(table.Panel(), pid, title, description, pos,
                    [_query(ref, expr, instant=True, table_format=True) for ref, (_, _, expr) in zip(refs, columns)])
    for name, unit, _ in columns:
        panel = panel.override_by_name(name, [_prop("unit", unit)])
    return (panel.show_header(True).sort_by([common.TableSortByFieldState().display_name(sort_by).desc(True)])
            .transformations([
                _transform("merge", {}),
                _transform("organize", {"excludeByName": {"Time": True},
                                        "renameByName": {f"Value #{ref}": name for ref, (name, _, _) in zip(refs, columns)}}),
            ]))


def variable(name: str, label: str, selector: str) -> dashboard.QueryVariable:
    """A multi-value query variable over label_values(selector, name), All = ``.*``."""
    query = f"label_values({selector}, {name})"
    return (dashboard.QueryVariable(name).label(label).datasource(DS)
            .query({"query": query, "refId": f"{name}-var"})
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
            .options([]).hide(dm.VariableHide.DONT_HIDE).regex(""))


# ---- the dashboard ------------------------------------------------------------------------------
ARROW = "{{src_region}} \u2192 {{dst_region}}"
PER_RANK = "{{run}} rank {{rank}} ({{region}})"

LAYOUT = [
    row(1, "Bytes per accuracy", 0),
    xy(2, "Bytes per accuracy: validation accuracy vs WAN bytes spent",
       "Headline. Each point: the WAN bytes a run had sent (summed over ranks, only traffic between different "
       "regions) and the accuracy of its global model on the whole test set at that moment. Left and high is "
       "better: fewer bytes for the same accuracy. One line per algorithm and run.",
       (0, 1, 16, 11), ("WAN bytes", "decbytes", WAN), ("validation accuracy", "percentunit", ACC)),
    runs_table(3, "Runs: WAN bytes, accuracy, emulated time",
               "Latest values per run: WAN bytes (all ranks), validation accuracy of the global model, emulated "
               "time (slowest rank) and WAN bytes per accuracy point.",
               (16, 1, 8, 11),
               [("WAN bytes", "decbytes", WAN), ("val accuracy", "percentunit", ACC), ("emulated time", "s", EMU),
                ("bytes per accuracy", "decbytes", f"{WAN} / on (algo, run) {ACC}")],
               sort_by="val accuracy"),

    row(4, "Accuracy and time", 12),
    xy(5, "Validation accuracy vs emulated time",
       "Time-to-accuracy in emulated seconds (compute measured, communication from the WAN link model); x is "
       "the slowest rank's clock.",
       (0, 13, 12, 9), ("emulated time", "s", EMU), ("validation accuracy", "percentunit", ACC)),
    ts(6, "Validation accuracy", "Global model on the whole test set, by wall-clock time.", (12, 13, 6, 9),
       "percentunit", ("A", ACC, "{{algo}} {{run}}")),
    ts(7, "Training loss per rank", "Each rank's own mean training loss over the last log interval.", (18, 13, 6, 9),
       "none", ("A", f"max by (algo, run, rank, region) (geodml_train_loss{SEL})", PER_RANK)),
    ts(8, "Emulated time", "Emulated clock of the slowest rank.", (0, 22, 8, 8), "s", ("A", EMU, "{{algo}} {{run}}")),
    ts(9, "Steps per second per rank", "Training steps per wall-clock second.", (8, 22, 8, 8), "none",
       ("A", f"sum by (run, rank) (rate(geodml_steps_total{SEL}[$__rate_interval]))", "{{run}} rank {{rank}}")),
    ts(10, "Steps", "Steps done (slowest rank).", (16, 22, 8, 8), "none",
       ("A", f"min by (algo, run) (geodml_steps_total{SEL})", "{{algo}} {{run}}")),

    row(11, "WAN traffic", 30),
    bar(12, "WAN bytes by link and kind",
        "Bytes sent from region to region (different regions only), by traffic kind: gradient, update, model, "
        "travel, control.", (0, 31, 8, 10), "decbytes",
        f"sum by (src_region, dst_region, kind) (geodml_wan_sent_bytes_total{SEL})", f"{ARROW} {{{{kind}}}}"),
    ts(13, "WAN send rate by link", "Bytes per wall-clock second on each directed link.", (8, 31, 8, 10), "Bps",
       ("A", f"sum by (src_region, dst_region) (rate(geodml_wan_sent_bytes_total{SEL}[$__rate_interval]))", ARROW)),
    ts(14, "WAN bytes by kind", "Cumulative WAN bytes per traffic kind.", (16, 31, 8, 10), "decbytes",
       ("A", f"sum by (algo, run, kind) (geodml_wan_sent_bytes_total{SEL})", "{{run}} {{kind}}")),
    bar(15, "Emulated link time by link",
        "Sum of the link model's transfer time (latency + bytes/bandwidth) of every message on each link.",
        (0, 41, 8, 8), "s", f"sum by (src_region, dst_region) (geodml_wan_emulated_seconds_total{SEL})", ARROW),
    bar(16, "WAN messages by link and kind", "Messages sent between regions.", (8, 41, 8, 8), "short",
        f"sum by (src_region, dst_region, kind) (geodml_wan_messages_total{SEL})", f"{ARROW} {{{{kind}}}}"),
    bar(17, "LAN bytes by region and kind", "Bytes sent between ranks placed in the same region (not WAN).",
        (16, 41, 8, 8), "decbytes", f"sum by (src_region, kind) (geodml_lan_sent_bytes_total{SEL})",
        "{{src_region}} {{kind}}"),

    row(18, "SkewScout", 49),
    ts(19, "SkewScout theta",
       "The algorithm's communication knob (Gaia T0, FedAvg Iter_Local, DGC E_warm) as SkewScout sets it.",
       (0, 50, 12, 8), "none", ("A", f"max by (algo, run, param) (geodml_skewscout_theta{SEL})", "{{run}} {{param}}")),
    ts(20, "SkewScout accuracy loss",
       "Accuracy loss measured by model traveling (mean over ranks); SkewScout keeps it under sigma_AL.",
       (12, 50, 12, 8), "percentunit",
       ("A", f"avg by (algo, run) (geodml_skewscout_accuracy_loss{SEL})", "{{algo}} {{run}}")),

    row(21, "Processes", 58),
    ts(22, "CPU per rank", "CPU cores used by each rank's process (user + system).", (0, 59, 8, 8), "percentunit",
       ("A", f"sum by (run, rank, region) (rate(geodml_process_cpu_seconds_total{SEL}[$__rate_interval]))", PER_RANK)),
    ts(23, "Resident memory per rank", "RSS of each rank's process.", (8, 59, 8, 8), "bytes",
       ("A", f"max by (run, rank, region) (geodml_process_resident_memory_bytes{SEL})", PER_RANK)),
    ts(24, "GPU memory per rank",
       "CUDA memory allocated by tensors and reserved by the caching allocator (runs on GPUs only).",
       (16, 59, 8, 8), "bytes",
       ("A", f"max by (run, rank) (geodml_gpu_memory_allocated_bytes{SEL})", "{{run}} rank {{rank}} allocated"),
       ("B", f"max by (run, rank) (geodml_gpu_memory_reserved_bytes{SEL})", "{{run}} rank {{rank}} reserved")),
]


def _sdk_gaps(d: dict) -> dict:
    """Keys the SDK's models have no field for, added to the encoded dashboard."""
    for v in d["templating"]["list"]:
        v["definition"] = v["query"]["query"]  # what Grafana's variable editor shows
    for a in d["annotations"]["list"]:
        if a["datasource"].get("uid") == "-- Grafana --":
            a["builtIn"] = 1  # Grafana's own "Annotations & Alerts", not a second query
    return d


def build() -> dict:
    """The dashboard as a JSON-ready dict."""
    b = (dashboard.Dashboard("geodml: bytes per accuracy").uid("geodml")
         .description("Decentralized geo-distributed training runs emulated by geodml: WAN bytes vs accuracy, "
                      "links, SkewScout, processes.")
         .tags(["geodml"]).timezone("browser").editable().tooltip(dm.DashboardCursorSync.CROSSHAIR)
         .refresh("5s").version(1).time("now-30m", "now")
         .timepicker(dashboard.TimePicker().refresh_intervals(["5s", "10s", "30s", "1m", "5m"]))
         .annotation(dashboard.AnnotationQuery().name("Annotations & Alerts").type("dashboard")
                     .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
                     .enable(True).hide(True).icon_color("rgba(0, 211, 255, 1)"))
         .links([])
         .with_variable(variable("algo", "algorithm", "geodml_steps_total"))
         .with_variable(variable("run", "run", 'geodml_steps_total{algo=~"$algo"}')))
    for item in LAYOUT:
        b = b.with_row(item) if isinstance(item, dashboard.Row) else b.with_panel(item)
    model = b.build()
    model.schema_version = 39  # the SDK has no setter; its default is 36
    return _sdk_gaps(json.loads(json.dumps(model, cls=JSONEncoder)))


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help=f"exit 1 if {OUT.name} differs from the code's output")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        old = OUT.read_text() if OUT.exists() else ""
        if old == text:
            return 0
        diff = list(difflib.unified_diff(old.splitlines(), text.splitlines(), str(OUT), "dashboard.py", lineterm="", n=1))
        print("\n".join(diff[:40] + ([f"... {len(diff) - 40} more diff lines"] if len(diff) > 40 else [])))
        print(f"{OUT.name} is out of date: run python launch/grafana/dashboard.py", file=sys.stderr)
        return 1
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
