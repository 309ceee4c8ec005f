"""Signals end a run cleanly (geodml.interrupt, docs/reliability.md "Signals"): SIGINT or SIGTERM to a run with
hosted partitions, in one process or through the launcher, stops every partition at one agreed step, writes a
checkpoint there when the run has checkpoints, prints one line with the step and the checkpoint and the command
that resumes it, and exits 128 + the signal (130, 143), without a traceback; the printed command finishes the run
with the same final weights as a run never interrupted."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from geodml.cli import main, resume_command
from tests.support.procs import REPO, _env, _kill

RUN = ["--algo", "fedavg", "--iter-local", "7", "--partitions", "4", "--dataset", "digits", "--model", "mlp", "--steps",
       "1500", "--eval-every", "500", "--log-every", "10", "--no-progress", "--seed", "3"]


def _start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "geodml", *argv], cwd=REPO, env=_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _signal_once_started(p: subprocess.Popen, out: Path, signum: int, timeout_s: float = 120) -> None:
    """The signal as soon as the run directory has its header (the ranks have joined): the run then stops at its
    first log line at the latest, long before its end (it cannot finish first, however fast it trains)."""
    deadline = time.monotonic() + timeout_s
    while not (out / "config.json").exists():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "the run did not start within the time"
        time.sleep(0.02)
    os.kill(p.pid, signum)


def _finish(p: subprocess.Popen, timeout_s: float = 120) -> tuple[int, str]:
    try:
        _, err = p.communicate(timeout=timeout_s)
    finally:
        _kill([p])
    return p.returncode, err


def _models(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "model.pt", weights_only=True)


def _resume_argv(err: str) -> list[str]:
    (line,) = [x for x in err.splitlines() if x.startswith("geodml: resume with: python -m geodml ")]
    return shlex.split(line.removeprefix("geodml: resume with: python -m geodml "))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, torch.Tensor]:
    out = tmp_path_factory.mktemp("whole") / "run"
    assert main([*RUN, "--out", str(out)]) == 0
    return _models(out)


@pytest.mark.integration
@pytest.mark.parametrize(("signum", "processes"), [(signal.SIGINT, "1"), (signal.SIGTERM, "2")])
def test_a_signal_stops_at_an_agreed_step_with_a_checkpoint_and_the_resume_finishes_the_run(
        signum, processes, tmp_path, uninterrupted):
    out = tmp_path / "run"
    p = _start([*RUN, "--checkpoint-every", "100", "--processes", processes, "--out", str(out)])
    _signal_once_started(p, out, signum)
    code, err = _finish(p)
    assert code == 128 + signum, err
    assert "Traceback" not in err and "[rank" not in err, err
    lines = [x for x in err.splitlines() if x.startswith("geodml: interrupted")]
    assert len(lines) == 1, err
    name = signal.Signals(signum).name
    step = int(lines[0].split(" at step ")[1].split()[0])
    assert lines[0] == f"geodml: interrupted ({name}) at step {step} of 1500; checkpoint at {out} (step {step})"
    assert 10 <= step < 1500 and step % 10 == 0   # a log step
    for rank in range(4):   # every partition stopped at that step and left a checkpoint of it, and only of it
        assert sorted(f.name for f in (out / f"rank{rank}").glob("ckpt-*.pt")) == [f"ckpt-{step:08d}.pt"]
    assert not (out / "summary.json").exists()
    argv = _resume_argv(err)
    assert argv[-1] == "--resume" and argv[argv.index("--out") + 1] == str(out)
    r = subprocess.run([sys.executable, "-m", "geodml", *argv], cwd=REPO, env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from step {step}" in r.stdout + r.stderr
    got = _models(out)
    assert got.keys() == uninterrupted.keys() and all(torch.equal(got[k], uninterrupted[k]) for k in got)


@pytest.mark.integration
def test_without_checkpoints_it_says_the_run_cannot_be_resumed(tmp_path):
    out = tmp_path / "run"
    p = _start([*RUN, "--out", str(out)])
    _signal_once_started(p, out, signal.SIGINT)
    code, err = _finish(p)
    assert code == 130 and "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("geodml: interrupted")]
    assert "; no checkpoint: the run cannot be resumed (give --checkpoint-every N" in line
    assert "resume with" not in err


@pytest.mark.integration
def test_a_second_signal_stops_at_once(tmp_path):
    """The first signal asks for a stop at the next log line; a second one before it ends the process then. With
    --log-every larger than the run, only the second can end it early."""
    out = tmp_path / "run"
    p = _start([*RUN, "--log-every", "100000", "--eval-every", "100000", "--out", str(out)])
    deadline = time.monotonic() + 120
    while not (out / "config.json").exists():
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(1.0)
    os.kill(p.pid, signal.SIGINT)
    time.sleep(1.0)
    assert p.poll() is None   # still training towards the next log line
    t0 = time.monotonic()
    os.kill(p.pid, signal.SIGINT)
    code, err = _finish(p, timeout_s=30)
    assert time.monotonic() - t0 < 10 and code in (-signal.SIGINT, 130), (code, err)
    assert "geodml: interrupted" not in err and not (out / "summary.json").exists()


def test_resume_command_names_the_out_and_asks_for_resume(tmp_path):
    assert resume_command(["--algo", "gaia", "--resume"], tmp_path / "r", under_torchrun=False) == (
        f"python -m geodml --algo gaia --out {tmp_path / 'r'} --resume")
    assert resume_command(["--out", "x y", "--steps", "5"], Path("x y"), under_torchrun=True) == (
        "the same torchrun command with the flags --out 'x y' --steps 5 --resume")


def test_restart_starts_an_unfinished_run_afresh_in_place(tmp_path, capsys):
    """What an interrupted run without checkpoints leaves (config.json, metrics.jsonl; here with a stale checkpoint
    of another run too) is refused with the two choices named, and --restart runs afresh there: the same weights and
    metrics as a run in an empty directory, no line of the old run kept, no old checkpoint left."""
    import json
    import shutil
    short = [*RUN[:RUN.index("--steps")], "--steps", "30", "--eval-every", "10", "--no-progress", "--seed", "3"]
    fresh = tmp_path / "fresh"
    assert main([*short, "--out", str(fresh)]) == 0
    out = tmp_path / "left"
    out.mkdir()
    shutil.copy(fresh / "config.json", out / "config.json")
    (out / "metrics.jsonl").write_text('{"step": 999, "train_loss": 1.0}\n')
    (out / "rank2").mkdir()
    (out / "rank2" / "ckpt-00000990.pt").write_bytes(b"stale")
    assert main([*short, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--restart to start it afresh there, or choose another --out" in err
    assert main([*short, "--out", str(out), "--resume", "--restart"]) == 2
    assert "--resume continues a run and --restart starts it afresh: give one" in capsys.readouterr().err
    assert main([*short, "--out", str(out), "--restart"]) == 0
    assert not list(out.glob("rank*/ckpt-*"))
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    want = [json.loads(x) for x in (fresh / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [r["step"] for r in want] and 999 not in [r["step"] for r in lines]
    a, b = _models(out), _models(fresh)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.integration
def test_under_torchrun_the_ranks_stop_alike_and_resume(tmp_path, uninterrupted):
    """torchrun passes a SIGINT on to its ranks (2 processes x 2 hosted partitions): they stop at one step with a
    checkpoint each and rank 0 prints the line; torchrun's own launcher then prints its SignalException traceback
    and exits 1, which geodml cannot change (docs/reliability.md). The same torchrun command with --resume
    finishes the run with the uninterrupted run's weights."""
    out = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "geodml"]
    p = subprocess.Popen([*torchrun, *RUN, "--checkpoint-every", "100", "--out", str(out)], cwd=REPO, env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _signal_once_started(p, out, signal.SIGINT)
    code, err = _finish(p)
    assert code != 0
    (line,) = [x for x in err.splitlines() if x.startswith("geodml: interrupted")]
    step = int(line.split(" at step ")[1].split()[0])
    assert line == f"geodml: interrupted (SIGINT) at step {step} of 1500; checkpoint at {out} (step {step})"
    assert "geodml: resume with: the same torchrun command with the flags " in err
    for rank in range(4):
        assert sorted(f.name for f in (out / f"rank{rank}").glob("ckpt-*.pt")) == [f"ckpt-{step:08d}.pt"]
    r = subprocess.run([*torchrun, *RUN, "--checkpoint-every", "100", "--out", str(out), "--resume"], cwd=REPO,
                       env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = _models(out)
    assert all(torch.equal(got[k], uninterrupted[k]) for k in got)


def test_the_same_signal_twice_at_once_is_one_and_a_later_one_is_a_second(monkeypatch):
    """A Ctrl-C delivered twice within ECHO_S (the terminal's group and a wrapper passing it on) counts once; a
    signal after that is the second, which ends the process with the signal's default action (here stubbed)."""
    import geodml.interrupt as it
    killed = []
    monkeypatch.setattr(it.os, "kill", lambda pid, signum: killed.append(signum))
    clock = [100.0]
    monkeypatch.setattr(it.time, "monotonic", lambda: clock[0])
    before = signal.getsignal(signal.SIGINT)   # (ignored in a pytest-xdist worker)
    with it.on_signals():
        it._handler(signal.SIGINT, None)
        clock[0] += 0.2
        it._handler(signal.SIGINT, None)            # the echo: ignored
        assert it.requested() == signal.SIGINT and killed == []
        clock[0] += it.ECHO_S
        it._handler(signal.SIGINT, None)            # a second Ctrl-C: at once
        assert killed == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) == before   # the previous handler is back


@pytest.mark.integration
def test_launch_run_sh_reports_the_ranks_line_and_exit_code(tmp_path):
    """A Ctrl-C at a terminal (SIGINT to run.sh's whole process group: bash, torchrun and its filter) under
    launch/run.sh: the ranks stop at one step with a checkpoint, rank 0's line is shown, torchrun's own
    SignalException traceback is not, and run.sh exits 130 where torchrun exits 1."""
    out = tmp_path / "run"
    p = subprocess.Popen(["bash", str(REPO / "launch" / "run.sh"), *RUN, "--checkpoint-every", "100", "--out", str(out)],
                         cwd=REPO, env=_env({"NPROC": "2"}), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.monotonic() + 120
    while not (out / "config.json").exists():
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.02)
    os.killpg(p.pid, signal.SIGINT)
    code, err = _finish(p)
    assert code == 130, err[-3000:]
    assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("geodml: interrupted (SIGINT) at step ")]
    step = int(line.split(" at step ")[1].split()[0])
    assert sorted(f.name for f in (out / "rank3").glob("ckpt-*.pt")) == [f"ckpt-{step:08d}.pt"]
