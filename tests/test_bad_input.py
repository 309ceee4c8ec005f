"""Bad input (issue 10 item 4): a table of bad flags, TOML config files, topology files, data
directories and checkpoint files. Each must exit with code 2 and ONE clear message that names
the problem (no traceback), before any process group exists, and leave every file already in
the run directory byte-identical (and add none). Most cases run ``geodml.cli.main`` in-process;
two run under a real torchrun to show that only rank 0 prints and every rank exits 2."""

from __future__ import annotations

import pickle
import signal
import socket
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from geodml import checkpoint as ck
from geodml.cli import main, parse_config
from tests.support.files import make_idx_dir, write_cifar, write_idx

BASE = ["--dataset", "digits", "--model", "logreg", "--steps", "5", "--no-progress", "--wan", "off"]


def _toml(tmp, text):
    f = tmp / "cfg.toml"
    f.write_text(text)
    return ["--config", str(f)]


def _topo(tmp, text):
    f = tmp / "topo.toml"
    f.write_text(text)
    return ["--topology", str(f)]


TOPO_OK = ('name = "t"\nsource = "illustrative"\nregions = ["a"]\nplacement = "cyclic"\n'
           '[lan]\nbandwidth_mbps = 10\nlatency_ms = 1\n')


def _idx_dir(tmp, *, bad_magic=False):
    d = tmp / "mnist"
    d.mkdir()
    for name, ndim, n in (("train-images-idx3-ubyte", 3, 4), ("train-labels-idx1-ubyte", 1, 4),
                          ("t10k-images-idx3-ubyte", 3, 2), ("t10k-labels-idx1-ubyte", 1, 2)):
        dims = (n, 28, 28)[:ndim]
        magic = struct.pack(">HBB", 0 if not bad_magic else 0xBEEF, 0x08, ndim)
        (d / name).write_bytes(magic + struct.pack(f">{ndim}I", *dims) + bytes(int(torch.tensor(dims).prod())))
    return ["--dataset", "mnist", "--data-dir", str(d)]


def _ckpt(tmp, *, argv=(), mutate=None, raw=None, rank_dir=0, step=4, resume=True):
    """A checkpoint in <out>/rank<rank_dir>/ for the run BASE + argv (world size 1), then spoiled."""
    cfg = parse_config([*BASE, *argv])
    path = ck.checkpoint_path(tmp / "run", rank_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": ck.FORMAT, "step": step, "rank": rank_dir, "world_size": 1, "fingerprint": ck.fingerprint(cfg, 1),
            "model": {}, "algo": {}, "sampler": {}, "train_state": {}}
    if mutate:
        mutate(data)
    if raw is not None:
        path.write_bytes(raw(path, data))
    else:
        ck.atomic_save(data, path)
    return [*argv, *(["--resume"] if resume else [])]


def _truncated(path, data):
    ck.atomic_save(data, path)
    return path.read_bytes()[: path.stat().st_size // 2]


def _tensor_file(path, data):
    torch.save(torch.zeros(3), path)
    return path.read_bytes()


def _summary(tmp):
    (tmp / "run" / "summary.json").write_text('{"algo": "bsp"}\n')
    return ["--resume"]


def _mnist(tmp, *, n_train=12, gz=False, spoil=None):
    """A small MNIST directory in the real IDX format (tests/support/files.py), optionally spoiled."""
    d = tmp / "mnist-small"
    d.mkdir()
    make_idx_dir(d, gz=gz, n_train=n_train, n_test=5, rows=28, cols=28)
    if spoil:
        spoil(d)
    return ["--dataset", "mnist", "--data-dir", str(d)]


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _cifar_label_12(d):
    with open(d / "test_batch", "rb") as fh:
        batch = pickle.load(fh)
    batch[b"labels"][0] = 12
    with open(d / "test_batch", "wb") as fh:
        pickle.dump(batch, fh)


def _label_10(d):
    labels = np.full(12, 3, dtype=np.uint8)
    labels[7] = 10
    write_idx(d, "train-labels-idx1-ubyte", labels, gz=False)


def _cifar(tmp, spoil):
    d = tmp / "cifar"
    write_cifar(d)
    spoil(d)
    return ["--dataset", "cifar10", "--data-dir", str(d)]


_HELD: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _release_held_ports():
    yield
    while _HELD:
        _HELD.pop().close()


def _port_taken(tmp):
    """A port another program listens on (held until the test ends)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    _HELD.append(s)
    return ["--metrics-port", str(s.getsockname()[1]), "--metrics-host", "127.0.0.1"]


def _crashed(tmp):
    (tmp / "run" / "config.json").write_text('{"version": "0.1.0"}\n')
    return []


# (id, setup(tmp) -> extra argv, words the one message must contain)
CASES = [
    # flags
    ("steps-zero", lambda t: ["--steps", "0"], "--steps must be an integer >= 1"),
    ("batch-size-negative", lambda t: ["--batch-size", "-4"], "--batch-size must be an integer >= 1"),
    ("lr-nan", lambda t: ["--lr", "nan"], "--lr must be > 0"),
    ("momentum-one", lambda t: ["--momentum", "1"], "--momentum must be in [0, 1)"),
    ("unknown-algo", lambda t: ["--algo", "sgd"], "--algo"),
    ("t0-negative", lambda t: ["--algo", "gaia", "--t0", "-0.1"], "--t0 must be >= 0"),
    ("sparsity-one", lambda t: ["--algo", "dgc", "--sparsity", "1"], "--sparsity must be in [0, 1)"),
    ("iter-local-zero", lambda t: ["--algo", "fedavg", "--iter-local", "0"], "--iter-local must be an integer >= 1"),
    ("client-fraction-zero", lambda t: ["--algo", "fedavg", "--client-fraction", "0"], "--client-fraction must be in (0, 1]"),
    ("iwds-two-numbers", lambda t: ["--algo", "fedavg", "--iwds", "0.9,0.1"], "--iwds takes three numbers"),
    ("fedir-and-iwds", lambda t: ["--algo", "fedavg", "--fedir", "--iwds", "0.9,0.1,0.5"], "--fedir and --iwds both set"),
    ("iwds-resample-fedvc", lambda t: ["--algo", "fedavg", "--iwds", "0.9,0.1,0.5", "--iwds-mode", "resample",
                                       "--virtual-client-size", "8"], "--iwds-mode resample draws each minibatch"),
    ("iwds-mode-unknown", lambda t: ["--algo", "fedavg", "--iwds-mode", "sample"], "--iwds-mode"),
    ("local-epochs-negative", lambda t: ["--algo", "fedavg", "--local-epochs", "-1"], "--local-epochs must be >= 0"),
    ("lda-alpha-zero", lambda t: ["--partition", "lda", "--alpha", "0"], "--partition lda needs --alpha > 0"),
    ("rounds-and-steps", lambda t: ["--algo", "fedavg", "--rounds", "3", "--steps", "10"],
     "--rounds and --steps both set the training length"),
    ("local-epochs-fedvc", lambda t: ["--algo", "fedavg", "--local-epochs", "1", "--virtual-client-size", "8"],
     "--local-epochs and --virtual-client-size"),
    ("skewscout-bsp", lambda t: ["--algo", "bsp", "--skewscout"], "--skewscout tunes a communication knob"),
    ("metrics-port-high", lambda t: ["--metrics-port", "70000"], "--metrics-port must be a TCP port"),
    ("checkpoint-every-negative", lambda t: ["--checkpoint-every", "-1"], "--checkpoint-every must be an integer >= 0"),
    ("peer-timeout-zero", lambda t: ["--peer-timeout-s", "0"], "--peer-timeout-s must be > 0"),
    ("divergence-loss-zero", lambda t: ["--divergence-loss", "0"], "--divergence-loss must be a loss > 0"),
    ("divergence-loss-nan", lambda t: ["--divergence-loss", "nan"], "--divergence-loss must be a loss > 0"),
    ("resume-without-out", lambda t: ["--resume", "--out", None], "--resume needs the run directory"),
    ("checkpoint-without-out", lambda t: ["--checkpoint-every", "5", "--out", None], "--checkpoint-every needs a run directory"),
    ("out-is-a-file", lambda t: ["--out", str(t / "run" / "notes.txt")], "exists and is not a directory"),
    ("unknown-flag", lambda t: ["--learning-rate", "0.1"], "unrecognized arguments: --learning-rate"),
    ("device-unknown", lambda t: ["--device", "gpu"], "--device: invalid choice: 'gpu'"),
    ("device-nccl-on-cpu", lambda t: ["--backend", "nccl", "--device", "cpu"], "cannot be combined with --device cpu"),
    # TOML config files
    ("toml-missing", lambda t: ["--config", str(t / "nope.toml")], "--config: file not found"),
    ("toml-syntax", lambda t: _toml(t, "lr = = 1\n"), "is not valid TOML"),
    ("toml-unknown-key", lambda t: _toml(t, "learning_rate = 0.1\n"), "unknown key 'learning_rate'"),
    ("toml-wrong-type", lambda t: _toml(t, 'lr = "fast"\n'), "--lr must be > 0"),
    ("toml-resume-string", lambda t: _toml(t, 'resume = "yes"\n'), "--resume is a switch"),
    ("toml-checkpoint-float", lambda t: _toml(t, "checkpoint-every = 2.5\n"), "--checkpoint-every must be an integer"),
    ("toml-bool-from-string", lambda t: _toml(t, 'fedir = "false"\n'),
     'fedir = "false" is a string; expected a boolean (true/false)'),
    ("toml-int-from-bool", lambda t: _toml(t, "steps = true\n"), "steps = true is a boolean; expected an integer"),
    ("toml-str-from-int", lambda t: _toml(t, "out = 5\n"), "out = 5 is an integer; expected a string"),
    ("toml-milestones-strings", lambda t: _toml(t, 'lr-milestones = ["a"]\n'),
     'lr-milestones = ["a"] is an array holding'),
    ("toml-is-a-directory", lambda t: ["--config", str(t)], "is a directory without config.json; expected a TOML file"),
    # topology files
    ("topology-unknown-name", lambda t: ["--topology", "atlantis"], "no topology named 'atlantis'"),
    ("topology-bad-toml", lambda t: _topo(t, "regions = [\n"), "not valid TOML"),
    ("topology-no-source", lambda t: _topo(t, TOPO_OK.replace('source = "illustrative"\n', "")), "`source` is required"),
    ("topology-negative-latency", lambda t: _topo(t, TOPO_OK.replace("latency_ms = 1", "latency_ms = -1")),
     "negative latency"),
    ("topology-zero-bandwidth", lambda t: _topo(t, TOPO_OK.replace("bandwidth_mbps = 10", "bandwidth_mbps = 0")),
     "non-positive bandwidth"),
    ("topology-unknown-region", lambda t: _topo(t, TOPO_OK.replace('placement = "cyclic"', 'placement = ["b"]')),
     "unknown region 'b'"),
    # data directories
    ("data-dir-empty", lambda t: ["--dataset", "mnist", "--data-dir", str(t)], "train-images-idx3-ubyte"),
    ("data-dir-missing", lambda t: ["--dataset", "cifar10", "--data-dir", str(t / "nowhere")], "nowhere"),
    ("data-idx-bad-magic", lambda t: _idx_dir(t, bad_magic=True), "train-images-idx3-ubyte"),
    # checkpoint files
    ("ckpt-garbage", lambda t: _ckpt(t, raw=lambda p, d: b"\x00not a checkpoint" * 50), "ckpt-00000004.pt is corrupt"),
    ("ckpt-truncated", lambda t: _ckpt(t, raw=_truncated), "ckpt-00000004.pt is corrupt"),
    ("ckpt-a-tensor", lambda t: _ckpt(t, raw=_tensor_file), "is not a geodml checkpoint"),
    ("ckpt-other-lr", lambda t: _ckpt(t, argv=["--lr", "0.5"]) and ["--resume"],
     "optim.lr=0.5 but this run has optim.lr=0.02; resume with the same --lr"),
    ("ckpt-future-format", lambda t: _ckpt(t, mutate=lambda d: d.update(format=99)), "has format 99"),
    ("ckpt-incomplete", lambda t: _ckpt(t, mutate=lambda d: d.pop("sampler")), "is incomplete: missing sampler"),
    ("ckpt-wrong-rank", lambda t: _ckpt(t, mutate=lambda d: d.update(rank=3)), "belongs to rank 3, not rank 0"),
    ("ckpt-more-ranks", lambda t: _ckpt(t, rank_dir=1), "checkpoints of rank1"),
    ("ckpt-without-resume", lambda t: _ckpt(t, resume=False), "holds checkpoints of an earlier run; pass --resume"),
    ("resume-finished-run", _summary, "already holds a finished run"),
    # found only when decoded or partitioned: now before any process group (issue 20, class 1)
    ("data-idx-gz-truncated", lambda t: _mnist(t, gz=True, spoil=lambda d: _truncate(d / "train-images-idx3-ubyte.gz")),
     "train-images-idx3-ubyte.gz"),
    ("data-idx-plain-truncated", lambda t: _mnist(t, spoil=lambda d: _truncate(d / "t10k-images-idx3-ubyte")),
     "t10k-images-idx3-ubyte"),
    ("data-label-out-of-range", lambda t: _mnist(t, spoil=_label_10), "holds label 10"),
    ("data-cifar-truncated-pickle", lambda t: _cifar(t, lambda d: _truncate(d / "data_batch_3")),
     "data_batch_3: not a readable CIFAR-10 python batch"),
    ("data-cifar-label-out-of-range", lambda t: _cifar(t, _cifar_label_12), "labels must be in 0..9"),
    ("data-partition-empty", lambda t: _mnist(t, n_train=12) + ["--partition", "shards", "--shards-per-partition", "13"],
     "--shards-per-partition"),
    ("port-taken", _port_taken, "is not free"),
    ("out-through-a-file", lambda t: ["--out", str(t / "run" / "notes.txt" / "sub")], "notes.txt is a file, not a directory"),
    ("out-read-only", lambda t: ["--out", "/sys/geodml-test-run"], "cannot be written: /sys is not writable"),
    ("out-crashed-run", _crashed, "holds an unfinished run (config.json and metrics.jsonl; no summary.json and no "
                                  "checkpoint to resume from): start it again there with --restart, or choose another --out"),
    ("partitions-zero", lambda t: ["--partitions", "0"], "--partitions must be an integer >= 1"),
    ("partition-eval-examples-zero", lambda t: ["--partition-eval-examples", "0"],
     "--partition-eval-examples must be an integer >= 1, got 0"),
    # digits holds 359 test examples: found once decoded, still before any process group
    ("partition-eval-examples-beyond-the-test-set", lambda t: ["--partition-eval-examples", "360"],
     "--partition-eval-examples 360: the test set has 359 examples; choose 1 to 359"),
    ("eval-at-fraction", lambda t: ["--eval-at", "5,7.5"], "--eval-at takes whole step numbers >= 1, got (5.0, 7.5)"),
    ("eval-at-past-the-steps", lambda t: ["--steps", "10", "--eval-at", "4,11"],
     "--eval-at: every step must be within the run's --steps 10, got (4.0, 11.0)"),
    ("channels-last-without-convolutions", lambda t: ["--model", "logreg", "--channels-last"],
     "--channels-last: --model logreg has no convolutions (it applies to cnn, lenet, resnet20, cifar-cnn); leave it out"),
    ("partitions-nccl-on-cpu", lambda t: ["--partitions", "3", "--backend", "nccl"],
     "--backend nccl with --partitions 3 over 1 process(es): hosted partitions train on the CPU unless --device cuda"),
    ("toml-seed-float", lambda t: _toml(t, "seed = 1.5\n"), "seed = 1.5 is a float; expected an integer"),
    ("toml-topology-int", lambda t: _toml(t, "topology = 3\n"), "topology = 3 is an integer; expected a string"),
]


def _snapshot(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_message_and_touches_nothing(case, tmp_path, capsys, monkeypatch):
    _, setup, needle = case
    for var in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_bytes(b"earlier results \x00\x01\x02 keep me\n")
    (out / "metrics.jsonl").write_text('{"step": 2, "train_loss": 1.5}\n')
    extra = setup(tmp_path)
    argv = [*BASE, "--out", str(out), *extra]
    if None in argv:  # "--out None": the case wants no --out at all
        i = argv.index(None)
        del argv[i - 1:i + 1]
        del argv[argv.index("--out"):argv.index("--out") + 2]
    before = _snapshot(out)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("geodml: error:") == 1, err
    assert needle in err, err
    assert "Traceback" not in err
    assert _snapshot(out) == before


def test_table_has_at_least_30_cases_over_every_input_kind():
    kinds = {"flags": 0, "toml": 0, "topology": 0, "data": 0, "ckpt": 0}
    for name, _, _ in CASES:
        kinds[next((k for k in kinds if name.startswith(k)), "flags")] += 1
    assert len(CASES) >= 30 and all(n >= 3 for n in kinds.values()), kinds


@pytest.mark.integration
@pytest.mark.parametrize("what", ["corrupt-checkpoint", "bad-topology"])
def test_torchrun_bad_input_every_rank_exits_2_rank0_prints_once(tmp_path, what):
    from tests.support.procs import run_torchrun
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("keep\n")
    if what == "corrupt-checkpoint":
        for r in range(2):
            p = ck.checkpoint_path(out, r, 8)
            p.parent.mkdir()
            p.write_bytes(b"garbage" * 100)
        extra, needle = ["--resume", "--checkpoint-every", "8"], "rank0/ckpt-00000008.pt is corrupt"
    else:
        extra, needle = _topo(tmp_path, TOPO_OK.replace("latency_ms = 1", "latency_ms = -1")), "negative latency"
    before = _snapshot(out)
    r = run_torchrun(2, [*BASE, "--out", str(out), *extra], timeout_s=120)
    text = r.stdout + r.stderr
    assert r.returncode != 0
    assert text.count("geodml: error:") == 1 and needle in text, text[-3000:]
    assert text.count("exitcode  : 2") == 2 or ("exitcode  : 2" in text and "exitcode  : 1" not in text), text[-3000:]
    assert "Traceback (most recent call last)" not in text.split("geodml: error")[0]
    assert _snapshot(out) == before


# A torchrun environment left in a shell (issue 20, class 3): every process says what is wrong,
# whatever its RANK (there is no trustworthy rank 0), and exits 2; more processes than samples
# is found by partitioning before any process group.
ENV_CASES = [
    ("env-no-master", {"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR and MASTER_PORT are not"),
    ("env-rank-beyond-world", {"RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     "RANK=3 is not in [0, WORLD_SIZE=2)"),
    ("env-world-only", {"WORLD_SIZE": "4"}, "RANK and MASTER_ADDR and MASTER_PORT are not"),
    ("env-rank-not-a-number", {"RANK": "one", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     "must be integers"),
    ("env-local-rank-beyond", {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2",
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "LOCAL_RANK=2 is not in"),
    ("env-fewer-partitions-than-processes", {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                                             "MASTER_PORT": "29500", "GEODML_TEST_ARGV": "--partitions 2"},
     "--partitions 2 is fewer than the 3 processes"),
    ("env-partitions-over-processes-on-nccl", {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                               "MASTER_PORT": "29500", "GEODML_TEST_ARGV": "--partitions 6 --backend nccl"},
     "--backend nccl with --partitions 6 over 2 process(es): hosted partitions train on the CPU unless --device cuda"),
    ("env-more-processes-than-samples", {"RANK": "0", "WORLD_SIZE": "20", "MASTER_ADDR": "127.0.0.1",
                                         "MASTER_PORT": "29500"}, "cannot split 12 samples into 20 partitions"),
]


@pytest.mark.parametrize("case", ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_torchrun_leftovers_and_world_size_are_named(case, tmp_path, capsys, monkeypatch):
    _, env, needle = case
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    extra = env.get("GEODML_TEST_ARGV", "").split()
    for var, value in env.items():
        if var != "GEODML_TEST_ARGV":
            monkeypatch.setenv(var, value)
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("keep\n")
    before = _snapshot(out)
    argv = [*BASE, "--out", str(out), *_mnist(tmp_path, n_train=12), *extra]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("geodml: error:") == 1 and needle in err, err
    assert "Traceback" not in err
    if "MASTER" in needle or "RANK" in needle:
        assert "torchrun" in err and "unset" in err  # says what to do
    assert _snapshot(out) == before


# The same classes under a real torchrun: every rank exits 2, rank 0 prints once.
TORCHRUN_CASES = [
    ("data-truncated-gz", lambda t: _mnist(t, gz=True, spoil=lambda d: _truncate(d / "train-images-idx3-ubyte.gz")),
     "train-images-idx3-ubyte.gz", 2),
    ("port-taken", lambda t: _port_taken(t), "is not free", 2),
    ("more-processes-than-samples", lambda t: _mnist(t, n_train=2), "cannot split 2 samples into 3 partitions", 3),
]


@pytest.mark.integration
@pytest.mark.parametrize("case", TORCHRUN_CASES, ids=[c[0] for c in TORCHRUN_CASES])
def test_torchrun_decode_port_and_size_errors_exit_2_on_every_rank(case, tmp_path):
    from tests.support.procs import run_torchrun
    _, setup, needle, nproc = case
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("keep\n")
    extra = setup(tmp_path)
    before = _snapshot(out)
    r = run_torchrun(nproc, [*BASE, "--out", str(out), *extra], timeout_s=120)
    text = r.stdout + r.stderr
    assert r.returncode != 0
    assert text.count("geodml: error:") == 1 and needle in text, text[-3000:]
    assert text.count("exitcode  : 2") == nproc or ("exitcode  : 2" in text and "exitcode  : 1" not in text), text[-3000:]
    # no rank's traceback (torchrun's agent prints its own ChildFailedError report after the ranks' lines)
    assert "Traceback (most recent call last)" not in text.split("geodml: error")[0]
    assert text.count("Traceback (most recent call last)") <= 1
    assert _snapshot(out) == before


# Rank 0 speaks, but under a torchrun agent a rank that leaves first gets rank 0 stopped (SIGTERM)
# before it prints (CI, stop 44: no message at all). So a rank other than 0 waits for the agent's
# SIGTERM, exits 2 on it, and prints the message itself only if the grace runs out.
_WAITER = """
import sys, types, time
import geodml.cli as cli
real_sleep = time.sleep
def sleep(s):
    print("waiting", flush=True)  # the SIGTERM handler is installed before the wait starts
    real_sleep(s)
cli.time = types.SimpleNamespace(sleep=sleep)
code = cli._bad_input_exit("--metrics-port 9000: port 9001 is not free", False, grace_s=float(sys.argv[1]))
print("returned", code, flush=True)
sys.exit(code)
"""


def _waiter(grace_s: float, agent: bool) -> subprocess.Popen:
    from tests.support.procs import _env
    env = _env()
    env.pop("TORCHELASTIC_RUN_ID", None)
    if agent:
        env["TORCHELASTIC_RUN_ID"] = "test"
    return subprocess.Popen([sys.executable, "-c", _WAITER, str(grace_s)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


@pytest.mark.integration
def test_a_rank_other_than_0_waits_for_the_agents_sigterm_and_exits_2_silently():
    proc = _waiter(60.0, agent=True)
    try:
        assert proc.stdout.readline() == "waiting\n"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 2 and time.monotonic() - t0 < 30
    assert "geodml: error:" not in err and "returned" not in out and "Traceback" not in err, err


@pytest.mark.integration
def test_a_rank_other_than_0_not_stopped_within_the_grace_prints_the_message_once():
    proc = _waiter(0.2, agent=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2 and out == "waiting\nreturned 2\n"
    assert err.count("geodml: error:") == 1 and "port 9001 is not free" in err, err


def test_without_an_agent_a_rank_other_than_0_leaves_at_once_silent_and_rank_0_speaks(capsys, monkeypatch):
    from geodml.cli import _bad_input_exit
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    t0 = time.monotonic()
    assert _bad_input_exit("bad", False, grace_s=60.0) == 2
    assert time.monotonic() - t0 < 5 and capsys.readouterr().err == ""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    assert _bad_input_exit("bad", True, grace_s=60.0) == 2  # rank 0 never waits
    assert capsys.readouterr().err.count("geodml: error: bad\n") == 1
