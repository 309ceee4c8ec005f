"""launch/slurm.sbatch under a real SLURM: slurmctld, slurmd and munged on loopback (Debian slurm-wlm, munge).

One node (this machine, NodeAddr 127.0.0.1), a generated slurm.conf in a temporary directory, the
daemons on free ports, munge's socket and key there too, everything stopped afterwards. A 2-rank
Gaia run (digits, one partition a rank, a checkpoint every 20 steps) is submitted with sbatch,
preempted by the script's own time-limit path (SIGUSR1) and later `scontrol requeue`d, and must
resume from its checkpoint by itself each time and end bit-identical to the same run uninterrupted
(``python -m geodml`` in one process: the results do not depend on the process count). SLURM holds a
requeued job for 120 s (its BeginTime); the test releases it at once with ``scontrol update
StartTime=now``, which is the only step a user would not take.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support.debpkg import debian_binary
from tests.support.monitoring import require

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, cond, timeout_s: float, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """SLURM_CONF's environment for a one-node cluster on loopback, torn down afterwards."""
    ctld = require(debian_binary(("slurmctld",), ("slurm-wlm",)), "slurmctld (Debian slurm-wlm)")
    munged = require(debian_binary(("munged",), ("munge",)), "munged (Debian munge)")
    if os.geteuid() != 0:
        pytest.skip("slurmd runs jobs as their submitter and must start as root here")
    slurmd = shutil.which("slurmd") or "/usr/sbin/slurmd"
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool", "munge"):
        (d / sub).mkdir()
    key = d / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock = d / "munge" / "sock"
    host = socket.gethostname()
    conf = d / "slurm.conf"
    conf.write_text(f"""ClusterName=geodmltest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={sock}
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd.pid'}
SlurmctldLogFile={d / 'slurmctld.log'}
SlurmdLogFile={d / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/linear
MpiDefault=none
SchedulerType=sched/builtin
ReturnToService=2
JobRequeue=1
KillWait=60
MinJobAge=3600
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
    env = {**os.environ, "SLURM_CONF": str(conf), "SLURMD_LOG": str(d / "slurmd.log")}
    started: list[Path] = []
    try:
        subprocess.run([munged, "--force", f"--socket={sock}", f"--key-file={key}", f"--pid-file={d / 'munge' / 'pid'}",
                        f"--log-file={d / 'munge' / 'log'}", f"--seed-file={d / 'munge' / 'seed'}"], check=True,
                       capture_output=True, timeout=30)
        started.append(d / "munge" / "pid")
        for daemon, pid in ((ctld, "slurmctld.pid"), (slurmd, "slurmd.pid")):
            subprocess.run([daemon, "-f", str(conf)], env=env, check=True, capture_output=True, timeout=30)
            started.append(d / pid)
        _wait("the node to come up idle", lambda: "idle" in subprocess.run(
            ["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, timeout=30).stdout, 60)
        yield env
    finally:
        subprocess.run(["scancel", "--user=root"], env=env, capture_output=True, timeout=30)
        for pid_file in reversed(started):
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
            except (OSError, ValueError, IndexError):
                pass


def _job(env: dict, job: str) -> dict[str, str]:
    text = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True,
                          timeout=30).stdout
    return dict(kv.split("=", 1) for kv in text.split() if "=" in kv)


def _steps_logged(out: Path) -> int:
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    return max((json.loads(x)["step"] for x in lines if x.strip()), default=0)


def _until_state(env: dict, job: str, want: str, restarts: str, timeout_s: float) -> dict[str, str]:
    return _wait(f"job {job} to be {want} with Restarts={restarts}", lambda: (
        (j := _job(env, job)).get("Restarts") == restarts and j.get("JobState") == want and j), timeout_s)


def _release(env: dict, job: str, attempt: int) -> None:
    """Start a requeued job now instead of after SLURM's 120 s hold. slurmd refuses to launch a job whose new
    credential is not newer than the revocation of its last attempt ("Job credential revoked"), and both times
    are in whole seconds: so wait until slurmd has logged the last attempt's batch step done ``attempt`` times,
    and until the wall clock is 2 s past that line's time."""
    from datetime import datetime
    log = Path(env["SLURMD_LOG"])
    tag = f"[{job}.batch] done with job"
    lines = _wait(f"slurmd to finish attempt {attempt}", lambda: (
        found if len(found := [x for x in log.read_text().splitlines() if tag in x]) >= attempt else None), 120, 0.2)
    done = datetime.fromisoformat(lines[attempt - 1][1:24]).timestamp()  # "[2026-12-03T20:12:26.143] ..."
    time.sleep(max(0.0, done + 2.0 - time.time()))
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], env=env, check=True, capture_output=True,
                   timeout=30)


def test_preempted_and_requeued_jobs_resume_from_their_checkpoints_bit_identical(slurm, tmp_path):
    """One job, interrupted twice: (1) SIGUSR1 to its batch script alone (what --signal=B:USR1@120 sends before
    the time limit; here `scancel --batch --signal=USR1`) past step 60: the script stops the ranks at a
    checkpoint and requeues the job itself; (2) `scontrol requeue` past step 200 of the restarted job: SLURM
    stops the ranks (SIGTERM). Each restart resumes by itself; the job ends as the uninterrupted run does."""
    flags = ["--dataset", "digits", "--model", "cnn", "--algo", "gaia", "--t0", "0.05", "--partitions", "2",
             "--steps", "600", "--checkpoint-every", "20", "--log-every", "10", "--eval-every", "200", "--no-progress",
             "--wan", "off"]
    ref = tmp_path / "ref"
    r = subprocess.run([sys.executable, "-m", "geodml", *flags, "--processes", "1", "--out", str(ref)],
                       env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out, log = tmp_path / "run", tmp_path / "job.out"
    env = {**slurm, "NPROC": "2", "RDZV_HOST": "127.0.0.1", "RDZV_PORT": str(_free_port()), "PYTHON": sys.executable,
           "GEODML_ROOT": str(REPO)}
    sub = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--cpus-per-task=1", f"--output={log}",
                          f"--chdir={tmp_path}", str(REPO / "launch" / "slurm.sbatch"), *flags, "--out", str(out)],
                         env=env, capture_output=True, text=True, timeout=60, check=True)
    job = sub.stdout.strip().split(";")[0]
    try:
        _wait("the job to pass step 60", lambda: _steps_logged(out) >= 60, 240, 0.2)
        subprocess.run(["scancel", "--batch", "--signal=USR1", job], env=env, check=True, capture_output=True,
                       timeout=30)
        _until_state(env, job, "PENDING", "1", 120)
        first = _steps_logged(out)
        _release(env, job, 1)
        _wait("the restarted job to pass step 200", lambda: _steps_logged(out) >= max(200, first + 20), 240, 0.2)
        subprocess.run(["scontrol", "requeue", job], env=env, check=True, capture_output=True, timeout=30)
        _until_state(env, job, "PENDING", "2", 120)
        _release(env, job, 2)
        state = _wait("the job to end", lambda: _job(env, job).get("JobState") in
                      ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") and _job(env, job), 300)
    finally:
        subprocess.run(["scancel", job], env=env, capture_output=True, timeout=30)
    text = log.read_text()
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "2", (state, text[-4000:])
    assert "slurm.sbatch: SIGUSR1 (the time limit is near): stopping the ranks at a checkpoint" in text, text[-4000:]
    assert f"slurm.sbatch: job {job} requeued; it resumes from its checkpoint" in text
    assert text.count("geodml: interrupted (SIGTERM) at step") == 2, text[-4000:]
    for n in (1, 2):
        assert f"slurm.sbatch: job {job} restarted ({n}): resuming from its checkpoint (--resume)" in text
    assert "Traceback" not in text, text[-4000:]  # torchrun's SignalException is dropped (launch/torchrun-quiet.sh)
    for k in range(2):
        a, b = torch.load(ref / f"rank{k}" / "model.pt"), torch.load(out / f"rank{k}" / "model.pt")
        assert all(torch.equal(a[n], b[n]) for n in a), k
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (ref, out))
    assert sa["final_val_accuracy"] == sb["final_val_accuracy"] and sa["wan_bytes_total"] == sb["wan_bytes_total"]
