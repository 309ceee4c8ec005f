"""Plots of finished (or running) runs without a server: ``python -m geodml.report RUN_DIR [RUN_DIR ...]``.

Reads each run directory (README "Run directory": metrics.jsonl, summary.json, config.json,
partitions.json) and writes PNGs:

* ``accuracy_vs_wan_bytes.png`` -- bytes-per-accuracy: validation accuracy of the global model
  against the WAN bytes spent so far, every run on one axis (log x). The Quagmire paper's
  question in one picture: which algorithm reaches an accuracy with the fewest bytes.
* ``accuracy_vs_emulated_time.png`` -- the same accuracy against emulated seconds
  (time-to-accuracy under the WAN model).
* ``bytes_by_link.png`` -- a region x region heat map of the bytes each run sent (row = source
  region, column = destination; the diagonal is LAN traffic inside a region).
* ``label_distribution.png`` -- per-partition label counts as stacked bars (like Figure 1 of
  Hsu et al. 2019), one panel per distinct partitioning among the runs.

With ``--html OUT.html`` it writes one self-contained page instead (no server, no network: the
plots are inline PNGs, the CSS is inline): a summary table of the runs, bytes and time to a target
accuracy, the two accuracy plots, bytes per link (heat maps and a table), the label distribution
and, for a study directory (``python -m geodml.study NAME --out DIR``), the study's own tables
(paper vs ours, from geodml.study) and bar charts. An argument may be a run directory or a study
directory (whose runs are then shown).

matplotlib is an optional dependency (``pip install 'geodml[plot]'``).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import html
import io
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

from geodml import rundir
from geodml.runs import ReportError, Run, bytes_log_formatter, human_bytes, load_run, plot_accuracy

PLOTS = ("accuracy_vs_wan_bytes.png", "accuracy_vs_emulated_time.png", "bytes_by_link.png", "label_distribution.png")


def link_matrix(run: Run) -> tuple[list[str], list[list[float]]]:
    """(regions, bytes[src][dst]) from summary.json's per-link bytes (diagonal: LAN)."""
    links = run.bytes_by_link
    regions = run.regions
    for link in links:
        for r in link.split("->"):
            if r not in regions:
                regions.append(r)
    idx = {r: i for i, r in enumerate(regions)}
    m = [[0.0] * len(regions) for _ in regions]
    for link, b in links.items():
        s, d = link.split("->")
        m[idx[s]][idx[d]] += float(b)
    return regions, m


def plot_links(runs: list[Run], path: Path | IO[bytes], *, plt) -> None:
    from matplotlib.colors import LogNorm

    runs = [r for r in runs if r.summary is not None]
    n = max(1, len(runs))
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.6 * rows), squeeze=False)
    for ax in axes.flat[len(runs):]:
        ax.axis("off")
    if not runs:
        axes.flat[0].text(0.5, 0.5, "no finished run (summary.json) to show", ha="center", va="center")
    import numpy as np

    mats = [link_matrix(run) for run in runs]
    every = [v for _, m in mats for row in m for v in row if v > 0]
    # one log colour scale for all runs, so their links compare at a glance
    lo, hi = (min(every), max(every)) if every else (1.0, 10.0)
    norm = LogNorm(vmin=lo, vmax=hi if hi > lo else lo * 10)
    mid = math.sqrt(norm.vmin * norm.vmax)
    for ax, run, (regions, m) in zip(axes.flat, runs, mats):
        if not any(v > 0 for row in m for v in row):
            ax.text(0.5, 0.5, f"{run.label}\nno bytes sent", ha="center", va="center", transform=ax.transAxes)
            ax.axis("off")
            continue
        im = ax.imshow(np.ma.masked_equal(np.array(m), 0.0), cmap="viridis", norm=norm)
        ax.set_xticks(range(len(regions)), regions, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(regions)), regions, fontsize=8)
        ax.set_xlabel("destination region")
        ax.set_ylabel("source region")
        for i, row in enumerate(m):
            for j, v in enumerate(row):
                if v > 0:
                    ax.text(j, i, human_bytes(v) + ("\n(LAN)" if i == j else ""), ha="center", va="center",
                            fontsize=7, color="black" if v > mid else "white")
        wan = (run.summary or {}).get("wan_bytes_total", 0)
        ax.set_title(f"{run.label}\nWAN {human_bytes(wan)}", fontsize=9)
        bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="bytes sent", format=bytes_log_formatter(minor=False))
        bar.ax.yaxis.set_minor_formatter(bytes_log_formatter(minor=True))
    fig.suptitle("Bytes per link (row: source region, column: destination)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_labels(runs: list[Run], path: Path | IO[bytes], *, plt) -> None:
    groups: list[tuple[list[list[int]], list[Run]]] = []  # distinct partitionings
    for run in runs:
        counts = (run.partitions or {}).get("label_counts")
        if not counts:
            continue
        for c, members in groups:
            if c == counts:
                members.append(run)
                break
        else:
            groups.append((counts, [run]))
    n = max(1, len(groups))
    fig, axes = plt.subplots(1, n, figsize=(max(6.0, 1.0 + 0.6 * max((len(c) for c, _ in groups), default=5)) * min(n, 2),
                                            4.8), squeeze=False)
    if not groups:
        axes[0][0].text(0.5, 0.5, "no partitions.json in the runs", ha="center", va="center")
    for ax, (counts, members) in zip(axes[0], groups):
        k, classes = len(counts), len(counts[0])
        cmap = plt.get_cmap("tab10" if classes <= 10 else "tab20")
        bottoms = [0] * k
        for c in range(classes):
            heights = [counts[p][c] for p in range(k)]
            ax.bar(range(k), heights, bottom=bottoms, color=cmap(c % cmap.N), label=str(c), width=0.8,
                   edgecolor="white", linewidth=0.3)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        regions = (members[0].config or {}).get("region_of_rank") or []
        ticks = [f"{p}\n{regions[p]}" if p < len(regions) else str(p) for p in range(k)]
        ax.set_xticks(range(k), ticks, fontsize=8)
        ax.set_xlabel("partition (rank) and region")
        ax.set_ylabel("training examples")
        part = members[0].summary or {}
        desc = part.get("partition") or ((members[0].config or {}).get("config", {}).get("data", {}).get("partition", ""))
        skew = part.get("skew")
        ent = (members[0].partitions or {}).get("mean_entropy_bits")
        title = f"{desc}{f' skew {skew:g}' if isinstance(skew, (int, float)) else ''}"
        if isinstance(ent, (int, float)):
            title += f", mean label entropy {ent:.2f} bits"
        ax.set_title(title + "\nruns: " + ", ".join(r.name for r in members), fontsize=9)
        ax.legend(title="label", fontsize=7, title_fontsize=8, bbox_to_anchor=(1.0, 1.0), loc="upper left")
    fig.suptitle("Label distribution per partition")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _pyplot():
    """matplotlib.pyplot on the Agg backend; ReportError (what to install) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ReportError("the report needs matplotlib: pip install 'geodml[plot]' (or pip install matplotlib)") from None
    return plt


# ---- studies ---------------------------------------------------------------------------------
@dataclass
class Study:
    """A study directory (``python -m geodml.study NAME --out DIR``): its report and its runs."""

    path: Path
    report: dict
    """NAME.json as the study wrote it (``study``, ``paper``, and ``rows``, ``levels`` or ``runs``)."""
    markdown: str
    """The study's tables (markdown, from geodml.study's own table builders)."""
    runs: list[Run] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.report.get("study", self.path.name))


def study_reports(path: Path) -> list[tuple[Path, dict]]:
    """(file, report) for every study report in directory ``path``: a JSON object with a ``study`` key."""
    found = []
    for f in sorted(path.glob("*.json")):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("study"), str):
            found.append((f, doc))
    return found


def is_study_dir(path: Path) -> bool:
    """A directory with a study report and no run of its own (no summary.json, no metrics.jsonl)."""
    return (path.is_dir() and not (path / rundir.SUMMARY).exists() and not (path / rundir.METRICS).exists()
            and bool(study_reports(path)))


def _is_run_dir(path: Path) -> bool:
    return path.is_dir() and ((path / rundir.SUMMARY).exists() or (path / rundir.METRICS).exists())


def _row_label(row: dict) -> str | None:
    """A paper study row's label, as the study's own plots name it (series and setting)."""
    try:
        from geodml.study import paper
        return f"{paper.series_name(row, True)} {row['setting']}"
    except (ImportError, KeyError, TypeError):
        return None


def _study_run_dirs(path: Path, report: dict) -> list[tuple[Path, str | None]]:
    """(run directory, label or None) of a study's runs: its rows in order, else every run below ``path``.

    A row's ``dir`` is as the study recorded it (relative to where it ran); when that does not
    exist from here, the directory of the same name inside the study directory is used."""
    out: list[tuple[Path, str | None]] = []
    for row in report.get("rows") or report.get("runs") or []:
        if not isinstance(row, dict) or not row.get("dir"):
            continue
        d = Path(row["dir"])
        if not _is_run_dir(d):
            d = path / d.name
        if _is_run_dir(d):
            out.append((d, _row_label(row) if "rows" in report else None))
    if not out:
        out = [(d, None) for d in sorted(path.iterdir()) if _is_run_dir(d)]
    return out


def _study_markdown(json_path: Path, report: dict) -> str:
    """The study's tables: geodml.study.paper's table builders for a paper study (the figure-style
    table with the paper's numbers beside ours), else the NAME.md the study wrote."""
    if "rows" in report:
        try:
            from geodml.study import paper
            return paper.format_markdown(report)
        except (ImportError, KeyError, TypeError, ValueError):
            pass  # a report from another geodml version: its own markdown below
    md = json_path.with_suffix(".md")
    return md.read_text() if md.exists() else ""


def load_study(path: str | Path) -> Study:
    """Read a study directory (its first study report) and its runs. ReportError when it holds none."""
    p = Path(path)
    reports = study_reports(p) if p.is_dir() else []
    if not reports:
        raise ReportError(f"{p}: not a study directory (no NAME.json with a 'study' key)")
    json_path, report = reports[0]
    study = Study(path=p, report=report, markdown=_study_markdown(json_path, report))
    for d, label in _study_run_dirs(p, report):
        run = load_run(d)
        if label:
            run.label = f"{label} ({run.name})"
        study.runs.append(run)
    return study


def load_inputs(paths: list[str | Path]) -> tuple[list[Run], list[Study]]:
    """Runs and studies named on the command line; a study's runs join the runs (each once)."""
    runs: list[Run] = []
    studies: list[Study] = []
    seen: set[Path] = set()
    for path in paths:
        if is_study_dir(Path(path)):
            study = load_study(path)
            studies.append(study)
            new = study.runs
        else:
            new = [load_run(path)]
        for run in new:
            key = run.path.resolve()
            if key not in seen:
                seen.add(key)
                runs.append(run)
    return runs, studies


# ---- PNGs ------------------------------------------------------------------------------------
def write_report(run_dirs: list[str | Path], out: str | Path) -> list[Path]:
    """Read the runs (a study directory stands for its runs) and write the PNGs into ``out``; returns their paths."""
    plt = _pyplot()
    runs, _ = load_inputs(run_dirs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in PLOTS]
    plot_accuracy(runs, "wan_bytes_total", paths[0], xlabel="WAN bytes sent (all ranks, between regions)",
                  title="Bytes per accuracy: validation accuracy vs WAN bytes", log_x=True, plt=plt)
    plot_accuracy(runs, "emulated_s", paths[1], xlabel="emulated time [s] (slowest rank)",
                  title="Time to accuracy: validation accuracy vs emulated time", log_x=False, plt=plt)
    plot_links(runs, paths[2], plt=plt)
    plot_labels(runs, paths[3], plt=plt)
    return paths


# ---- one-file HTML ---------------------------------------------------------------------------
MAX_LINK_MAPS = 12  # heat maps drawn in the HTML report; the bytes-per-link table has every run

CSS = """
body { font: 14px/1.45 -apple-system, 'Segoe UI', 'DejaVu Sans', Arial, sans-serif; color: #222; margin: 0 auto;
       max-width: 1280px; padding: 16px 24px 48px; }
h1 { font-size: 1.6em; margin: 0.2em 0; } h2 { font-size: 1.25em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
h3 { font-size: 1.05em; margin-top: 1.2em; } .meta, .note { color: #666; font-size: 0.9em; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; white-space: nowrap; } th { white-space: normal; }
th { background: #f4f4f4; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafafa; }
.scroll { overflow-x: auto; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
figure { margin: 0.8em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; } code { background: #f4f4f4; padding: 0 3px; }
.state-running { color: #b36b00; } .state-finished { color: #1a7f37; }
"""


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _fig_uri(draw: Callable[[Any], Any]) -> str | None:
    """Call ``draw(file)`` (a plot function writing a PNG to a file object); the PNG as a data URI,
    or None when it drew nothing."""
    buf = io.BytesIO()
    if draw(buf) is False or not buf.getvalue():
        return None
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(name: str, uri: str | None, caption: str) -> str:
    if uri is None:
        return ""
    return (f'<figure class="plot" data-plot="{_esc(name)}"><img alt="{_esc(caption)}" src="{uri}">'
            f"<figcaption>{_esc(caption)}</figcaption></figure>")


def _table(headers: list[str], rows: list[list[Any]], *, cls: str = "") -> str:
    """An HTML table; a cell is text (escaped) or a ``(text, css class)`` pair."""
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for c in row:
            text, klass = c if isinstance(c, tuple) else (c, "")
            cells.append(f'<td class="{klass}">{_esc(text)}</td>' if klass else f"<td>{_esc(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<div class="scroll"><table class="{cls}"><tr>{head}</tr>{"".join(body)}</table></div>'


def _num(v: Any, spec: str) -> tuple[str, str]:
    return ("-" if not isinstance(v, (int, float)) else format(v, spec)), "num"


def _bytes_cell(v: Any) -> tuple[str, str]:
    return ("-" if not isinstance(v, (int, float)) else human_bytes(v)), "num"


def _last_eval(run: Run) -> dict:
    return run.evals[-1] if run.evals else {}


def summary_rows(runs: list[Run]) -> list[list[Any]]:
    """One row per run: what it is, how far it got, its accuracy, bytes and times (summary.json;
    the last evaluation line for a run still going)."""
    rows = []
    for run in runs:
        s, last = run.summary or {}, _last_eval(run)
        knob = f"{s['theta_name']}={s['theta_final']:g}" if s.get("theta_name") and s.get("theta_final") is not None else "-"
        data = " ".join(str(x) for x in (s.get("dataset"), s.get("partition")) if x)
        if isinstance(s.get("skew"), (int, float)):
            data += f" skew {s['skew']:g}"
        finished = run.summary is not None and "final_val_accuracy" in s
        savings = s.get("wan_savings_vs_bsp")
        settings = run_settings(run)
        rows.append([
            run.name, run.algo, knob, _num(s.get("world_size"), ".0f"), data or "-", settings.get("topology", "-"),
            _num(settings.get("lr"), ".4g"),
            _num(s.get("steps", last.get("step")), ".0f"), _num(s.get("epochs", last.get("epoch")), ".2f"),
            _num(headline(s)[0] if finished else last.get("val_accuracy"), ".4f"),
            MEASURE_TEXT.get(headline(s)[1], headline(s)[1]) if finished else "last evaluation",
            _num(s.get("final_val_accuracy") if finished and headline(s)[1] == "partition_mean" else None, ".4f"),
            _bytes_cell(s.get("wan_bytes_total", last.get("wan_bytes_total"))), _bytes_cell(s.get("lan_bytes_total")),
            ("-" if not isinstance(savings, (int, float)) else f"x{savings:.1f}", "num"),
            _num(s.get("emulated_seconds", last.get("emulated_s")), ".1f"),
            _num(s.get("wall_seconds", last.get("wall_s")), ".1f"),
            ("finished", "state-finished") if finished else ("running or stopped", "state-running")])
    return rows


SUMMARY_HEADERS = ["run", "algorithm", "knob (final)", "ranks", "data", "topology", "lr", "steps", "epochs",
                   "final accuracy", "measure",
                   "avg. of weights", "WAN bytes",
                   "LAN bytes", "WAN savings vs BSP", "emulated s", "wall s", "state"]


NOT_SETTINGS = ("out", "resume", "progress", "metrics_port", "metrics_host", "metrics_linger_s", "tensorboard")
"""config.json fields that do not change what a run computes (where it writes, what it shows)."""


def run_settings(run: Run) -> dict[str, Any]:
    """The run's settings by flag name (``lr``, ``t0``, ``comm-timeout``; ``topology`` as its name, e.g.
    five-continents, or ``default``) from config.json; empty for a run without one."""
    from geodml.config import OPTIONS, upgrade_config
    doc = run.config or {}
    cfg = upgrade_config(doc.get("config") or {})   # a run directory written before the algo sections split
    flag = {(o.section, o.name): o.flag.removeprefix("--") for o in OPTIONS}
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        if isinstance(value, dict):
            for name, v in value.items():
                if name not in NOT_SETTINGS:
                    out[flag.get((key, name), f"{key}.{name}")] = v
        elif key not in NOT_SETTINGS:
            out[flag.get((None, key), key)] = value
    topo = doc.get("topology")
    if isinstance(topo, dict):
        out["topology"] = topo.get("name") or ("default" if topo.get("default") else out.get("topology") or "-")
    return out


def differing_settings(runs: list[Run]) -> tuple[list[str], list[dict[str, Any]]]:
    """The settings whose values are not the same in every run with a config.json (in the order first seen),
    and each run's settings."""
    per_run = [run_settings(run) for run in runs]
    known = [s for s in per_run if s]
    keys = list(dict.fromkeys(k for s in known for k in s))
    differ = [k for k in keys if len({json.dumps(s.get(k), sort_keys=True, default=str) for s in known}) > 1]
    return differ, per_run


def _setting_text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)):
        return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) or "[]"
    return f"{v:g}" if isinstance(v, float) else str(v)


MAX_COLUMNS = 10
"""A table with more columns than this and fewer rows than columns is drawn transposed (one column per row
of the original), so that it fits the page instead of running off it."""


def _wide_table(headers: list[str], rows: list[list[Any]], *, cls: str = "") -> str:
    """:func:`_table`, transposed when it is wider than it is long and wider than MAX_COLUMNS."""
    if len(headers) <= MAX_COLUMNS or len(headers) <= len(rows) + 1:
        return _table(headers, rows, cls=cls)
    first, *rest = headers
    columns = [first] + [str(r[0][0] if isinstance(r[0], tuple) else r[0]) for r in rows]
    return _table(columns, [[h, *(r[i] for r in rows)] for i, h in enumerate(rest, 1)], cls=cls + " transposed")


def _settings_section(runs: list[Run]) -> str:
    differ, per_run = differing_settings(runs)
    if not differ:
        return ""
    headers = ["run", *differ]
    rows = [[run.label, *(_setting_text(settings.get(k)) for k in differ)] for run, settings in zip(runs, per_run)]
    note = '<p class="note">Every setting (flag name) whose value is not the same in all these runs.</p>'
    return _section("settings", "Settings that differ between the runs", note + _wide_table(headers, rows, cls="settings"))


def _curves_section(runs: list[Run], plt) -> str:
    loss = _fig_uri(lambda f: plot_accuracy(runs, "step", f, xlabel="step", title="Training loss against steps",
                                            log_x=False, plt=plt, ykey="train_loss",
                                            ylabel="training loss (mean over partitions)"))
    acc = _fig_uri(lambda f: plot_accuracy(runs, "step", f, xlabel="step", title="Validation accuracy against steps",
                                           log_x=False, plt=plt))
    figs = (_figure("train_loss_vs_steps", loss, "Training loss (metrics.jsonl's train_loss, every logged step).")
            + _figure("accuracy_vs_steps", acc, "Validation accuracy of the global model at each evaluation."))
    return _section("curves", "Training curves", f'<div class="pair">{figs}</div>')


def default_target(runs: list[Run]) -> float | None:
    """95% of the best final accuracy among the runs, rounded down to 0.01 (None without evaluations)."""
    best = [max(r["val_accuracy"] for r in run.evals) for run in runs if run.evals]
    return math.floor(95 * max(best)) / 100 if best else None


def to_target_rows(runs: list[Run], target: float) -> list[list[Any]]:
    """Per run, the first evaluation at or above ``target``: its step, WAN bytes, emulated and wall seconds."""
    rows = []
    for run in runs:
        hit = next((r for r in run.evals if r["val_accuracy"] >= target), None)
        if hit is None:
            best = max((r["val_accuracy"] for r in run.evals), default=None)
            rows.append([run.label, "not reached" + ("" if best is None else f" (best {best:.4f})"), "-", "-", "-", "-"])
            continue
        rows.append([run.label, _num(hit["val_accuracy"], ".4f"), _num(hit.get("step"), ".0f"),
                     _bytes_cell(hit.get("wan_bytes_total")), _num(hit.get("emulated_s"), ".1f"), _num(hit.get("wall_s"), ".1f")])
    return rows


def link_table(runs: list[Run]) -> tuple[list[str], list[list[Any]]]:
    """Headers and rows of bytes per link: one row per run, one column per link (``src->dst``; LAN
    links, inside one region, are marked)."""
    links = list(dict.fromkeys(link for run in runs for link in run.bytes_by_link))
    links.sort(key=lambda link: (link.split("->")[0] == link.split("->")[-1], link))  # WAN first
    headers = ["run"] + [link.replace("->", " → ") + (" (LAN)" if link.split("->")[0] == link.split("->")[-1] else "")
                         for link in links]
    rows = [[run.label] + [_bytes_cell(run.bytes_by_link.get(link)) for link in links] for run in runs if run.bytes_by_link]
    return headers, rows


_TABLE_SEP = re.compile(r"^\|?(\s*:?-+:?\s*\|)+\s*:?-*:?\s*$")


def _md_inline(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _esc(text))


def _md_cells(line: str) -> list[str]:
    line = line.strip()
    return [c.strip() for c in line[1 if line.startswith("|") else 0:-1 if line.endswith("|") else None].split("|")]


def markdown_html(text: str) -> str:
    """The markdown subset the studies write, as HTML: ``#`` headings, pipe tables, paragraphs, `code`."""
    out: list[str] = []
    para: list[str] = []
    lines = text.splitlines()

    def flush() -> None:
        if para:
            out.append(f"<p>{_md_inline(' '.join(para))}</p>")
            para.clear()

    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        if line.lstrip().startswith("|") and i + 1 < len(lines) and _TABLE_SEP.match(lines[i + 1].strip()):
            flush()
            header, body = _md_cells(line), []
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                body.append(_md_cells(lines[i]))
                i += 1
            head = "".join(f"<th>{_md_inline(h)}</th>" for h in header)
            rows = "".join("<tr>" + "".join(f"<td>{_md_inline(c)}</td>" for c in r) + "</tr>" for r in body)
            out.append(f'<div class="scroll"><table class="study"><tr>{head}</tr>{rows}</table></div>')
            continue
        if line.startswith("#"):
            flush()
            level = min(6, len(line) - len(line.lstrip("#")) + 2)
            out.append(f"<h{level}>{_md_inline(line.lstrip('#').strip())}</h{level}>")
        elif not line.strip():
            flush()
        else:
            para.append(line.strip())
        i += 1
    flush()
    return "\n".join(out)


def _study_figures(study: Study, plt) -> list[str]:
    """The study's own charts (accuracy bars, knob curves, SkewScout savings) as figures."""
    figs = []
    rep = study.report
    try:
        if "rows" in rep:
            from geodml.study import paper
            figs.append(_figure(f"{study.name}_accuracy", _fig_uri(lambda f: paper.plot_bars(rep, f, plt)),
                                f"{study.name}: final accuracy per configuration and setting ({rep.get('paper', '')})"))
            if study.name == "hparams":
                figs.append(_figure(f"{study.name}_knobs", _fig_uri(lambda f: paper.plot_knobs(rep, f, plt)),
                                    "hparams: accuracy over each algorithm's knob, ours beside the paper's"))
        elif "figure8" in rep:
            from geodml.study import skewscout
            figs.append(_figure(f"{study.name}_savings", _fig_uri(lambda f: skewscout.write_plot(rep, f) is not None),
                                "SkewScout and Oracle: communication savings over BSP per non-IID level"))
    except (ImportError, KeyError, TypeError, ValueError) as exc:  # another geodml version's report: tables only
        figs.append(f'<p class="note">(no chart: {_esc(exc)})</p>')
    return figs


def _study_section(study: Study, plt) -> str:
    parts = [f'<section class="study" id="study-{_esc(study.name)}"><h2>Study: {_esc(study.name)} '
             f"({_esc(study.report.get('paper', ''))})</h2>",
             f'<p class="note">{_esc(study.path)}: {len(study.runs)} runs; the tables are the study\'s own '
             "(geodml.study), with the paper's numbers beside ours where the paper has them.</p>",
             markdown_html(study.markdown), *_study_figures(study, plt)]
    for level in sorted((study.path / "levels").glob("*.md")):  # SkewScout: one Oracle table per level
        parts.append(f"<details><summary>{_esc(level.stem)}</summary>{markdown_html(level.read_text())}</details>")
    return "\n".join(parts) + "</section>"


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{_esc(sid)}"><h2>{_esc(title)}</h2>{body}</section>'


def _target_section(runs: list[Run], target: float) -> str:
    note = ('<p class="note">The first evaluation at or above the target (default: 95% of the best accuracy among '
            "these runs).</p>")
    table = _table(["run", "accuracy", "step", "WAN bytes", "emulated s", "wall s"], to_target_rows(runs, target), cls="target")
    return _section("to-target", f"Bytes and time to accuracy {target:.2f}", note + table)


def _accuracy_section(runs: list[Run], plt) -> str:
    by_bytes = _fig_uri(lambda f: plot_accuracy(
        runs, "wan_bytes_total", f, xlabel="WAN bytes sent (all ranks, between regions)",
        title="Bytes per accuracy: validation accuracy vs WAN bytes", log_x=True, plt=plt))
    by_time = _fig_uri(lambda f: plot_accuracy(
        runs, "emulated_s", f, xlabel="emulated time [s] (slowest rank)",
        title="Time to accuracy: validation accuracy vs emulated time", log_x=False, plt=plt))
    figs = (_figure("accuracy_vs_wan_bytes", by_bytes, "Validation accuracy of the global model against the WAN bytes "
                    "spent so far (log x); a star marks the last point.")
            + _figure("accuracy_vs_emulated_time", by_time, "The same accuracy against emulated seconds (compute "
                      "measured, communication from the WAN model)."))
    return _section("accuracy", "Bytes per accuracy and time to accuracy", f'<div class="pair">{figs}</div>')


def _links_section(runs: list[Run], plt) -> str:
    finished = [r for r in runs if r.summary is not None]
    shown = finished[:MAX_LINK_MAPS]
    headers, rows = link_table(runs)
    caption = "Region x region bytes sent (row: source, column: destination; the diagonal is LAN)"
    if len(finished) > len(shown):
        caption += f"; the first {len(shown)} finished runs, {len(finished) - len(shown)} more in the table"
    body = (_wide_table(headers, rows, cls="links") if rows else "") + _figure(
        "bytes_by_link", _fig_uri(lambda f: plot_links(shown, f, plt=plt)), caption)
    return _section("links", "Bytes per link", body)


def _labels_section(runs: list[Run], plt) -> str:
    fig = _figure("label_distribution", _fig_uri(lambda f: plot_labels(runs, f, plt=plt)),
                  "Training examples per label in each partition (stacked), per distinct partitioning")
    return _section("labels", "Label distribution per partition", fig)


def render_html(runs: list[Run], studies: list[Study], *, target: float | None, title: str, plt) -> str:
    """The whole page (a string): studies first, then the runs' tables and plots."""
    from geodml import __version__
    target = default_target(runs) if target is None else target
    sections = [(f"study-{s.name}", f"study {s.name}", _study_section(s, plt)) for s in studies]
    sections.append(("runs", "runs", _section("runs", "Runs", _wide_table(SUMMARY_HEADERS, summary_rows(runs), cls="summary"))))
    settings = _settings_section(runs)
    if settings:
        sections.append(("settings", "settings", settings))
    if target is not None:
        sections.append(("to-target", "to target", _target_section(runs, target)))
    sections += [("accuracy", "accuracy", _accuracy_section(runs, plt)), ("curves", "curves", _curves_section(runs, plt)),
                 ("links", "links", _links_section(runs, plt)), ("labels", "labels", _labels_section(runs, plt))]
    nav = "".join(f'<a href="#{_esc(sid)}">{_esc(name)}</a>' for sid, name, _ in sections)
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    meta = (f"geodml {__version__}, {when}: {len(runs)} runs{f', {len(studies)} studies' if studies else ''}. "
            "Self-contained: the plots are inline.")
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>'
            f'<style>{CSS}</style></head><body><h1>{_esc(title)}</h1><p class="meta">{_esc(meta)}</p>'
            f"<nav>{nav}</nav>\n" + "\n".join(body for _, _, body in sections) + "\n</body></html>\n")


def write_html(paths: list[str | Path], out: str | Path, *, target: float | None = None) -> Path:
    """Read runs and study directories and write one self-contained HTML page to ``out``; returns its path."""
    plt = _pyplot()
    runs, studies = load_inputs(paths)
    names = [s.name for s in studies] or [r.name for r in runs]
    title = "geodml report: " + ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    page = render_html(runs, studies, target=target, title=title, plt=plt)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page)
    tmp.replace(out)
    return out


def _own_mean(summary: dict) -> float | None:
    """The mean of the partitions' own final accuracies (the Quagmire paper's measure), when reported."""
    per = summary.get("per_rank_val_accuracy")
    vals = [v for v in (per.values() if isinstance(per, dict) else per or []) if isinstance(v, (int, float))]
    return sum(vals) / len(vals) if vals else None


def headline(summary: dict) -> tuple[float | None, str]:
    """The run's one accuracy and its measure (docs/run-directory.md "Which accuracy"): summary.json's
    ``headline_val_accuracy``, or for a run written before that key, the same rule on its other keys."""
    if "headline_val_accuracy" in summary:
        return summary["headline_val_accuracy"], summary.get("headline_measure", "global")
    own, final_model = _own_mean(summary), summary.get("final_model", "global")
    if final_model == "average_of_weights" and own is not None:
        return own, "partition_mean"
    return summary.get("final_val_accuracy"), final_model


MEASURE_TEXT = {"partition_mean": "partitions' own (mean)", "global": "global model",
                "average_of_weights": "average of weights"}
"""How the report names a headline_measure."""


def console_rows(runs: list[Run], target: float | None) -> tuple[list[str], list[list[str]]]:
    """The console comparison (headers, rows): per run its final accuracy (:func:`headline`: the mean of the
    partitions' own where they hold different models, with the average of their weights beside it), WAN
    bytes, emulated seconds, the WAN bytes and emulated seconds of
    its first validation at or above ``target``, and its accuracy at equal bytes: at the last validation
    within the smallest final WAN byte count among the runs (the budget every run spent)."""
    finals = [r.summary.get("wan_bytes_total") for r in runs if r.summary and isinstance(r.summary.get("wan_bytes_total"),
                                                                                          (int, float))]
    budget = min(finals) if finals else None
    t = "-" if target is None else f"{100 * target:.1f}%"
    headers = ["run", "algorithm", "final acc.", "measure", "avg. of weights", "WAN bytes", "emulated s", f"bytes to {t}",
               f"emulated s to {t}", "acc. at " + ("-" if budget is None else human_bytes(budget))]
    rows = []
    for run in runs:
        s = run.summary or {}
        acc, measure = headline(s)
        weights = s.get("final_val_accuracy") if measure == "partition_mean" else None
        hit = None if target is None else next((e for e in run.evals if e["val_accuracy"] >= target), None)
        within = [e for e in run.evals if budget is not None and isinstance(e.get("wan_bytes_total"), (int, float))
                  and e["wan_bytes_total"] <= budget]
        rows.append([run.name, run.algo, "-" if acc is None else f"{acc:.4f}", MEASURE_TEXT.get(measure, measure)
                     if acc is not None else "-", "-" if weights is None else f"{weights:.4f}",
                     _bytes_cell(s.get("wan_bytes_total"))[0], _num(s.get("emulated_seconds"), ".1f")[0],
                     "not reached" if hit is None else _bytes_cell(hit.get("wan_bytes_total"))[0],
                     "not reached" if hit is None else _num(hit.get("emulated_s"), ".1f")[0],
                     f"{within[-1]['val_accuracy']:.4f}" if within else "-"])
    return headers, rows


def console_table(runs: list[Run], target: float | None) -> str:
    """:func:`console_rows` as an aligned text table, with the target's provenance on its first line."""
    headers, rows = console_rows(runs, target)
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geodml.report", description="Write PNG plots of geodml run directories: "
                                "accuracy vs WAN bytes and vs emulated time (all runs on one axis), bytes per link "
                                "as a region x region heat map, label distribution per partition; or, with --html, one "
                                "self-contained HTML page with those plots, a summary table and a study's tables.")
    p.add_argument("runs", nargs="+", metavar="DIR", help="run directories (--out of geodml runs) or study directories "
                   "(--out of python -m geodml.study; their runs are shown)")
    p.add_argument("--out", help="directory for the PNGs (default: the run directory for one run, "
                   "./geodml-report for several; with --html, PNGs only when --out is given)")
    p.add_argument("--html", metavar="OUT.html", help="write one self-contained HTML report (inline plots and CSS)")
    p.add_argument("--target", type=float, help="accuracy for the bytes/time-to-accuracy columns of the console "
                   "table and the HTML report (default: 95%% of the best accuracy among the runs)")
    args = p.parse_args(argv)
    if args.target is not None and not 0 < args.target <= 1:
        print(f"geodml.report: error: --target must be in (0, 1], got {args.target}", file=sys.stderr)
        return 2
    try:
        runs, _ = load_inputs(args.runs)
        target = args.target if args.target is not None else default_target(runs)
        if args.out or not args.html:  # (--html alone: the page holds the table, stdout names the page only)
            _say("target accuracy " + ("-" if target is None else f"{100 * target:.1f}%")
                 + (" (--target)" if args.target is not None else " (95% of the best, rounded down; --target sets it)"))
            _say(console_table(runs, target) + "\n")
        written: list[Path] = []
        if args.html:
            written.append(write_html(args.runs, args.html, target=args.target))
        if args.out or not args.html:
            out = args.out or (args.runs[0] if len(args.runs) == 1 and not is_study_dir(Path(args.runs[0]))
                               else "geodml-report")
            written += write_report(args.runs, out)
    except ReportError as exc:
        print(f"geodml.report: error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        _say(str(path))
    return 0


def _say(line: str) -> None:
    """Print ``line``; a reader that has gone (``| head``) leaves the rest of the report to be written, unprinted."""
    import os
    try:
        print(line, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
