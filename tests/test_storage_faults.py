"""Storage faults (docs/reliability.md "Storage faults"): a write of the run that fails (here ENOSPC, from a
temporary file that is a link to /dev/full, which fails every write with "No space left on device") ends the run
with one ``geodml: error:`` line naming the file, the operation, the error and the free space, exit 2 on every
rank, the partial file removed and every file written before intact; a checkpoint's fault names the last
complete checkpoint, from which --resume finishes the run with the weights of a run never interrupted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from geodml.cli import main
from geodml.errors import StorageError
from geodml.metrics.sinks import JsonlSink
from tests.support.procs import REPO, _env

RUN = ["--algo", "fedavg", "--iter-local", "7", "--partitions", "4", "--dataset", "digits", "--model", "mlp",
       "--steps", "40", "--eval-every", "20", "--no-progress", "--seed", "5"]

pytestmark = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")


def _full(path: Path) -> None:
    """Make the temporary file of ``path`` a link to /dev/full: its write fails with ENOSPC."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.symlink_to("/dev/full")


def _models(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "model.pt", weights_only=True)


def _error_lines(err: str) -> list[str]:
    return [x for x in err.splitlines() if x.startswith("geodml: error:")]


def test_a_full_disk_at_a_checkpoint_is_one_line_and_resume_finishes_the_run(tmp_path, capsys):
    whole = tmp_path / "whole"
    assert main([*RUN, "--out", str(whole)]) == 0
    out = tmp_path / "run"
    _full(out / "rank1" / "ckpt-00000020.pt")
    capsys.readouterr()
    assert main([*RUN, "--checkpoint-every", "10", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    (line,) = _error_lines(err)
    assert line.startswith(f"geodml: error: cannot write checkpoint {out / 'rank1' / 'ckpt-00000020.pt'}: No space left "
                           "on device (") and line.endswith(" free on its file system) at step 20; the last complete "
                                                            "checkpoint, step 10, is intact: make room and run the "
                                                            "same command with --resume")
    assert "Traceback" not in err and "--help" not in err
    assert not (out / "rank1" / "ckpt-00000020.pt.tmp").exists() and not (out / "summary.json").exists()
    assert (out / "rank1" / "ckpt-00000010.pt").exists()
    assert main([*RUN, "--checkpoint-every", "10", "--out", str(out), "--resume"]) == 0
    assert "resumed from step 10" in capsys.readouterr().out
    got, want = _models(out), _models(whole)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


@pytest.mark.integration
def test_a_full_disk_on_another_process_is_one_line_from_rank_0_and_exit_2(tmp_path):
    """Partition 3 lives in process 1: its fault reaches the launcher's rank 0 through the peer watch."""
    out = tmp_path / "run"
    _full(out / "rank3" / "ckpt-00000020.pt")
    r = subprocess.run([sys.executable, "-m", "geodml", *RUN, "--checkpoint-every", "10", "--processes", "2", "--out",
                        str(out)], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 2, r.stderr[-3000:]
    (line,) = _error_lines(r.stderr)
    assert f"cannot write checkpoint {out / 'rank3' / 'ckpt-00000020.pt'}: No space left on device" in line
    assert "Traceback" not in r.stderr and "[rank" not in r.stderr
    assert r.stdout.startswith("geodml 0.1.0: fedavg on digits")   # what rank 0 printed before is not lost
    assert [p.name for p in (out / "rank3").iterdir()] == ["ckpt-00000010.pt"]


def test_a_full_disk_at_the_summary_names_it_and_keeps_the_rest(tmp_path, capsys):
    out = tmp_path / "run"
    _full(out / "summary.json")
    assert main([*RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    (line,) = _error_lines(err)
    assert line.startswith(f"geodml: error: cannot write summary.json {out / 'summary.json'}: No space left on device")
    assert not (out / "summary.json").exists() and not (out / "summary.json.tmp").exists()
    assert (out / "metrics.jsonl").read_text().count("\n") >= 2 and (out / "config.json").exists()


def test_a_metrics_line_that_cannot_be_written_is_a_storage_error():
    sink = JsonlSink(Path("/dev/full"))
    with pytest.raises(StorageError, match=r"^cannot write metrics /dev/full: No space left on device \("):
        sink.log({"step": 1, "train_loss": 0.5})
    sink.log({"step": 2})   # once failed, the sink is closed: nothing more is attempted
    sink.close()


def _immutable(path: Path, on: bool) -> bool:
    """chattr +i / -i (ext2-4, XFS, btrfs): even root may then not create or delete a file in ``path``."""
    r = subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True, text=True, timeout=30)
    return r.returncode == 0


@pytest.mark.integration
def test_a_permission_taken_away_mid_run_is_one_line_and_resume_finishes_the_run(tmp_path):
    """The run's rank directory made immutable while the run trains (EPERM, "Operation not permitted", the
    same for root): the next checkpoint fails with one line naming it and the last complete one, exit 2, no
    traceback; with the permission back, --resume finishes the run with the weights of one never interrupted."""
    import re
    import time
    probe = tmp_path / "probe"
    probe.mkdir()
    if not _immutable(probe, True):
        pytest.skip("this file system does not take chattr +i")
    _immutable(probe, False)
    run = [*RUN[:RUN.index("--steps")], "--steps", "1200", "--checkpoint-every", "200", "--eval-every", "1200",
           "--no-progress", "--seed", "5"]
    whole, out = tmp_path / "whole", tmp_path / "run"
    assert main([*run, "--out", str(whole)]) == 0
    p = subprocess.Popen([sys.executable, "-m", "geodml", *run, "--processes", "1", "--out", str(out)], cwd=REPO,
                         env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank1 = out / "rank1"
    try:
        deadline = time.monotonic() + 120
        while not list(rank1.glob("ckpt-*.pt")) and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.005)
        assert _immutable(rank1, True)
        _, err = p.communicate(timeout=180)
    finally:
        _immutable(rank1, False)
        if p.poll() is None:
            p.kill()
    assert p.returncode == 2, err[-3000:]
    (line,) = _error_lines(err)
    m = re.fullmatch(rf"geodml: error: cannot write checkpoint {re.escape(str(rank1))}/ckpt-(\d+)\.pt: Operation not "
                     r"permitted \(.* free on its file system\) at step (\d+); the last complete checkpoint, step (\d+), "
                     r"is intact: restore write access and run the same command with --resume", line)
    assert m and m.group(1).lstrip("0") == m.group(2) and int(m.group(3)) < int(m.group(2)), line
    assert "Traceback" not in err and (rank1 / f"ckpt-{int(m.group(3)):08d}.pt").exists()
    r = subprocess.run([sys.executable, "-m", "geodml", *run, "--processes", "1", "--out", str(out), "--resume"],
                       cwd=REPO, env=_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and f"resumed from step {m.group(3)}" in r.stdout, r.stderr[-3000:]
    got, want = _models(out), _models(whole)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


def test_an_io_error_at_a_checkpoints_fsync_is_one_line_and_resume_finishes_the_run(tmp_path, capsys, monkeypatch):
    """EIO, injected where a failing disk reports it for a checkpoint: the fsync before the rename (no
    device here fails on demand, so the fault is os.fsync's). The same one line (file, error, free space,
    step, the last complete checkpoint), advice for EIO (check the disk), and --resume finishes the run."""
    import errno
    import os

    import geodml.rundir
    whole = tmp_path / "whole"
    assert main([*RUN, "--out", str(whole)]) == 0
    out = tmp_path / "run"
    real_fsync = os.fsync
    bad = out / "rank2" / "ckpt-00000030.pt.tmp"

    def fsync(fd: int) -> None:
        if Path(os.readlink(f"/proc/self/fd/{fd}")) == bad:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(geodml.rundir.os, "fsync", fsync)
    capsys.readouterr()
    assert main([*RUN, "--checkpoint-every", "10", "--out", str(out)]) == 2
    monkeypatch.setattr(geodml.rundir.os, "fsync", real_fsync)
    err = capsys.readouterr().err
    (line,) = _error_lines(err)
    assert line.startswith(f"geodml: error: cannot write checkpoint {out / 'rank2' / 'ckpt-00000030.pt'}: "
                           "Input/output error (") and line.endswith(
        " free on its file system) at step 30; the last complete checkpoint, step 20, is intact: check the disk and "
        "run the same command with --resume"), line
    assert "Traceback" not in err
    assert not bad.exists() and not (out / "rank2" / "ckpt-00000030.pt").exists() and not (out / "summary.json").exists()
    assert main([*RUN, "--checkpoint-every", "10", "--out", str(out), "--resume"]) == 0
    assert "resumed from step 20" in capsys.readouterr().out
    got, want = _models(out), _models(whole)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
