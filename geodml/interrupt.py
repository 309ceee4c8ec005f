"""Signals end a run at a step every rank agrees on (docs/reliability.md "Signals").

SIGINT (Ctrl-C), SIGTERM (what SLURM, Kubernetes and torchrun send before a kill) and SIGUSR1 (SLURM's
``--signal``) do not stop a process where it happens to be. :func:`on_signals` records the first one;
the training loop (geodml.trainer) reads :func:`requested` at its next log line, whose collective
already joins every partition, so every rank learns of a signal that any rank received at the same
step. There it writes a checkpoint when the run has checkpoints (``--checkpoint-every``), and
:class:`Interrupted` ends the run on every rank; the CLI prints one line (the step, the checkpoint
or that there is none, the command that resumes the run) and exits 128 + the signal's number (130
for SIGINT, 143 for SIGTERM). A second signal ends the process at once, as the signal's default
action would (a copy of the first within ECHO_S is the same signal delivered twice). A run stops
at most ``--log-every`` steps after the signal (default 10).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
"""The signals that end a run at an agreed step."""

_received: list[int] = []
_first_at: list[float] = []

ECHO_S = 1.0
"""A copy of the first signal within this many seconds is the same one delivered twice, not a second: a
Ctrl-C at a terminal reaches every process of the foreground group, and a wrapper in that group (a shell
script, srun) may pass it on again. (torchrun's ranks are in groups of their own: they get it once.)"""


class Interrupted(Exception):
    """A signal ended the run at ``step`` (of ``total_steps``), on every rank alike."""

    def __init__(self, signum: int, step: int, total_steps: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name} at step {step} of {total_steps}")
        self.signum, self.step, self.total_steps = signum, step, total_steps
        self.out: Path | None = None
        """The run directory (set by the engine)."""

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def requested() -> int:
    """The number of the first signal this process received while :func:`on_signals` was active; 0: none."""
    return _received[0] if _received else 0


def _handler(signum: int, frame: Any) -> None:
    if _received and signum == _received[0] and time.monotonic() - _first_at[0] < ECHO_S:
        return   # the first signal again, passed on by torchrun (ECHO_S)
    if _received:   # the second signal: its default action, now
        for s in SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _received.append(signum)
    _first_at.append(time.monotonic())
    if os.environ.get("RANK", "0") == "0":
        print(f"geodml: {signal.Signals(signum).name} received: the run stops at its next log line (a checkpoint "
              "there if --checkpoint-every is set); a second signal stops it at once", file=sys.stderr, flush=True)


@contextmanager
def on_signals() -> Iterator[None]:
    """Record SIGINT, SIGTERM and SIGUSR1 for the body instead of acting on them (module docstring); the
    previous handlers come back after it. Outside the main thread (where Python runs handlers) a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    _first_at.clear()
    previous = {s: signal.signal(s, _handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)

