"""Metric sinks. A sink receives flat dict records; it never raises into the training loop.

* ``NullSink``: do nothing (the default on ranks other than 0).
* ``JsonlSink``: one JSON object per line (metrics.jsonl, the run-directory contract).
* ``ConsoleProgress``: rank 0's live progress -- one updating line on a terminal, plain
  lines at most every ``min_interval_s`` otherwise (never floods a log file).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import IO


class Sink:
    """Interface: ``log(record)`` for every metrics record, ``close()`` once at the end."""

    def log(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


NullSink = Sink


class MultiSink(Sink):
    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def log(self, record: dict) -> None:
        for s in self.sinks:
            s.log(record)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf; null says "not a number" honestly
    return v


class JsonlSink(Sink):
    """Append records to a .jsonl file, flushed per line so a crash loses at most one line."""

    def __init__(self, path: Path) -> None:
        self.f: IO[str] | None = open(path, "a", encoding="utf-8")

    def log(self, record: dict) -> None:
        if self.f is not None:
            self.f.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")
            self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000.0
    return f"{n:.2f} TB"


def human_s(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:d}:{sec:02d}"


class ConsoleProgress(Sink):
    """Live progress: step/epoch, loss, accuracy, bytes, emulated time, ETA."""

    def __init__(self, total_steps: int, stream: IO[str] | None = None, min_interval_s: float = 5.0) -> None:
        self.total_steps = total_steps
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.min_interval_s = 0.2 if self.tty else min_interval_s
        self.t0 = time.monotonic()
        self.last_print = -1e9
        self.val_acc: float | None = None
        self.pending_newline = False

    def log(self, r: dict) -> None:
        if "val_accuracy" in r:
            self.val_acc = r["val_accuracy"]
        if "step" not in r or "train_loss" not in r:
            return
        now = time.monotonic()
        is_eval = "val_accuracy" in r
        if not is_eval and now - self.last_print < self.min_interval_s:
            return
        self.last_print = now
        step = r["step"]
        rate = step / max(now - self.t0, 1e-9)
        eta = (self.total_steps - step) / rate if rate > 0 else float("inf")
        acc = f"{self.val_acc:.4f}" if self.val_acc is not None else "-"
        line = (f"step {step}/{self.total_steps} ep {r.get('epoch', 0):.2f} loss {r['train_loss']:.4f} "
                f"val_acc {acc} wan {human_bytes(r.get('wan_bytes_total', 0))} "
                f"emu {human_s(r.get('emulated_s', 0.0))} eta {human_s(eta)}")
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            self.pending_newline = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.pending_newline:
            self.stream.write("\n")
            self.stream.flush()
