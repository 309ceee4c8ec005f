"""Launch geodml runs as ``torchrun`` subprocesses for studies (Quagmire §7.3 needs many runs).

A study (the Oracle baseline of §7.3, later the whole-paper study runner) is a list of
``RunSpec``s: a run id, a run directory and the geodml flags. ``run_all`` executes them,
``jobs`` at a time, and returns one ``RunResult`` per spec, in spec order:

* **Reuse.** A run directory that already holds ``summary.json`` is not run again (the study
  is resumable), nor is a run whose committed record (geodml.study.records, docs/study/records)
  has the same flags: the record fills its directory. The runner writes ``launch.json`` (the flags and process count) into every
  directory it launches; ``check_reusable`` refuses a directory whose ``launch.json`` names
  different flags, so a changed study never silently reuses a stale run. A directory without
  ``summary.json`` that the runner created (it has ``launch.json``) is an interrupted run: it
  is **resumed** from its checkpoints where ``resume_step`` finds a step, else cleared and run again.
* **Checkpoints.** Every run writes its state every ``checkpoint_every`` steps (geodml's
  ``--checkpoint-every``; default AUTO_CHECKPOINT_STEPS).
  A run cut short (the machine or the session went away) is relaunched with ``--resume`` and
  continues from the newest step every partition has, with the weights, bytes, accuracies and
  metrics (time fields aside) of an uninterrupted run (tests/test_study_resume.py); its stdout and
  stderr are appended to.
  It is resumed only by the geodml code it started with (``sources.json``, sources_digest), and
  only if its checkpoints load and fit; otherwise it starts afresh and the progress line says why.
  Like ``processes``, the checkpoint cadence is not part of a run's identity. A finished run's
  checkpoints are deleted.
* **Failures are reported, never hidden.** A non-zero exit or a timeout gives status
  ``failed`` / ``timeout`` with the exit code, the cause (the last exception or ``geodml: error:``
  line of the run's stderr: under torchrun the last lines are the launcher's own banner), and the
  last lines of the run's stderr (``stderr.txt`` in the run directory; stdout goes to ``stdout.txt``).
* **No orphans.** Every child starts in its own session; a timeout, Ctrl-C or any exception
  sends SIGTERM to the child's process group and to every descendant (torchrun starts its
  workers in sessions of their own), then SIGKILL after ``grace_s``.
* **Several study processes may share one directory.** A run is started only under an exclusive
  lock (``fcntl.flock`` on ``.RUN_ID.lock`` beside the run directory, held until the run ends and
  released by the kernel if the process dies), so a second study process with the same flags
  takes the runs nobody is running and adds workers to a study under way; a run another process
  holds is waited for (its result is read as ``reused``), or run here if it ended without a
  summary. An interrupted directory is cleared or resumed only under its lock, and not while a
  process started with its ``--out`` still runs (a run whose study process was killed lives on:
  ``processes_writing``); such a run is waited for like a busy one.
* **Injectable launcher.** ``launcher(spec, stdout, stderr) -> subprocess.Popen`` starts one
  run (default ``torchrun_launcher``); tests pass fakes. A launcher must start its child with
  ``start_new_session=True``.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import heapq
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable

import psutil

from geodml import rundir
from geodml.cores import apply_session_nice, session_nice
from geodml.study.records import RECORDS, restore

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCH_FILE = "launch.json"
SUMMARY_FILE = rundir.SUMMARY
STDOUT_FILE = "stdout.txt"
STDERR_FILE = "stderr.txt"
SOURCES_FILE = "sources.json"
RESUMED_MARK = "--- geodml.study: resumed from"
AUTO_CHECKPOINT_STEPS = 1000
"""The default ``--checkpoint-every`` of a study run (threads or process engine): an interrupted run
redoes at most this many steps. Measured cost on the iwds study's runs: see docs/study.md."""


def finite_floats(text: str) -> tuple[float, ...]:
    """argparse type of the studies' number-list flags (``--grid 0.05,0.5``): one or more finite numbers."""
    from geodml.config import parse_floats
    try:
        values = parse_floats(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 0.05,0.5, got {text!r}") from None
    if not values or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected one or more finite numbers, got {text!r}")
    return values


@dataclass(frozen=True)
class RunSpec:
    """One geodml run: ``torchrun --nproc_per_node=nproc -m geodml *argv --out out``, or, with
    ``processes`` R < nproc, ``torchrun --nproc_per_node=R -m geodml *argv --partitions nproc``
    (each process hosts a block of partitions). The processes do not change the results (P
    partitions on any R are bit-identical: tests/test_partitions.py), so they are not part of the
    run's identity: a finished run is reused whatever R it ran on."""

    run_id: str
    out: Path
    argv: tuple[str, ...]
    nproc: int
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    processes: int = field(default=0, compare=False)
    """Processes R (0: one per partition)."""
    checkpoint_every: int = field(default=0, compare=False)
    """``--checkpoint-every`` steps (0: no checkpoints); does not change the results."""
    resume_from: int | None = field(default=None, compare=False)
    """The checkpoint step an interrupted run continues from, launched with ``--resume`` (set by the runner;
    None: started afresh)."""

    @property
    def launch_argv(self) -> tuple[str, ...]:
        """argv as launched: with ``--partitions`` when the processes host several partitions each."""
        return (*self.argv, "--partitions", str(self.nproc)) if self.procs != self.nproc else self.argv

    @property
    def procs(self) -> int:
        return self.processes or self.nproc

    @property
    def command_argv(self) -> tuple[str, ...]:
        """launch_argv with the checkpoint flags: what geodml is started with."""
        extra = ("--checkpoint-every", str(self.checkpoint_every)) if self.checkpoint_every else ()
        return (*self.launch_argv, *extra, *(("--resume",) if self.resume_from is not None else ()))


@dataclass
class RunResult:
    spec: RunSpec
    status: str  # "ok" (ran now), "reused" (summary.json existed), "failed", "timeout"
    summary: dict | None = None
    returncode: int | None = None
    elapsed_s: float = 0.0
    stderr_tail: str = ""
    error: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.status in ("ok", "reused") and self.summary is not None

    def to_dict(self) -> dict:
        return {"run_id": self.spec.run_id, "dir": str(self.spec.out), "status": self.status,
                "returncode": self.returncode, "elapsed_s": round(self.elapsed_s, 3), "error": self.error,
                "stderr_tail": self.stderr_tail or None}


Launcher = Callable[[RunSpec, IO[bytes], IO[bytes]], subprocess.Popen]


def torchrun_command(spec: RunSpec) -> list[str]:
    """The command line of one run (``--standalone``: torchrun picks a free port, so runs can overlap)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={spec.procs}",
            "-m", "geodml", *spec.command_argv, "--out", str(spec.out)]


def child_env() -> dict[str, str]:
    """This checkout first on PYTHONPATH (geodml need not be installed), one thread per rank."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def torchrun_launcher(spec: RunSpec, stdout: IO[bytes], stderr: IO[bytes]) -> subprocess.Popen:
    nice = session_nice()  # a `nice` study's runs stay in the background in their own sessions (geodml.cores)
    return subprocess.Popen(torchrun_command(spec), stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                            env=child_env(), start_new_session=True, preexec_fn=lambda: apply_session_nice(nice))


# ---- run directories ----------------------------------------------------------------------

read_summary = rundir.read_summary  # the run's summary.json, or None (absent, or a run killed mid-write)


def validate_spec(spec: RunSpec) -> None:
    """A run's flags through geodml's own preflight (what torchrun would reject; flags only, no data
    decoded), and reuse safety; ``ValueError`` naming the problem. A finished run is reused, so its
    flags are not checked again. An interrupted run of ours is resumed or cleared by the runner
    (resume_step decides), so its directory and checkpoint flags are not checked as an ``--out``:
    the preflight would refuse its leftovers, and ``--checkpoint-every`` without ``--out``."""
    from geodml.cli import parse_config
    from geodml.preflight import preflight
    from geodml.runtime import Env
    check_reusable(spec)
    if read_summary(spec.out) is not None:
        return
    interrupted = (Path(spec.out) / LAUNCH_FILE).exists()
    cfg = parse_config([*spec.launch_argv, *([] if interrupted else ["--out", str(spec.out)])])
    if interrupted:
        cfg = dataclasses.replace(cfg, reliability=dataclasses.replace(cfg.reliability, checkpoint_every=0,
                                                                       resume=False))
    preflight(cfg, Env(0, spec.procs, 0, spec.procs, True), data=False)


def launch_record(spec: RunSpec) -> dict:
    return {"argv": list(spec.argv), "nproc": spec.nproc}


def check_reusable(spec: RunSpec) -> None:
    """Raise ValueError if ``spec.out`` holds a run launched with other flags than ``spec``'s."""
    path = Path(spec.out) / LAUNCH_FILE
    if not path.exists():
        return
    try:
        old = json.loads(path.read_text())
    except ValueError:
        raise ValueError(f"{path} is not valid JSON; remove {spec.out} to run {spec.run_id} again") from None
    new = launch_record(spec)
    if old != new:
        raise ValueError(f"{spec.out} holds a run with other flags (nproc {old.get('nproc')}, {' '.join(old.get('argv', []))}) "
                         f"than requested (nproc {new['nproc']}, {' '.join(new['argv'])}); choose another --out or remove it")


def lock_path(spec: RunSpec) -> Path:
    """The lock file of a run: beside its directory, which a restart may clear."""
    out = Path(spec.out)
    return out.parent / f".{out.name}.lock"


def try_lock(spec: RunSpec) -> IO[bytes] | None:
    """The run's lock, held while the returned file stays open; None when another process holds it."""
    path = lock_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "ab")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def is_running(spec: RunSpec) -> bool:
    """Whether a study process holds the run's lock now (it is running the run). Writes nothing: a lock
    file that does not exist is not held; an existing one is probed with a shared, non-blocking flock."""
    try:
        f = open(lock_path(spec), "rb")
    except OSError:
        return False
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False


def auto_checkpoint_every(spec: RunSpec) -> int:
    """The default checkpoint cadence of ``spec``: AUTO_CHECKPOINT_STEPS, or 0 where its own flags set
    checkpoints or do not parse (validate_spec reports those)."""
    from geodml.cli import parse_config
    try:
        cfg = parse_config(list(spec.launch_argv))
    except (ValueError, SystemExit):
        return 0
    if cfg.reliability.checkpoint_every or cfg.reliability.resume:
        return 0  # the study's own flags decide
    return AUTO_CHECKPOINT_STEPS


def has_checkpoints(out: Path | str) -> bool:
    from geodml.checkpoint import checkpoint_files
    return any(p.name.endswith(".pt") for p in checkpoint_files(out))


def drop_checkpoints(out: Path | str) -> None:
    """Delete a finished run's checkpoints (it has summary.json, the last file a run writes: it is never
    resumed). Called when it finishes here, and when it is reused: its study process may have died
    between the summary and the clean-up."""
    from geodml.checkpoint import checkpoint_files
    for path in checkpoint_files(out):
        path.unlink(missing_ok=True)


def sources_digest() -> str:
    """SHA-256 of the geodml code a run executes: every .py and .c file under geodml/ (its relative path
    and bytes), except this launcher package, geodml/study/. A run is resumed only by the code it began
    with, so that no result is half one version and half another. Read from disk at each call (a few
    milliseconds), so a checkout that changes while a study runs is seen by the runs launched after it."""
    root = REPO_ROOT / "geodml"
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.suffix in (".py", ".c") and rel.parts[0] != "study" and path.is_file():
            h.update(rel.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def resume_step(spec: RunSpec) -> tuple[int | None, str]:
    """Where the interrupted run in ``spec.out`` would continue: ``(step, "")`` when every partition has a
    checkpoint of that step that fits the run, the geodml sources it started with are the ones here
    (SOURCES_FILE), and the files load; else ``(None, why not)``. Reads files only."""
    from geodml.checkpoint import find_resume_step, fingerprint
    from geodml.cli import parse_config
    out = Path(spec.out)
    if not has_checkpoints(out):
        return None, "it left no checkpoints"
    try:
        started = json.loads((out / SOURCES_FILE).read_text()).get("geodml_sources_sha256")
    except (OSError, ValueError, AttributeError):
        started = None
    if started != sources_digest():
        return None, ("the geodml code changed since it started" if started else
                      f"its directory has no {SOURCES_FILE} naming the code it started with")
    try:
        cfg = parse_config([*spec.launch_argv, "--out", str(out)])
        step = find_resume_step(out, spec.nproc, fingerprint(cfg, spec.nproc))
    except (ValueError, SystemExit) as exc:
        return None, f"its checkpoints cannot be resumed ({exc})"
    if step is None:
        return None, "no step has a checkpoint of every partition"
    return step, ""


def processes_writing(out: Path | str) -> list[int]:
    """PIDs of this machine's processes started with ``--out OUT`` naming ``out`` (a run's torchrun and its
    ranks): a run whose study process was killed lives on (it runs in sessions of its own), and its
    directory must not be resumed or cleared under it."""
    target = Path(out).resolve()
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        cmd = proc.info.get("cmdline") or []
        for flag, value in zip(cmd, cmd[1:]):
            if flag == "--out":
                if (Path(proc.info.get("cwd") or "/") / value).resolve() == target:
                    pids.append(proc.info["pid"])
                break
    return pids


def _prepare_dir(spec: RunSpec) -> tuple[int | None, str]:
    """Make ``spec.out`` ready to launch, under the run's lock. An interrupted run of ours (launch.json, no
    summary) is kept to be resumed when resume_step finds a step (returned), and is otherwise cleared and
    started afresh (returned: why it was not resumed; '' for a directory that held no run)."""
    out = Path(spec.out)
    why = ""
    if out.exists() and (out / LAUNCH_FILE).exists():  # an interrupted run of ours
        step, why = resume_step(spec)
        if step is not None:
            return step, ""
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / LAUNCH_FILE).write_text(json.dumps(launch_record(spec), indent=2) + "\n")
    (out / SOURCES_FILE).write_text(json.dumps({"geodml_sources_sha256": sources_digest()}) + "\n")
    return None, why


def read_text(path: Path) -> str:
    """A file's text ('' when it cannot be read), undecodable bytes replaced."""
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


_CAUSE = re.compile(r"^(?:\[rank(\d+)\]:\s*)?((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?::\s.*\S|:?$)"
                    r"|geodml: error: .*\S)")
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\b")  # torchrun's "Root Cause (first observed failure)" block
_LAUNCHER_ERRORS = ("ChildFailedError", "SignalException")
CAUSE_CHARS = 300


def failure_cause(text: str) -> str:
    """The cause of a failed run, from its stderr: the last exception line (``[rank0]: RuntimeError: ...``, the rank
    prefix dropped) or ``geodml: error:`` line, at most CAUSE_CHARS characters; '' if there is none. torchrun ends a
    failed run's stderr with its own ChildFailedError banner, which names no cause, so launcher errors are skipped;
    where the banner names the rank that failed first, that rank's last exception line is preferred (the others'
    are often knock-on errors, such as a closed connection)."""
    lines = text.splitlines()
    root = next((m[1] for m in map(_ROOT_RANK.match, reversed(lines)) if m), None)
    fallback = ""
    for line in reversed(lines):
        m = _CAUSE.match(line.strip())
        if not m or any(e in m[2].split(":", 1)[0] for e in _LAUNCHER_ERRORS):
            continue
        cause = m[2] if len(m[2]) <= CAUSE_CHARS else m[2][:CAUSE_CHARS - 3] + "..."
        if root is None or m[1] == root:
            return cause
        fallback = fallback or cause
    return fallback


# ---- processes ----------------------------------------------------------------------------

def kill_tree(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the child's process group and all its descendants; SIGKILL what is left after grace_s."""
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    _signal_group(proc.pid, signal.SIGTERM)
    for p in tree:
        _signal_proc(p, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _, alive = psutil.wait_procs(tree, timeout=max(0.1, grace_s / 2))
    _signal_group(proc.pid, signal.SIGKILL)
    for p in alive:
        _signal_proc(p, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_proc(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


@dataclass
class _Live:
    spec: RunSpec
    index: int
    proc: subprocess.Popen
    started: float
    files: tuple[IO[bytes], ...]
    """stdout, stderr and the run's lock (closed when the run ends: the lock goes with it)."""
    not_resumed: str = ""
    """Why an interrupted run was started afresh instead ('' when it was not interrupted)."""


def _start(spec: RunSpec, index: int, launcher: Launcher, lock: IO[bytes]) -> _Live:
    """Prepare the run's directory (cleared, or kept to resume) and launch it, holding ``lock`` (closed on
    failure). A resumed run's stdout and stderr are appended to, after a line that says so."""
    opened: list[IO[bytes]] = [lock]
    try:
        step, why = _prepare_dir(spec)
        spec = dataclasses.replace(spec, resume_from=step)
        mode = "wb" if step is None else "ab"
        opened.append(open(Path(spec.out) / STDOUT_FILE, mode))
        opened.append(open(Path(spec.out) / STDERR_FILE, mode))
        if step is not None:
            for f in opened[1:]:
                f.write(f"{RESUMED_MARK} the run's checkpoints at {time.strftime('%Y-%m-%d %H:%M:%S')} "
                        "---\n".encode())
                f.flush()
        proc = launcher(spec, opened[1], opened[2])
    except BaseException:
        for f in opened:
            f.close()
        raise
    return _Live(spec, index, proc, time.monotonic(), (opened[1], opened[2], lock), why)


def _finish(live: _Live, *, timed_out: bool) -> RunResult:
    for f in live.files:
        f.close()
    spec, code = live.spec, live.proc.returncode
    elapsed = time.monotonic() - live.started
    err_text = read_text(Path(spec.out) / STDERR_FILE)
    err_tail = tail(err_text)
    if timed_out:
        return RunResult(spec, "timeout", returncode=code, elapsed_s=elapsed, stderr_tail=err_tail,
                         error=f"killed after the run timeout ({elapsed:.0f} s)")
    summary = read_summary(spec.out)
    if spec.resume_from is not None:  # only this attempt's lines name the cause
        err_text = err_text[max(err_text.rfind(RESUMED_MARK), 0):]
    if code != 0 or summary is None:
        why = f"exit code {code}" if code != 0 else f"exit code 0 but no readable {SUMMARY_FILE}"
        # not for a run killed by a signal (code < 0): an exception it printed earlier is not why it ended
        cause = failure_cause(err_text) if code >= 0 else ""
        why += f" (`{cause}`)" if cause else ""
        return RunResult(spec, "failed", returncode=code, elapsed_s=elapsed, stderr_tail=err_tail, error=why)
    drop_checkpoints(spec.out)
    return RunResult(spec, "ok", summary=summary, returncode=0, elapsed_s=elapsed)


def describe(result: RunResult) -> str:
    """One progress line for a finished run. Its accuracy is the run's own last evaluation (summary.json's
    final_val_accuracy), labelled so: a study's report may score a run otherwise (hsu2019: the mean of the last
    rounds' evaluations)."""
    s = result.summary or {}
    if result.succeeded:
        acc, wan = s.get("final_val_accuracy"), s.get("wan_bytes_total")
        acc_s = "last-eval accuracy " + (f"{acc:.4f}" if isinstance(acc, (int, float)) else "?")
        return f"{acc_s}, WAN bytes {wan:,}" if isinstance(wan, int) else acc_s
    return f"{result.error}" + (f"; stderr tail:\n{_indent(result.stderr_tail)}" if result.stderr_tail else "")


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def eta_text(durations: list[float], running_s: list[float], pending: int, jobs: int) -> str:
    """', N left, ~M min to go' (empty when none is left or none has finished yet). Every run is taken to
    last the mean of ``durations`` (the runs finished so far): a running run ``running_s[j]`` seconds in
    frees its slot after what is left of that mean (at once when it has run longer), and the ``pending``
    runs fill whichever of the ``jobs`` slots frees first."""
    remaining = len(running_s) + pending
    if remaining <= 0 or not durations:
        return ""
    assert len(running_s) <= jobs, (running_s, jobs)
    mean_s = sum(durations) / len(durations)
    free_at = [max(mean_s - s, 0.0) for s in running_s] + [0.0] * (jobs - len(running_s))
    heapq.heapify(free_at)
    for _ in range(pending):
        heapq.heappush(free_at, heapq.heappop(free_at) + mean_s)
    left_min = max(free_at) / 60
    return f", {remaining} left, " + (f"~{left_min:.0f} min to go" if left_min >= 0.5 else "under a minute to go")


def run_all(specs: list[RunSpec], *, jobs: int = 1, timeout_s: float = 1800.0, launcher: Launcher = torchrun_launcher,
            log: Callable[[str], None] = print, poll_s: float = 0.2, grace_s: float = 10.0,
            processes: int | None = None, on_result: Callable[[RunResult], None] | None = None,
            checkpoint_every: int | None = None, records_root: Path | None = RECORDS) -> list[RunResult]:
    """Run every spec (reusing finished ones, resuming interrupted ones that have checkpoints), ``jobs`` at a
    time; results in spec order.
    ``processes``: run each on at most this many processes (``--processes``; RunSpec.processes).
    ``checkpoint_every``: steps between checkpoints (RunSpec.checkpoint_every; 0: none); None:
    auto_checkpoint_every per run.
    ``on_result``: called with each run's result as it ends in this invocation (not for reused runs),
    e.g. to prune files a study does not need while the others still run.
    ``records_root``: committed run records (geodml.study.records): a run whose record has the same
    flags is filled from it and reused; None: none are used.

    Ctrl-C (or any exception) kills every running child's process tree and re-raises.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if processes is not None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        specs = [dataclasses.replace(s, processes=min(processes, s.nproc)) for s in specs]
    if checkpoint_every is not None and checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be >= 0 steps, got {checkpoint_every}")
    specs = [dataclasses.replace(s, checkpoint_every=auto_checkpoint_every(s) if checkpoint_every is None
                                 else checkpoint_every) for s in specs]
    t0 = time.monotonic()
    n = len(specs)
    results: list[RunResult | None] = [None] * n
    pending: list[int] = []
    for i, spec in enumerate(specs):
        summary = read_summary(spec.out)
        recorded = summary is None and records_root is not None and restore(spec.out, launch_record(spec), records_root)
        if recorded:
            summary = read_summary(spec.out)
        if summary is not None:
            drop_checkpoints(spec.out)
            results[i] = RunResult(spec, "reused", summary=summary, returncode=0)
            where = "its committed record, docs/study/records" if recorded else f"{spec.out / SUMMARY_FILE} exists"
            log(f"[{i + 1}/{n}] reused {spec.run_id} ({where}): {describe(results[i])}")
        else:
            pending.append(i)
    live: list[_Live] = []
    busy: list[int] = []  # runs another study process holds: waited for, or run here if it gives them up
    durations: list[float] = []  # of the runs started afresh and finished in this invocation, for the ETA

    def take(i: int) -> IO[bytes] | None:
        """Run i's lock, or None: another process holds it or still runs it (it joins ``busy``, logged once),
        or it finished meanwhile (its result is read as reused)."""
        lock = try_lock(specs[i])
        if lock is None:
            if i not in busy:
                busy.append(i)
                log(f"[{i + 1}/{n}] busy {specs[i].run_id}: another study process is running it; waiting for it")
            return None
        summary = read_summary(specs[i].out)
        if summary is not None:  # another process finished it after this one looked
            lock.close()
            results[i] = RunResult(specs[i], "reused", summary=summary, returncode=0)
            log(f"[{i + 1}/{n}] reused {specs[i].run_id} (finished by another study process): {describe(results[i])}")
            return None
        if (pids := processes_writing(specs[i].out)):  # its study process died, its run did not
            lock.close()
            if i not in busy:
                busy.append(i)
                log(f"[{i + 1}/{n}] busy {specs[i].run_id}: process(es) {', '.join(map(str, pids))} still run it "
                    "outside any study process; waiting for them (or stop them)")
            return None
        return lock

    def next_run() -> tuple[int, IO[bytes]] | None:
        """The next run to start here, with its lock: pending runs in order, then busy runs whose holder
        ended without a summary (it failed or was stopped)."""
        while pending:
            i = pending.pop(0)
            lock = take(i)
            if lock is not None:
                return i, lock
        for i in list(busy):
            lock = take(i)
            if lock is not None or results[i] is not None:
                busy.remove(i)
            if lock is not None:
                return i, lock
        return None

    try:
        while pending or live or busy:
            while len(live) < jobs and (nxt := next_run()) is not None:
                i, lock = nxt
                try:
                    live.append(_start(specs[i], i, launcher, lock))
                except OSError as exc:  # e.g. the interpreter or the run directory is not usable
                    results[i] = RunResult(specs[i], "failed", error=f"could not start: {exc}")
                    log(f"[{i + 1}/{n}] FAILED {specs[i].run_id}: {results[i].error}")
                    continue
                lv = live[-1]
                if lv.spec.resume_from is not None:
                    log(f"[{i + 1}/{n}] resume {specs[i].run_id} from step {lv.spec.resume_from} of its checkpoints "
                        f"(study time {time.monotonic() - t0:.1f} s)")
                else:
                    log(f"[{i + 1}/{n}] start {specs[i].run_id} (study time {time.monotonic() - t0:.1f} s)"
                        + (f"; its interrupted attempt was cleared: {lv.not_resumed}" if lv.not_resumed else ""))
            time.sleep(poll_s)
            for lv in list(live):
                timed_out = lv.proc.poll() is None and time.monotonic() - lv.started > timeout_s
                if timed_out:
                    kill_tree(lv.proc, grace_s)
                if lv.proc.poll() is None:
                    continue
                live.remove(lv)
                res = results[lv.index] = _finish(lv, timed_out=timed_out)
                if on_result is not None:
                    on_result(res)
                word = "done" if res.succeeded else res.status.upper()
                if lv.spec.resume_from is None:  # a resumed run's time is only its remainder
                    durations.append(res.elapsed_s)
                eta = eta_text(durations, [time.monotonic() - other.started for other in live], len(pending), jobs)
                log(f"[{lv.index + 1}/{n}] {word} {lv.spec.run_id} in {res.elapsed_s:.1f} s "
                    f"(study time {time.monotonic() - t0:.1f} s{eta}): {describe(res)}")
    except BaseException:
        for lv in live:
            log(f"stopping {lv.spec.run_id} (pid {lv.proc.pid})")
            kill_tree(lv.proc, grace_s)
            for f in lv.files:
                f.close()
        raise
    return [r for r in results if r is not None]
