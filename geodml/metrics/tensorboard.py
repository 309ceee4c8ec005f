"""``--tensorboard DIR``: the run's metrics as TensorBoard event files (torch.utils.tensorboard's
SummaryWriter; the ``tensorboard`` wheel, no TensorFlow), in ``DIR/<run directory name>/`` so that
the runs of a study sit side by side in one ``tensorboard --logdir DIR``.

What is written, rank 0 (the partition that writes metrics.jsonl):

* every number of every metrics.jsonl record, under its own key, on the step axis (``train_loss``,
  ``val_accuracy``, ``wan_bytes_total``, ``emulated_s``, ``gaia_threshold``, SkewScout's ``theta`` and
  ``accuracy_loss``, ...); lists and tables (SkewScout's per-partition losses) are skipped;
* ``accuracy_vs_wan_bytes``: each validation accuracy with the run's WAN bytes so far as its step,
  so TensorBoard's chart of it is accuracy against bytes (bytes-per-accuracy);
* at the end, from summary.json: ``final/*`` (accuracies, WAN bytes, emulated and wall seconds) and
  ``wan_bytes_by_kind/<kind>`` and ``wan_bytes_by_link/<src->dst>`` -- the whole run's totals per
  traffic kind and per link, at the last step (a rank sees only its own sends during the run, so the
  per-link split exists once the ranks' ledgers are gathered at the end).

Another tracker is one small file of the same shape: a :class:`geodml.metrics.sinks.Sink` whose
``log(record)`` takes each record (MLflow: ``mlflow.log_metrics(numbers, step=record["step"])``;
W&B: ``wandb.log(numbers, step=record["step"])``), added in geodml/parts.py ``_rank0_sinks`` beside
this one, and a function of the summary called where geodml/engine writes summary.json, as
:func:`write_summary_events` is (docs/monitoring.md).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from geodml.metrics.sinks import Sink

_AXES = ("step", "epoch")
"""Record keys that are axes, not series."""


def run_log_dir(root: str, out: Path) -> Path:
    """Where ``--tensorboard ROOT`` puts the events of the run in ``out``: ROOT/<run directory name>."""
    return Path(root) / Path(out).resolve().name


def require_tensorboard() -> None:
    """ValueError naming the fix when the tensorboard package is missing (checked before a run starts)."""
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"--tensorboard needs the tensorboard package ({exc}); install it with "
                         "pip install tensorboard (or pip install -e '.[tensorboard]')") from None


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class TensorBoardSink(Sink):
    """Rank 0's records and summary as TensorBoard scalars (module docstring)."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter
        self.writer: Any = SummaryWriter(log_dir=str(log_dir), flush_secs=10)
        self.last_step = 0

    def log(self, record: dict) -> None:
        if self.writer is None:
            return
        step = int(record.get("step", self.last_step))
        self.last_step = max(self.last_step, step)
        for key, value in record.items():
            if key not in _AXES and _number(value):
                self.writer.add_scalar(key, value, global_step=step)
        acc, wan = record.get("val_accuracy"), record.get("wan_bytes_total")
        if _number(acc) and _number(wan):
            self.writer.add_scalar("accuracy_vs_wan_bytes", acc, global_step=int(wan))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def write_summary_events(log_dir: Path, summary: dict) -> None:
    """summary.json's totals as scalars at the run's last step, in their own event file beside the
    records' (TensorBoard merges the files of a directory): ``final/*``, ``wan_bytes_by_kind/<kind>``
    and ``wan_bytes_by_link/<src->dst>``."""
    from torch.utils.tensorboard import SummaryWriter
    step = int(summary.get("steps") or 0)
    with SummaryWriter(log_dir=str(log_dir), filename_suffix=".summary") as writer:
        for key in ("final_val_accuracy", "final_val_loss", "final_train_loss", "wan_bytes_total", "lan_bytes_total",
                    "emulated_seconds", "wall_seconds", "wan_savings_vs_bsp", "theta_final"):
            if _number(summary.get(key)):
                writer.add_scalar(f"final/{key}", summary[key], global_step=step)
        for group in ("wan_bytes_by_kind", "wan_bytes_by_link"):
            for name, value in (summary.get(group) or {}).items():
                if _number(value):
                    writer.add_scalar(f"{group}/{name}", value, global_step=step)
