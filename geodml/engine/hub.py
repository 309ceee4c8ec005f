"""The hub: a process's hosted partitions as cooperative tasks on one thread (greenlets).

Each hosted partition runs the one training loop (geodml.trainer.Trainer) as its own task, written
as if it were alone in its process: its Comm calls block until their peers have done their part.
Only one task runs at a time. When a task must wait (a collective whose other hosted ranks have not
arrived, a message not yet delivered) its Comm calls :meth:`Hub.wait`, which switches back to the
hub; the hub resumes the next task that can go on. A switch costs well under a microsecond, so a
process can host thousands of partitions on one thread, and, because no two of them ever run at
once, they can share one worker model and its scratch (geodml.engine.worker): before resuming a
task the hub calls the ``enter`` hook the task was spawned with (the worker binds to that
partition's own state).

Waits and wake-ups. A task waits on a *key* (a collective of its group, a mailbox) with a predicate
and a deadline; :meth:`notify` of the key (from this thread, or from another one: the ZeroMQ
dispatcher and the ``--wan real`` pacer deliver from their own threads) makes its waiters ready,
and each re-checks its predicate when resumed. When no task is ready the hub sleeps on a condition
until a notification or the nearest deadline. A task whose deadline passes is resumed so that its
wait returns False (the Comm raises its timeout error). When every task waits, nothing is due from
another thread (``external`` false) and no deadline is set, the tasks can never be woken: the hub
raises :class:`Deadlock` naming what each waits for, instead of sitting out the timeout.

A task that raises ends; the hub calls ``on_error`` once with the first exception (the engine
aborts the Comm group, so that every other wait fails at once), runs every task to its end, and
:meth:`run` returns the tasks' outcomes. One hosted partition (one partition per process) is one
task that never switches.

Results do not depend on the order in which tasks run: collectives combine in rank order and
messages are matched by (source, kind, step), as with one partition per process.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import greenlet


class Deadlock(RuntimeError):
    """Every hosted task waits and nothing can wake any of them."""


@dataclass(eq=False)
class Task:
    """One hosted partition's task (build with :meth:`Hub.spawn`)."""

    name: str
    fn: Callable[[], Any]
    enter: Callable[[], None] | None
    glet: greenlet.greenlet | None = None
    result: Any = None
    error: BaseException | None = None
    done: bool = False
    waiting_on: Hashable | None = None
    deadline: float | None = None
    seq: int = 0
    """Bumped at every wait, so a stale timer entry of an earlier wait is ignored."""
    ready_since: int = field(default=-1)
    """The ready queue's epoch at which it was queued (-1: not queued): a task is queued once."""


class Hub:
    """Cooperative tasks on the calling thread (module docstring). Spawn tasks, then :meth:`run`."""

    def __init__(self, *, external: Callable[[], bool] = lambda: False,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self._tasks: list[Task] = []
        self._ready: deque[Task] = deque()
        self._waiters: dict[Hashable, list[Task]] = {}
        self._timers: list[tuple[float, int, int, Task]] = []
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._notified: list[Hashable] = []   # keys notified since the hub last looked (under _lock)
        self._all_notified = False
        self._external = external
        self._on_error = on_error
        self._failed = False
        self._hub: greenlet.greenlet | None = None
        self._thread: int | None = None
        self.current: Task | None = None
        self._epoch = 0
        self._counter = 0

    # ---- building -------------------------------------------------------------------------
    def spawn(self, fn: Callable[[], Any], *, name: str, enter: Callable[[], None] | None = None) -> Task:
        """A task that runs ``fn()`` (``enter()`` before it starts and before every resume)."""
        task = Task(name=name, fn=fn, enter=enter)
        self._tasks.append(task)
        return task

    @property
    def tasks(self) -> list[Task]:
        return list(self._tasks)

    # ---- inside a task ----------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Whether the caller is one of this hub's tasks (so :meth:`wait` may switch)."""
        return (self._hub is not None and threading.get_ident() == self._thread
                and greenlet.getcurrent() is not self._hub)

    def wait(self, key: Hashable, ready: Callable[[], bool], deadline: float | None) -> bool:
        """Block the calling task until ``ready()`` (True) or ``deadline`` (``time.monotonic()``;
        False). Other tasks run meanwhile; :meth:`notify` of ``key`` makes this one re-check."""
        task = self.current
        assert task is not None and self._hub is not None, "Hub.wait is called from a task of a running hub"
        while not ready():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            task.seq += 1
            task.waiting_on, task.deadline = key, deadline
            self._waiters.setdefault(key, []).append(task)
            if deadline is not None:
                self._counter += 1
                heapq.heappush(self._timers, (deadline, self._counter, task.seq, task))
            self._hub.switch()
            task.waiting_on = None
        return True

    def sleep(self, seconds: float) -> None:
        """The calling task waits ``seconds`` of wall time while the other tasks run."""
        self.wait(("sleep", id(self.current)), lambda: False, time.monotonic() + seconds)

    # ---- from anywhere ------------------------------------------------------------------------
    def notify(self, key: Hashable) -> None:
        """Wake the tasks waiting on ``key`` (safe from any thread)."""
        with self._lock:
            self._notified.append(key)
            self._wake.notify()

    def notify_all(self) -> None:
        """Wake every waiting task (a failure every wait must see; safe from any thread)."""
        with self._lock:
            self._all_notified = True
            self._wake.notify()

    # ---- the loop -------------------------------------------------------------------------------
    def run(self) -> list[Task]:
        """Run every task to its end on this thread; returns them (``result`` / ``error`` each)."""
        self._hub = greenlet.getcurrent()
        self._thread = threading.get_ident()
        for task in self._tasks:
            task.glet = greenlet.greenlet(self._body(task), parent=self._hub)
            self._make_ready(task)
        try:
            while not all(t.done for t in self._tasks):
                self._take_notifications()
                if not self._ready:
                    self._sleep()
                    continue
                task = self._ready.popleft()
                task.ready_since = -1
                if task.done:
                    continue
                if task.enter is not None:
                    task.enter()
                self.current = task
                task.glet.switch()
                self.current = None
        except BaseException:
            self._stop_all()
            raise
        finally:
            self._hub = None
        return self._tasks

    def _body(self, task: Task) -> Callable[[], None]:
        def body() -> None:
            try:
                task.result = task.fn()
            except BaseException as exc:  # noqa: BLE001 -- handed to the engine through the task
                task.error = exc
                if not self._failed:
                    self._failed = True
                    if self._on_error is not None:
                        self._on_error(exc)
                    self.notify_all()
            finally:
                task.done = True
        return body

    def _make_ready(self, task: Task) -> None:
        if task.ready_since < 0 and not task.done:
            task.ready_since = self._epoch
            self._ready.append(task)

    def _take_notifications(self) -> None:
        with self._lock:
            keys, self._notified = self._notified, []
            everyone, self._all_notified = self._all_notified, False
        if everyone:
            keys = list(self._waiters)
        for key in keys:
            for task in self._waiters.pop(key, ()):
                if task.waiting_on == key:
                    self._make_ready(task)
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, seq, task = heapq.heappop(self._timers)
            if task.seq == seq and task.waiting_on is not None:
                self._make_ready(task)

    def _sleep(self) -> None:
        """Nothing is ready: wait for a notification (another thread's) or the nearest deadline."""
        while self._timers and (self._timers[0][3].seq != self._timers[0][2] or self._timers[0][3].waiting_on is None):
            heapq.heappop(self._timers)   # entries of waits that already ended
        until = self._timers[0][0] if self._timers else None
        with self._lock:
            if self._notified or self._all_notified:
                return
            if until is None and not self._external():
                waits = "; ".join(f"{t.name} waits for {t.waiting_on}" for t in self._tasks if not t.done)
                raise Deadlock(f"every hosted partition waits and nothing can wake them: {waits}")
            timeout = None if until is None else max(0.0, until - time.monotonic())
            self._wake.wait(timeout if timeout is None else min(timeout, 3600.0))

    def _stop_all(self) -> None:
        """After the hub itself failed (an interrupt): end every task that has not ended."""
        for task in self._tasks:
            if task.glet is not None and not task.done and not task.glet.dead:
                try:
                    task.glet.throw(greenlet.GreenletExit)
                except BaseException:  # noqa: BLE001, S110 -- the hub's own error is what propagates
                    pass
