"""Multi-node launch on one machine, and the launch scripts' dry runs.

The "two-node" job is two torchrun invocations of launch/multinode.sh (``--nnodes 2``, node
ranks 0 and 1, c10d rendezvous on 127.0.0.1 and a free port), 2 ranks each: K=4 in total. It
must end with exactly the same weights as the same job from launch/run.sh on one node: data,
placement and every algorithm decision depend on the global rank only, never on the node.
Gaia is the algorithm because it uses both paths across the "nodes": ZeroMQ point-to-point for
its significant updates and gloo collectives (the global model, evaluation).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from tests.support.procs import REPO, _env, _kill, free_base, free_port, run_command

LAUNCH = REPO / "launch"
JOB = ["--algo", "gaia", "--t0", "0.05", "--steps", "12", "--batch-size", "10", "--model", "mlp", "--wan", "virtual",
       "--eval-every", "6", "--log-every", "3", "--no-progress", "--metrics-linger", "0", "--partition", "label",
       "--skew", "0.5"]


def _launch_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "GEODML_DATA_CACHE": str(tmp_path / "cache"), **extra}


def _run_two_nodes(tmp_path: Path, out: Path, metrics_ports: tuple[int, int], timeout_s: float = 240.0) -> list[str]:
    port, rdzv_id = free_port(avoid=tuple(p + i for p in metrics_ports for i in (0, 1))), f"test-{uuid.uuid4().hex[:8]}"
    procs, logs = [], []
    try:
        for node in (0, 1):
            env = _env(_launch_env(tmp_path, NNODES="2", NODE_RANK=str(node), NPROC="2", RDZV_HOST="127.0.0.1",
                                   RDZV_PORT=str(port), RDZV_ID=rdzv_id))
            log = open(tmp_path / f"node{node}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(["bash", str(LAUNCH / "multinode.sh"), *JOB, "--out", str(out),
                                           "--metrics-port", str(metrics_ports[node])],
                                          cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                time.sleep(1.0)  # let the other node report
                break
            time.sleep(0.1)
    finally:
        _kill(procs)
        for log in logs:
            log.close()
    texts = [(tmp_path / f"node{n}.log").read_text(errors="replace") for n in (0, 1)]
    codes = [p.returncode for p in procs]
    assert codes == [0, 0], f"two-node job exit codes {codes}\n" + "\n".join(t[-3000:] for t in texts)
    return texts


@pytest.mark.integration
def test_two_nodes_equal_one_node(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    env = _launch_env(tmp_path, NPROC="4", MASTER_PORT=str(free_port()))
    proc = run_command(["bash", str(LAUNCH / "run.sh"), *JOB, "--out", str(one)], timeout_s=240, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    base0 = free_base(2)
    base1 = free_base(2, avoid=(base0, base0 + 1))
    _run_two_nodes(tmp_path, two, (base0, base1))

    # The same final weights, exactly: the global model and every partition's own model.
    for name in ["model.pt", *(f"rank{r}/model.pt" for r in range(4))]:
        a, b = torch.load(one / name), torch.load(two / name)
        assert list(a) == list(b), name
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}:{key} differs between one node and two nodes"
    s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    assert s2["world_size"] == 4 and s2["steps"] == 12
    for key in ("final_val_accuracy", "per_rank_val_accuracy", "wan_bytes_total", "wan_bytes_by_kind", "emulated_seconds"):
        if key != "emulated_seconds":  # emulated time includes measured compute, so it is not bit-reproducible
            assert s1[key] == s2[key], key
    assert s2["wan_bytes_by_kind"]["update"] > 0  # Gaia's ZeroMQ traffic crossed between the two "nodes"

    # Prometheus: the targets file lists every node's exporters (each node used its own base port here,
    # since both "nodes" share one machine), and each target's port is its base + its local rank.
    groups = json.loads((two / "prometheus_targets.json").read_text())
    assert [g["labels"]["rank"] for g in groups] == ["0", "1", "2", "3"]
    ports = sorted(int(g["targets"][0].rsplit(":", 1)[1]) for g in groups)
    assert ports == sorted([base0, base0 + 1, base1, base1 + 1])
    assert all(g["targets"][0].startswith("127.0.0.1:") for g in groups)
    # ranks of one node are consecutive and their ports are base, base + 1
    by_rank = [int(g["targets"][0].rsplit(":", 1)[1]) for g in groups]
    assert {by_rank[1] - by_rank[0], by_rank[3] - by_rank[2]} == {1}


def _dry(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHON="/opt/py/bin/python", **env)
    for k in ("SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_JOB_ID", "SLURM_NODEID", "SLURM_GPUS_ON_NODE",
              "SLURM_SUBMIT_DIR", "NODE_RANK", "NNODES", "NPROC", "MASTER_ADDR", "RDZV_ID", "RDZV_HOST"):
        if k not in env:
            full.pop(k, None)
    return subprocess.run(["bash", str(LAUNCH / script), *args], env=full, capture_output=True, text=True, timeout=30)


@pytest.mark.integration
def test_scripts_parse():
    for script in ("run.sh", "multinode.sh", "slurm.sbatch", "demo.sh", "test.sh", "bootstrap.sh"):
        r = subprocess.run(["bash", "-n", str(LAUNCH / script)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"{script}: {r.stderr}"
    for script in ("run.sh", "multinode.sh", "slurm.sbatch"):
        r = _dry(script, "--help")
        assert r.returncode == 0 and "--dry-run" in r.stdout and "NPROC" in r.stdout, script


@pytest.mark.integration
def test_slurm_dry_run_prints_srun_and_one_torchrun_per_node():
    r = _dry("slurm.sbatch", "--dry-run", "--algo", "bsp", "--out", "runs/x y", NODES="gpu-a gpu-b gpu-c", NPROC="4",
             RDZV_PORT="29611")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("NNODES=3 RDZV_HOST=gpu-a RDZV_PORT=29611 RDZV_ID=geodml NPROC=4 srun --nodes=3 --ntasks=3 "
                               "--ntasks-per-node=1 --kill-on-bad-exit=1 ")
    assert lines[0].endswith(f"{LAUNCH}/multinode.sh --algo bsp --out runs/x\\ y")
    for node, host in enumerate(("gpu-a", "gpu-b", "gpu-c")):
        assert lines[node + 1] == (
            f"# on {host}: cd {REPO} && OMP_NUM_THREADS=1 /opt/py/bin/python -m torch.distributed.run --nnodes=3 "
            f"--node-rank={node} --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=gpu-a:29611 --rdzv-id=geodml "
            f"-m geodml --algo bsp --out runs/x\\ y")
    # outside an allocation, without --dry-run: a clear error, exit 2, nothing started
    r = _dry("slurm.sbatch", "--algo", "bsp")
    assert r.returncode == 2 and "not inside a SLURM allocation" in r.stderr


@pytest.mark.integration
def test_single_and_multinode_dry_runs_and_checks():
    r = _dry("run.sh", "--dry-run", "--steps", "3", NPROC="16", MASTER_PORT="29700")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f"cd {REPO} && OMP_NUM_THREADS=1 /opt/py/bin/python -m torch.distributed.run "
                                f"--nproc-per-node=16 --master-addr=127.0.0.1 --master-port=29700 -m geodml --steps 3")
    r = _dry("multinode.sh", "--dry-run", NNODES="2", NODE_RANK="1", NPROC="2", RDZV_BACKEND="static",
             RDZV_HOST="10.0.0.1")
    assert r.returncode == 0, r.stderr
    assert "--nnodes=2 --node-rank=1 --nproc-per-node=2 --master-addr=10.0.0.1 --master-port=29500 -m geodml" in r.stdout
    for env, why in (({"NNODES": "2", "NODE_RANK": "2"}, "NODE_RANK=2 but NNODES=2"),
                     ({"NPROC": "0"}, "NPROC must be a positive integer"),
                     ({"RDZV_BACKEND": "etcd"}, "RDZV_BACKEND must be c10d or static")):
        r = _dry("multinode.sh", "--dry-run", **env)
        assert r.returncode == 2 and why in r.stderr, (env, r.stderr)
    r = _dry("run.sh", "--dry-run", NPROC="x")
    assert r.returncode == 2 and "NPROC must be a positive integer" in r.stderr


def test_backend_auto_picks_nccl_only_with_one_gpu_per_local_rank(monkeypatch):
    """No GPU here: torch.cuda is stubbed; this checks the selection rule, not NCCL itself."""
    import pytest

    from geodml.runtime import resolve_backend
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert resolve_backend("auto", 4) == "gloo"
    with pytest.raises(ValueError, match="needs CUDA"):
        resolve_backend("nccl", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert [resolve_backend("auto", n) for n in (1, 4, 5)] == ["nccl", "nccl", "gloo"]
    assert resolve_backend("nccl", 4) == "nccl" and resolve_backend("gloo", 2) == "gloo"
    with pytest.raises(ValueError, match="runs 5 ranks and sees 4 GPU"):
        resolve_backend("nccl", 5)


def test_device_flag_lets_ranks_share_gpus_and_rejects_impossible_pairs(monkeypatch):
    """--device: cpu keeps auto on gloo; cuda without CUDA or nccl with cpu are errors before start;
    gloo + cuda places rank i on GPU i mod (number of GPUs). Stubbed torch.cuda (no GPU here; the
    real runs on an H100 are in docs/launch.md)."""
    import pytest

    from geodml.runtime import resolve_backend, resolve_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match="--device cuda needs CUDA"):
        resolve_backend("auto", 1, "cuda")
    assert resolve_backend("auto", 3, "cpu") == "gloo" and resolve_device("gloo", "cpu", 2).type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_backend("auto", 2, "cpu") == "gloo"            # GPUs there, but the user asked for the CPU
    assert resolve_backend("auto", 2, "cuda") == "nccl"           # one GPU per rank: NCCL
    assert resolve_backend("auto", 5, "cuda") == "gloo"           # more ranks than GPUs: they share over gloo
    with pytest.raises(ValueError, match="cannot be combined with --device cpu"):
        resolve_backend("nccl", 1, "cpu")
    with pytest.raises(ValueError, match="--backend gloo --device cuda"):
        resolve_backend("nccl", 5, "auto")
    assert [str(resolve_device("gloo", "cuda", r)) for r in range(5)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    assert str(resolve_device("nccl", "auto", 1)) == "cuda:1" and resolve_device("gloo", "auto", 1).type == "cpu"


# Issue 71 item 5: two torchrun nodes on loopback (launch/multinode.sh, c10d rendezvous, --max-restarts 0):
# node 0 starts first, hosts the store and runs ranks 0 and 1; node 1 runs rank 2. One rank is SIGKILLed
# (GEODML_FAULT) at start-up (before it joins) or during the run (after step 5). Every surviving rank must
# print exactly one geodml line naming the lost rank, and no traceback of ours. Which rank says what:
#   node 0 loses rank 1: rank 0's torchrun agent stops it at once (SIGTERM); geodml.peerwatch.AgentStop sees
#     that its sibling's process ended first, names it and declares it in the store before that node's agent
#     takes the store away; rank 2 repeats the declaration (its watch, or the start-up join).
#   node 1 loses rank 2: no agent stops node 0's ranks; their peer watch (during the run) or the start-up
#     join (--comm-timeout) names rank 2.
LOSSES = {
    "start-up, store's node": (0, "local_rank=1,at=startup", 1, (0, 2)),
    "start-up, other node": (1, "local_rank=0,at=startup", 2, (0, 1)),
    "run, store's node": (0, "local_rank=1,step=5,how=kill", 1, (0, 2)),
    "run, other node": (1, "local_rank=0,step=5,how=kill", 2, (0, 1)),
}


@pytest.mark.integration
@pytest.mark.parametrize("case", list(LOSSES))
def test_every_surviving_rank_names_the_lost_rank_on_two_nodes(tmp_path, case):
    """docs/reliability.md "Two nodes": each case above ends with every survivor's one line."""
    fault_node, fault, lost, survivors = LOSSES[case]
    port, rdzv_id = free_port(), f"test-{uuid.uuid4().hex[:8]}"
    argv = [*JOB, "--steps", "100000", "--eval-every", "100000", "--log-every", "1000", "--out", str(tmp_path / "run"),
            "--peer-timeout-s", "6", "--comm-timeout", "12"]
    procs, logs = [], []
    t0 = time.monotonic()
    try:
        for node, nproc in ((0, 2), (1, 1)):
            env = _env(_launch_env(tmp_path, NNODES="2", NODE_RANK=str(node), NPROC=str(nproc), RDZV_HOST="127.0.0.1",
                                   RDZV_PORT=str(port), RDZV_ID=rdzv_id,
                                   **({"GEODML_FAULT": fault} if node == fault_node else {})))
            if node == 1:
                time.sleep(1.0)  # node 0's agent binds the rendezvous endpoint first: it hosts the store
            log = open(tmp_path / f"node{node}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(["bash", str(LAUNCH / "multinode.sh"), *argv], cwd=REPO, env=env, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.1)
        took = time.monotonic() - t0
    finally:
        _kill(procs)
        for log in logs:
            log.close()
    texts = [(tmp_path / f"node{n}.log").read_text(errors="replace") for n in (0, 1)]
    both = "\n".join(texts)
    assert f"GEODML_FAULT: rank {lost} dies" in texts[fault_node], both[-4000:]
    assert all(p.returncode not in (None, 0) for p in procs), both[-4000:]
    lines = [line for line in both.splitlines() if line.startswith("geodml: error:")]
    for r in survivors:
        mine = [line for line in lines if f"stopping rank {r}" in line or f"stopped rank {r} " in line]
        assert len(mine) == 1, (r, lines, both[-4000:])
        assert f"rank {lost} lost" in mine[0] or f"missing: rank {lost}" in mine[0], (r, mine)
    assert len(lines) == len(survivors), lines
    assert not re.search(r'File "[^"]*/geodml/', both), both[-4000:]  # (torchrun's agent prints its own report)
    print(f"{case}: {took:.1f} s;", *lines, sep="\n  ")
