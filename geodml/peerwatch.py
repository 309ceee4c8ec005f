"""Peer failure: heartbeats through the torch.distributed store (issue 10 item 2; docs/reliability.md).

A rank that dies without restarts (SIGKILL, ``os._exit``, a lost node) leaves the others
blocked in a gloo collective or a ZeroMQ receive. ``PeerWatch`` bounds that: every rank runs
one daemon thread that, every ``interval_s = min(1, timeout_s / 4)`` seconds, increments its
own counter ``geodml/peerwatch/<restart>/hb/<rank>`` in the store and reads everyone else's
(``store.add(key, 0)`` never blocks). A peer whose counter has not moved for ``timeout_s``
(``--peer-timeout-s``), and that has not said it finished, is *lost*: the watching rank prints
``geodml: error: rank K lost: ...`` and leaves with :data:`PEER_LOST_EXIT` through
``os._exit`` -- the main thread may be stuck inside a C++ collective that no Python exception
can interrupt. Before leaving it marks the peer ``lost`` in the store, so the other survivors
stop at their next check naming the same rank. A peer that fails with an exception marks itself
``failed`` and the others exit at their next check, naming it. If the store itself stops answering (it lives in rank 0's
process when there is no torchrun agent), the silence counts from the last good read and
the verdict names rank 0 (or the store's address under a torchrun agent store).

So every surviving rank exits non-zero within ``timeout_s + interval_s`` (plus one store
round trip) of the death; with torchrun the agent usually stops them even sooner. The key
carries ``TORCHELASTIC_RESTART_COUNT`` because a torchrun agent's store outlives restarts.

``fault_hook_from_env`` is the test hook: ``GEODML_FAULT="rank=1,step=7,how=kill"`` makes rank
1 kill itself (SIGKILL; ``how=exit``: ``os._exit(17)``) after step 7 of the first attempt
(``restart=N`` for another one); ``at=startup`` / ``at=finished`` instead of ``step=S`` picks a
point of the run (:func:`fault_point`), ``local_rank=L`` instead of ``rank=R`` picks a local rank
of the node whose environment carries the spec (multi-node tests).
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from geodml.runtime import declare_startup_verdict, startup_verdict
from geodml.siblings import ended, local_siblings

if TYPE_CHECKING:
    from geodml.trainer import Trainer

PEER_LOST_EXIT = 3
"""Exit status of a rank that stops because a peer was lost."""
FAULT_EXIT = 17

# Words of the errors a collective or receive raises when its peer is gone (gloo, ZeroMQ, store).
_COMM_WORDS = ("connection", "closed", "reset", "broken pipe", "peer", "gloo", "timed out", "timeout", "socket",
               "store", "did not", "no message")


def looks_like_peer_loss(exc: BaseException) -> bool:
    """True for errors that a dead peer causes (so the rank waits for the watch to name it)."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    name = type(exc).__name__
    if name in ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError", "CommError", "CommTimeoutError"):
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc).lower() for w in _COMM_WORDS)


def _connect_store(timeout_s: float):
    """A store client of its own for the watch thread (MASTER_ADDR/MASTER_PORT, as env:// init uses)."""
    import torch.distributed as dist

    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=max(timeout_s, 1.0)),
                         wait_for_workers=False), f"{host}:{port}"


class PeerWatch:
    """Heartbeat thread of one rank (see the module docstring). ``start()``, then ``stop(done=True)``
    after a successful run (peers then ignore this rank's silence) or ``mark_failed()`` first."""

    def __init__(self, *, rank: int, world_size: int, timeout_s: float, store: Any = None,
                 store_name: str = "the torch.distributed store", store_on_rank0: bool = True,
                 on_lost: Callable[[str], None] | None = None,
                 on_input_error: Callable[[str], None] | None = None) -> None:
        self.rank, self.world_size = rank, world_size
        self.timeout_s = float(timeout_s)
        self.interval_s = min(1.0, self.timeout_s / 4)
        if store is None:
            store, store_name = _connect_store(self.interval_s * 2)
            store_on_rank0 = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true"
        self.store, self.store_name, self.store_on_rank0 = store, store_name, store_on_rank0
        self.ns = f"geodml/peerwatch/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self.on_lost = on_lost or _exit_lost
        self.on_input_error = on_input_error or (lambda msg: _exit_input_error(msg, rank))
        self.verdict: str | None = None
        self._stop = threading.Event()
        self._decided = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"geodml-peerwatch-{rank}", daemon=True)

    def start(self) -> "PeerWatch":
        self.store.add(f"{self.ns}/hb/{self.rank}", 1)
        self._thread.start()
        return self

    def _key(self, what: str, r: int) -> str:
        return f"{self.ns}/{what}/{r}"

    def _loop(self) -> None:
        peers = [r for r in range(self.world_size) if r != self.rank]
        t0 = time.monotonic()
        last = {r: -1 for r in peers}
        changed = self._changed = {r: t0 for r in peers}  # shared with last_view(): read-only there
        last_good = self._last_good = t0
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            try:
                self.store.add(self._key("hb", self.rank), 1)
                verdict = lost = None
                for r in peers:
                    if self.store.add(self._key("failed", r), 0):
                        if self.store.add(self._key("input", r), 0):  # a bad input: exit 2 like rank r
                            message = self.store.get(self._key("input_message", r)).decode("utf-8", "replace")
                            with self._lock:  # held while exiting: the main thread cannot print it a second time
                                if not self._stop.is_set():
                                    self.on_input_error(message)
                            return
                        verdict, lost = f"rank {r} lost: it failed and stopped", r
                        break
                    if self.store.add(self._key("lost", r), 0):   # another rank already declared it
                        if self.store.check([self._key("why", r)]):  # its words (geodml.peerwatch.AgentStop)
                            verdict = self.store.get(self._key("why", r)).decode("utf-8", "replace")
                        else:
                            verdict = (f"rank {r} lost: no heartbeat (declared by a peer, "
                                       f"--peer-timeout-s {self.timeout_s:g})")
                        self.store.add(self._key("seen", r), 1)
                        lost = r
                        break
                    if self.store.add(self._key("done", r), 0):
                        changed[r] = now
                        continue
                    v = self.store.add(self._key("hb", r), 0)
                    if v != last[r]:
                        last[r], changed[r] = v, now
                    elif now - changed[r] > self.timeout_s:
                        verdict, lost = (f"rank {r} lost: no heartbeat for {now - changed[r]:.1f} s "
                                         f"(--peer-timeout-s {self.timeout_s:g})"), r
                        break
                last_good = self._last_good = now
                if lost is not None:
                    self.store.add(self._key("lost", lost), 1)  # the others stop at once, naming the same rank
            except Exception as exc:  # noqa: BLE001 -- the store's own error types vary
                verdict = None
                # A peer already silent when the store went away (e.g. rank 0, hosting the store, exited
                # because it saw that peer die) is the root cause: name it once its silence passes the timeout.
                silent = [r for r in peers if last_good - changed[r] > 2 * self.interval_s]
                worst = min(silent, key=lambda r: changed[r]) if silent else None
                if worst is not None and now - changed[worst] > self.timeout_s:
                    verdict = (f"rank {worst} lost: no heartbeat for {now - changed[worst]:.1f} s "
                               f"(--peer-timeout-s {self.timeout_s:g}; the store then stopped answering)")
                elif now - last_good > self.timeout_s:
                    who = "rank 0" if self.store_on_rank0 else f"the torch.distributed store at {self.store_name}"
                    verdict = (f"{who} lost: the store stopped answering for {now - last_good:.1f} s "
                               f"(--peer-timeout-s {self.timeout_s:g}; {type(exc).__name__})")
            if verdict is not None:
                if self.claim(verdict):
                    self.on_lost(f"geodml: error: {verdict}; stopping rank {self.rank}")
                return

    def claim(self, verdict: str) -> bool:
        """Take ``verdict`` as this rank's reason to stop; False when the watch was stopped or another
        thread (this watch's, or :class:`AgentStop`'s) decided first: that one speaks and exits."""
        with self._lock:
            if self._stop.is_set() or self._decided.is_set():
                return False
            self.verdict = verdict
            self._decided.set()
            return True

    def declare(self, lost: int, verdict: str, *, others: int, wait_s: float | None = None) -> None:
        """Mark rank ``lost`` lost with ``verdict`` as its words, for the peers' watches to repeat; wait
        (at most ``wait_s``, default two heartbeat intervals and a second) until ``others`` of them have
        read it: a rank that hosts the store must not take it away before the other node has heard."""
        try:
            self.store.set(self._key("why", lost), verdict.encode("utf-8"))
            self.store.add(self._key("lost", lost), 1)
            deadline = time.monotonic() + (2 * self.interval_s + 1.0 if wait_s is None else wait_s)
            while self.store.add(self._key("seen", lost), 0) < others and time.monotonic() < deadline:
                time.sleep(0.05)
        except Exception:  # noqa: BLE001 -- the store's own error types vary; best effort while stopping
            pass

    def last_view(self, now: float | None = None) -> str | None:
        """What this watch last saw go wrong, or None: the peers silent for more than two heartbeat
        intervals (oldest first) and whether the store stopped answering. For a rank being stopped
        from outside (its torchrun agent's SIGTERM) to say why before it goes."""
        now = time.monotonic() if now is None else now
        changed = dict(getattr(self, "_changed", {}))
        last_good = getattr(self, "_last_good", now)
        quiet = 2 * self.interval_s
        silent = sorted((r for r in changed if last_good - changed[r] > quiet), key=lambda r: changed[r])
        parts = [f"rank {r} silent for {now - changed[r]:.1f} s" for r in silent[:4]]
        if now - last_good > quiet:
            who = "rank 0's" if self.store_on_rank0 else f"the torchrun agent's at {self.store_name}"
            parts.append(f"the store ({who}) not answering for {now - last_good:.1f} s")
        return "; ".join(parts) or None

    def diagnose(self) -> str | None:
        """What is wrong right now, for a rank being stopped from outside: :meth:`last_view`, else a
        peer marked failed or lost in the store, else whether the store answers at all (one
        immediate probe). None when everything looks fine (an ordinary shutdown)."""
        seen = self.last_view()
        if seen:
            return seen
        try:
            for r in range(self.world_size):
                if r == self.rank:
                    continue
                if self.store.add(self._key("input", r), 0):
                    return None  # a bad input: rank 0 says it once, nothing to add
                if self.store.add(self._key("lost", r), 0) and self.store.check([self._key("why", r)]):
                    return self.store.get(self._key("why", r)).decode("utf-8", "replace")
                if self.store.add(self._key("failed", r), 0) or self.store.add(self._key("lost", r), 0):
                    return f"rank {r} failed or was lost"
        except Exception as exc:  # noqa: BLE001 -- the store's own error types vary
            who = "rank 0's" if self.store_on_rank0 else f"the torchrun agent's at {self.store_name}"
            return (f"the store ({who}) is not answering ({type(exc).__name__}): the node that hosts it lost a rank "
                    "or its agent stopped")
        return None

    def peer_input_error(self) -> bool:
        """Whether a peer reported a bad input (:meth:`mark_failed`); False when the store does not answer."""
        try:
            return any(self.store.add(self._key("input", r), 0) for r in range(self.world_size) if r != self.rank)
        except Exception:  # noqa: BLE001 -- the store's own error types vary
            return False

    def await_verdict(self, timeout_s: float | None = None) -> str | None:
        """Wait (at most ``timeout_s``, default the peer timeout plus two intervals) for the thread to
        name a lost peer; the default ``on_lost`` exits the process, so this returns only without one."""
        self._decided.wait(self.timeout_s + 2 * self.interval_s if timeout_s is None else timeout_s)
        return self.verdict

    def mark_failed(self, *, input_error: str | None = None) -> None:
        """Tell the peers this rank fails on its own (they stop at their next check, naming it).
        With ``input_error`` (a bad input found after the process group exists) they exit 2
        instead, and rank 0 prints the message once."""
        try:
            if input_error is not None:
                self.store.set(self._key("input_message", self.rank), input_error.encode("utf-8"))
                self.store.add(self._key("input", self.rank), 1)
            self.store.add(self._key("failed", self.rank), 1)
        except Exception:  # noqa: BLE001 -- best effort while failing anyway
            pass

    def stop(self, *, done: bool) -> None:
        with self._lock:
            self._stop.set()
        if done:
            try:
                self.store.add(self._key("done", self.rank), 1)
            except Exception:  # noqa: BLE001
                pass
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(self.interval_s + 5)


def _flush_stdout() -> None:
    """What this rank printed so far (its header, progress) before os._exit, which skips Python's flush."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


_said = threading.Lock()


def say_once(message: str) -> bool:
    """Print this process's one error line about a lost peer (stderr); False, printing nothing, when a
    line was already printed: the watch, :class:`AgentStop` and the start-up join may all see the loss."""
    if not _said.acquire(blocking=False):
        return False
    _flush_stdout()
    try:
        sys.stderr.write(message + "\n")   # one write: ranks that share a terminal do not split each other's lines
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return True


def _exit_lost(message: str) -> None:
    say_once(message)
    os._exit(PEER_LOST_EXIT)


DECIDE_S = 5.0
"""The longest the main thread's SIGTERM handler waits for :class:`AgentStop`'s thread to say why."""
CHECKS_WAIT_S = 20.0
"""The longest :class:`AgentStop`'s thread waits for this rank's input checks before it looks for a cause."""
CHECKING, BAD_INPUT = "while checking the input", "bad input"


class AgentStop:
    """Why this worker's torchrun agent stopped it, said by a thread of its own (docs/reliability.md "Two
    nodes").

    With ``--max-restarts 0`` an agent stops its node's other workers with SIGTERM as soon as one of
    them dies, and the other node's agent stops its workers when the store (hosted by one agent) goes
    away. A Python signal handler runs only when the main thread returns to the interpreter, which a rank
    blocked in a collective with the dead peer may not do before the agent's SIGKILL; so the signal is
    also written to a wakeup fd (``signal.set_wakeup_fd``) and this object's thread reads it the moment it
    arrives. It looks for the cause, in order:

    1. a sibling (another worker of this agent, geodml.siblings) whose process ended before the signal:
       that rank is the lost one. The store is told (``PeerWatch.declare``, or the start-up join's
       verdict), so the other node's ranks repeat the same words, and this rank waits a moment for them
       to read it before it leaves;
    2. during the run, what the peer watch saw (``PeerWatch.diagnose``: a silent peer, a peer marked
       lost or failed, a store that stopped answering);
    3. at start-up, whether the store answers at all (where it does not, the node that hosts it is named:
       which of its ranks died cannot be known from here), and a start-up verdict already in it.

    With a cause it prints one line (:func:`say_once`) and exits :data:`PEER_LOST_EXIT`; without one the
    SIGTERM is an ordinary one (a user, SLURM, torchrun passing on a Ctrl-C) and goes to the handler that
    was there before (geodml.interrupt's: the run stops at an agreed step). A bad input is no loss: rank 0
    reports it and exits 2, after which its agent stops the others; so while this rank is still checking
    the input, the thread waits for its verdict (the main thread's handler returns at once and the thread
    sends the signal again when it is an ordinary one), and after a bad input it names nothing.
    """

    _current: ClassVar["AgentStop | None"] = None

    def __init__(self, *, rank: int, world_size: int, local_world_size: int, siblings: list[Any],
                 store_name: str) -> None:
        self.rank, self.world_size, self.local_world_size = rank, world_size, local_world_size
        self.siblings = siblings
        self.store_name = store_name
        self.phase = CHECKING
        self.watch: PeerWatch | None = None
        self._verdict: str | None = None
        self._decided = threading.Event()
        self._checked = threading.Event()
        self._lock = threading.Lock()
        self._first, self._deferred = True, False
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._previous_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._thread = threading.Thread(target=self._loop, name=f"geodml-agentstop-{rank}", daemon=True)
        self._thread.start()

    @classmethod
    def install(cls, rank: int, world_size: int, local_world_size: int) -> "AgentStop | None":
        """Under a torchrun agent with peers, from the main thread: start watching (:meth:`current` finds
        it); None otherwise."""
        if "TORCHELASTIC_RUN_ID" not in os.environ or world_size < 2 or cls._current is not None or \
                threading.current_thread() is not threading.main_thread():
            return None
        host, port = os.environ.get("MASTER_ADDR", "?"), os.environ.get("MASTER_PORT", "?")
        cls._current = cls(rank=rank, world_size=world_size, local_world_size=local_world_size,
                           siblings=local_siblings(), store_name=f"{host}:{port}")
        return cls._current

    @classmethod
    def current(cls) -> "AgentStop | None":
        """The one this process installed (signal handlers are the process's), if any."""
        return cls._current

    def enter(self, phase: str, watch: "PeerWatch | None" = None) -> None:
        """The run is now in ``phase`` ("at start-up", "during the run", ..., or :data:`BAD_INPUT`),
        watched by ``watch`` from here on."""
        self.phase = phase
        if watch is not None:
            self.watch = watch
        if phase != CHECKING:
            self._checked.set()

    def close(self) -> None:
        """Give back the signal handler and the wakeup fd, and end the thread."""
        signal.signal(signal.SIGTERM, self._previous)
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._w)
        self._thread.join(5.0)
        os.close(self._r)
        AgentStop._current = None

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        with self._lock:
            first, self._first = self._first, False
            if first and not self._decided.is_set() and self.phase == CHECKING:
                self._deferred = True   # let the checks finish; the thread sends it again if it is ordinary
                return
        if first:  # the thread has the first SIGTERM too: wait for its word
            self._decided.wait(DECIDE_S)
            if self._verdict is not None:   # it prints and ends the process
                time.sleep(DECIDE_S * 6)
        if callable(self._previous):
            self._previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _loop(self) -> None:
        while True:
            try:
                got = os.read(self._r, 64)
            except OSError:
                return
            if not got:
                return
            if signal.SIGTERM not in got or self._decided.is_set():
                continue
            verdict = None
            try:
                self._checked.wait(CHECKS_WAIT_S)
                if self.phase != BAD_INPUT:
                    verdict = self._stop_with_cause()
            finally:
                with self._lock:
                    self._verdict = verdict
                    self._decided.set()
                    again = self._deferred and verdict is None
            if again:
                os.kill(os.getpid(), signal.SIGTERM)

    def _stop_with_cause(self) -> str | None:
        """Say why (class docstring), tell the peers, and exit; None when there is no cause to name."""
        agent = f"its torchrun agent stopped rank {self.rank} (SIGTERM)"
        if self.watch is not None and self.watch.peer_input_error():
            return None   # a bad input found after the process group existed: rank 0 reports it, all exit 2
        gone = ended(self.siblings)
        if gone:
            s = gone[0]
            said = (f"rank {s.rank} lost {self.phase}: its process (local rank {s.local_rank}, pid {s.pid}) ended on "
                    f"the node of rank {self.rank}")
            others = self.world_size - self.local_world_size   # the other nodes' ranks
            if self.watch is not None:
                if not self.watch.claim(said):
                    return None    # the watch thread named a loss first: it speaks
                self.watch.declare(s.rank, f"{said} (seen by rank {self.rank})", others=others)
            else:
                declare_startup_verdict(f"{said} (seen by rank {self.rank})", others=others)
            line = f"geodml: error: {said}; {agent}"
        else:
            seen = self.watch.diagnose() if self.watch is not None else self._probe()
            if seen is None:
                return None
            if self.watch is not None and not self.watch.claim(seen):
                return None
            line = f"geodml: error: rank {self.rank} stopped by its torchrun agent (SIGTERM) {self.phase}: {seen}"
        say_once(line)
        os._exit(PEER_LOST_EXIT)

    def _probe(self) -> str | None:
        """Before the peer watch exists: does the store answer, and does it hold a start-up verdict?"""
        try:
            store, _ = _connect_store(1.0)
            verdict = startup_verdict(store)
        except Exception as exc:  # noqa: BLE001 -- the store's own error types vary
            return (f"the store (the torchrun agent's at {self.store_name}) is not answering "
                    f"({type(exc).__name__}): the node that hosts it lost a rank or its agent stopped")
        return verdict

def _exit_input_error(message: str, rank: int) -> None:
    """A peer found a bad input after the process group existed: rank 0 says it, every rank exits 2."""
    _flush_stdout()
    if rank == 0:
        print(f"geodml: error: {message}", file=sys.stderr, flush=True)
    os._exit(2)


def _fault_spec(rank: int) -> dict[str, str] | None:
    """This rank's ``GEODML_FAULT`` fields for this attempt (None when unset, or for another rank/attempt)."""
    spec = os.environ.get("GEODML_FAULT")
    if not spec:
        return None
    try:
        kv = dict(item.split("=", 1) for item in spec.split(","))
        # rank=R: the global rank; local_rank=L: that local rank of every node whose environment has the spec
        me = rank if "rank" in kv else int(os.environ.get("LOCAL_RANK", rank))
        target, restart = int(kv["rank"] if "rank" in kv else kv["local_rank"]), int(kv.get("restart", "0"))
        if ("step" in kv) == ("at" in kv) or kv.get("how", "kill") not in ("kill", "exit"):
            raise KeyError("step/at")
        if "step" in kv:
            int(kv["step"])
    except (ValueError, KeyError):
        raise ValueError(f"GEODML_FAULT={spec!r}: expected rank=R|local_rank=L,step=S|at=startup|finished"
                         "[,how=kill|exit][,restart=N]") from None
    if target != me or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) != restart:
        return None
    return kv


def _die(rank: int, where: str, how: str) -> None:
    print(f"GEODML_FAULT: rank {rank} dies {where} ({how})", file=sys.stderr, flush=True)
    if how == "exit":
        os._exit(FAULT_EXIT)
    os.kill(os.getpid(), signal.SIGKILL)


def fault_hook_from_env(rank: int) -> Callable[[Trainer], None] | None:
    """The ``GEODML_FAULT`` test hook for this rank's steps (None when unset, for another rank, or for
    a fault ``at`` a point of the run instead of a step: :func:`fault_point`)."""
    kv = _fault_spec(rank)
    if kv is None or "step" not in kv:
        return None
    at_step, how = int(kv["step"]), kv.get("how", "kill")

    def hook(trainer: Trainer) -> None:
        if trainer.state.step == at_step:
            _die(rank, f"after step {at_step}", how)

    return hook


def fault_point(point: str, rank: int, out: Any = None) -> None:
    """The ``GEODML_FAULT=rank=R,at=POINT`` test hook: ``startup`` (before this rank joins its peers)
    or ``finished`` (once ``out``'s summary.json exists: the run's outputs are complete)."""
    kv = _fault_spec(rank)
    if kv is None or kv.get("at") != point:
        return
    if point == "finished" and out is not None:
        from geodml import rundir
        deadline = time.monotonic() + 60
        while not rundir.is_finished(out) and time.monotonic() < deadline:
            time.sleep(0.05)
    _die(rank, f"at {point}", kv.get("how", "kill"))
