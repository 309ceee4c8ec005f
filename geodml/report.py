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

matplotlib is an optional dependency (``pip install 'geodml[plot]'``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

PLOTS = ("accuracy_vs_wan_bytes.png", "accuracy_vs_emulated_time.png", "bytes_by_link.png", "label_distribution.png")


class ReportError(ValueError):
    """A run directory cannot be read; the message names it and what is missing."""


@dataclass
class Run:
    """What the plots need from one run directory."""

    path: Path
    name: str
    algo: str
    label: str
    evals: list[dict] = field(default_factory=list)
    """Evaluation records (``val_accuracy`` with ``wan_bytes_total`` and ``emulated_s``), in step order."""
    summary: dict | None = None
    config: dict | None = None
    partitions: dict | None = None

    @property
    def regions(self) -> list[str]:
        """Regions that hold ranks, in rank order (first appearance)."""
        placed = (self.config or {}).get("region_of_rank") or []
        return list(dict.fromkeys(placed))

    @property
    def bytes_by_link(self) -> dict[str, int]:
        s = self.summary or {}
        return s.get("bytes_by_link") or s.get("wan_bytes_by_link") or {}


def _read_json(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc})") from None


def load_run(path: str | Path) -> Run:
    """Read a run directory. Raises :class:`ReportError` if it holds neither metrics.jsonl nor summary.json."""
    p = Path(path)
    if not p.is_dir():
        raise ReportError(f"{p}: not a directory")
    summary = _read_json(p / "summary.json")
    config = _read_json(p / "config.json")
    metrics = p / "metrics.jsonl"
    if summary is None and not metrics.exists():
        raise ReportError(f"{p}: not a geodml run directory (no summary.json and no metrics.jsonl)")
    evals = []
    if metrics.exists():
        lines = metrics.read_text().splitlines()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                if n == len(lines):
                    continue  # a run still writing its last line
                raise ReportError(f"{metrics}:{n}: not a JSON line") from None
            if isinstance(rec.get("val_accuracy"), (int, float)) and "wan_bytes_total" in rec:
                evals.append(rec)
    algo = (summary or {}).get("algo") or ((config or {}).get("config", {}).get("algo", {}).get("algo")) or "?"
    label = f"{algo}"
    theta_name = (summary or {}).get("theta_name")
    if theta_name and (summary or {}).get("theta_final") is not None:
        label += f" {theta_name}={summary['theta_final']:g}"
    label += f" ({p.resolve().name})"
    return Run(path=p, name=p.resolve().name, algo=algo, label=label, evals=evals, summary=summary, config=config,
               partitions=_read_json(p / "partitions.json"))


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000.0
    return f"{n:.3g} TB"


def _curve(run: Run, xkey: str) -> tuple[list[float], list[float]]:
    pts = [(float(r[xkey]), float(r["val_accuracy"])) for r in run.evals if isinstance(r.get(xkey), (int, float))]
    return [x for x, _ in pts], [y for _, y in pts]


def _final_note(run: Run) -> str:
    s = run.summary or {}
    if "final_val_accuracy" not in s:
        return " (running)"
    return f": acc {s['final_val_accuracy']:.3f}, WAN {human_bytes(s.get('wan_bytes_total', 0))}"


def plot_accuracy(runs: list[Run], xkey: str, path: Path, *, xlabel: str, title: str, log_x: bool, plt) -> None:
    fig, ax = plt.subplots(figsize=(8, 5))
    any_points = False
    positive = True
    for run in runs:
        xs, ys = _curve(run, xkey)
        if not xs:
            continue
        any_points = True
        positive &= all(x > 0 for x in xs)
        line, = ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.6, label=run.label + _final_note(run))
        ax.plot(xs[-1:], ys[-1:], marker="*", markersize=12, color=line.get_color())
    if log_x and any_points:
        ax.set_xscale("log" if positive else "symlog")
    if xkey == "wan_bytes_total":
        from matplotlib.ticker import FuncFormatter
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(v) if v > 0 else "0"))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation accuracy (global model)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if any_points:
        ax.legend(fontsize=8, loc="lower right")
    else:
        ax.text(0.5, 0.5, "no evaluation lines in metrics.jsonl", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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


def plot_links(runs: list[Run], path: Path, *, plt) -> None:
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
    from matplotlib.ticker import FuncFormatter

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
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="bytes sent",
                     format=FuncFormatter(lambda v, _: human_bytes(v)))
    fig.suptitle("Bytes per link (row: source region, column: destination)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_labels(runs: list[Run], path: Path, *, plt) -> None:
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


def write_report(run_dirs: list[str | Path], out: str | Path) -> list[Path]:
    """Read the runs and write the PNGs into ``out``; returns their paths."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ReportError("the report needs matplotlib: pip install 'geodml[plot]' (or pip install matplotlib)") from None
    runs = [load_run(d) for d in run_dirs]
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geodml.report", description="Write PNG plots of geodml run directories: "
                                "accuracy vs WAN bytes and vs emulated time (all runs on one axis), bytes per link "
                                "as a region x region heat map, label distribution per partition.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (--out of geodml runs)")
    p.add_argument("--out", help="directory for the PNGs (default: the run directory for one run, "
                   "./geodml-report for several)")
    args = p.parse_args(argv)
    out = args.out or (args.runs[0] if len(args.runs) == 1 else "geodml-report")
    try:
        paths = write_report(args.runs, out)
    except ReportError as exc:
        print(f"geodml.report: error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
