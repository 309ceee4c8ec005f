"""Finished (or running) runs read back for reports and studies: :class:`Run`, :func:`load_run`, and the
accuracy-against-bytes plot that both draw. The lowest layer of geodml.report and geodml.study (which
import it; it imports neither)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from geodml import rundir


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
    losses: list[dict] = field(default_factory=list)
    """Training records (``step`` and ``train_loss``, one per logged step), in step order."""

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
    try:
        return rundir.read_json(path)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc})") from None


def load_run(path: str | Path) -> Run:
    """Read a run directory. Raises :class:`ReportError` if it holds neither metrics.jsonl nor summary.json."""
    p = Path(path)
    if not p.is_dir():
        raise ReportError(f"{p}: not a directory")
    summary = _read_json(p / rundir.SUMMARY)
    config = _read_json(p / rundir.CONFIG)
    metrics = p / rundir.METRICS
    if summary is None and not metrics.exists():
        raise ReportError(f"{p}: not a geodml run directory (no summary.json and no metrics.jsonl)")
    evals, losses = [], {}
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
            if isinstance(rec.get("train_loss"), (int, float)) and isinstance(rec.get("step"), int):
                losses[rec["step"]] = rec   # an evaluation line repeats its step's training line
    algo = (summary or {}).get("algo") or ((config or {}).get("config", {}).get("algo", {}).get("algo")) or "?"
    label = f"{(summary or {}).get('algo_variant') or algo}"  # fedprox, iwds+fedprox, ... (older runs: algo)
    theta_name = (summary or {}).get("theta_name")
    if theta_name and (summary or {}).get("theta_final") is not None:
        label += f" {theta_name}={summary['theta_final']:g}"
    label += f" ({p.resolve().name})"
    return Run(path=p, name=p.resolve().name, algo=algo, label=label, evals=evals, summary=summary, config=config,
               partitions=_read_json(p / rundir.PARTITIONS), losses=[losses[k] for k in sorted(losses)])


def human_bytes(n: float, digits: int = 3) -> str:
    """``n`` bytes in decimal units with ``digits`` significant digits: '22.1 MB', '123 B'."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.{digits}g} {unit}"
        n /= 1000.0
    return f"{n:.{digits}g} TB"


def _curve(run: Run, xkey: str, ykey: str = "val_accuracy") -> tuple[list[float], list[float]]:
    records = run.losses if ykey == "train_loss" else run.evals
    pts = [(float(r[xkey]), float(r[ykey])) for r in records if isinstance(r.get(xkey), (int, float))
           and isinstance(r.get(ykey), (int, float)) and math.isfinite(r[ykey])]
    return [x for x, _ in pts], [y for _, y in pts]


def _final_note(run: Run) -> str:
    s = run.summary or {}
    if "final_val_accuracy" not in s:
        return " (running)"
    return f": acc {s['final_val_accuracy']:.3f}, WAN {human_bytes(s.get('wan_bytes_total', 0))}"


def plot_accuracy(runs: list[Run], xkey: str, path: Path | IO[bytes], *, xlabel: str, title: str, log_x: bool, plt,
                  ykey: str = "val_accuracy", ylabel: str = "validation accuracy (global model)") -> None:
    """``ykey`` (validation accuracy, or ``train_loss``) of every run against ``xkey`` on one axis; the legend
    below the plot, where it hides no curve."""
    fig, ax = plt.subplots(figsize=(8, 5.2 + 0.19 * len(runs)))
    any_points = False
    positive = True
    smallest = math.inf  # the smallest positive x: below it, a symlog axis is linear (a 0 at the start stays close)
    for run in runs:
        xs, ys = _curve(run, xkey, ykey)
        if not xs:
            continue
        any_points = True
        positive &= all(x > 0 for x in xs)
        smallest = min([smallest, *(x for x in xs if x > 0)])
        line, = ax.plot(xs, ys, marker="o" if len(xs) <= 60 else "", markersize=3, linewidth=1.6,
                        label=run.label + _final_note(run))
        ax.plot(xs[-1:], ys[-1:], marker="*", markersize=12, color=line.get_color())
    if log_x and any_points:
        if positive:
            ax.set_xscale("log")
        else:
            ax.set_xscale("symlog", linthresh=smallest if math.isfinite(smallest) else 1.0)
    if xkey == "wan_bytes_total":
        from matplotlib.ticker import FuncFormatter
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(v) if v > 0 else "0"))
        if log_x and any_points and positive:  # a range of about a decade has labelled minor ticks only
            ax.xaxis.set_minor_formatter(bytes_log_formatter(minor=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if any_points:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.14), borderaxespad=0.0, frameon=False)
    else:
        what = "training" if ykey == "train_loss" else "evaluation"
        ax.text(0.5, 0.5, f"no {what} lines in metrics.jsonl", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bytes_log_formatter(*, minor: bool):
    """A log-axis tick formatter writing human bytes, on the ticks matplotlib's own log formatter
    labels (every decade; minor ticks only where a range is too narrow for a decade)."""
    from matplotlib.ticker import LogFormatterSciNotation

    class BytesLogFormatter(LogFormatterSciNotation):
        def __call__(self, x, pos=None):
            return human_bytes(x, 4 if minor else 3) if super().__call__(x, pos) else ""
    return BytesLogFormatter(labelOnlyBase=not minor)
