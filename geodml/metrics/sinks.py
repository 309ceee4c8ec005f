"""Metric sinks. A sink receives flat dict records; it never raises into the training loop, but for a
write of metrics.jsonl that fails (a full disk: geodml.errors.StorageError, one line and exit 2).

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
from collections import deque
from pathlib import Path
from typing import IO, Callable


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
        self.path = Path(path)
        self.f: IO[str] | None = open(path, "a", encoding="utf-8")

    def log(self, record: dict) -> None:
        if self.f is not None:
            line = json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n"
            try:
                self.f.write(line)
                self.f.flush()
            except OSError as exc:   # a full disk: one clear line for the run, the lines before kept
                from geodml.errors import storage_error
                self.f = None
                raise storage_error(self.path, "metrics", exc) from None

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


def human_duration(s: float) -> str:
    """``s`` seconds with its units spelled: ``12s``, ``4m05s``, ``1h02m03s`` (``?`` when not finite or negative)."""
    if not math.isfinite(s) or s < 0:
        return "?"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


class ConsoleProgress(Sink):
    """Live progress on rank 0, one line per update (docs/monitoring.md "The progress line")::

        step 120/2910 (epoch 0.20) | loss 1.2345 | val acc 0.8123 (step 100) | WAN 12.34 MB | emulated 639.6 s
        | 41.2 steps/s | eta 1m08s

    The rate is a moving one: steps over wall time across the records of the last ``window_s`` seconds
    (at least the two latest), counted from the first step this process logs, so that the ETA is right
    after a resume and is not thrown off by start-up; ``eta ?`` until two records exist. ``clock`` is
    time.monotonic (a test passes its own)."""

    def __init__(self, total_steps: int, stream: IO[str] | None = None, min_interval_s: float = 5.0,
                 window_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.total_steps = total_steps
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.min_interval_s = 0.2 if self.tty else min_interval_s
        self.window_s = window_s
        self.clock = clock
        self.last_print = -math.inf
        self.val_acc: float | None = None
        self.val_step: int | None = None
        self.samples: deque[tuple[float, int]] = deque()
        self.pending_newline = False

    def rate(self) -> float | None:
        """Steps per wall second over the window (None before two records)."""
        if len(self.samples) < 2:
            return None
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None

    def log(self, r: dict) -> None:
        if "val_accuracy" in r:
            self.val_acc, self.val_step = r["val_accuracy"], r.get("step")
        if "step" not in r or "train_loss" not in r:
            return
        now, step = self.clock(), r["step"]
        self.samples.append((now, step))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window_s:
            self.samples.popleft()
        is_eval = "val_accuracy" in r
        if not is_eval and now - self.last_print < self.min_interval_s:
            return
        self.last_print = now
        self.stream.write(("\r\x1b[2K" if self.tty else "") + self.line(r) + ("" if self.tty else "\n"))
        self.pending_newline = self.tty
        self.stream.flush()

    def line(self, r: dict) -> str:
        """The progress line for record ``r`` (given to :meth:`log` last)."""
        rate = self.rate()
        left = self.total_steps - r["step"]
        eta = "?" if rate is None or rate <= 0 else human_duration(left / rate)
        acc = "-" if self.val_acc is None else f"{self.val_acc:.4f} (step {self.val_step})"
        speed = "-" if rate is None else f"{rate:.3g}"
        return (f"step {r['step']}/{self.total_steps} (epoch {r.get('epoch', 0):.2f}) | loss {r['train_loss']:.4f} | "
                f"val acc {acc} | WAN {human_bytes(r.get('wan_bytes_total', 0))} | "
                f"emulated {r.get('emulated_s', 0.0):.1f} s | {speed} steps/s | eta {eta}")

    def close(self) -> None:
        if self.tty and self.pending_newline:
            self.stream.write("\n")
            self.stream.flush()
