"""Compressed exchange (issue 67 item 3: --compress powersgd|qsgd|int8|int4 for BSP's gradients and FedAvg's
upload; geodml/algorithms/codecs.py, compressed.py, fedcompress.py): payload sizes and codes by hand, QSGD's
unbiasedness, PowerSGD against an independent numpy replay of torch's powerSGD_hook, bytes of whole runs by
hand, the lossless limits, hosting, checkpoints and flags."""

from __future__ import annotations

import json
import math
import shutil
import sys

import numpy as np
import pytest
import torch
from torch import nn

import geodml
from geodml.algorithms.base import AlgoContext, FlatParams
from geodml.algorithms.codecs import QSGD, BlockQuant, Matrix, powersgd_layout
from geodml.algorithms.compressed import Compressor
from geodml.cli import parse_config
from geodml.comm.wire import envelope_nbytes
from tests.support.inprocess import run_threads
from tests.support.procs import run_command

N = 188_810          # the digits cnn's parameters
CNN = [(32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (512, 256), (512,), (10, 512), (10,)]
BASE = ["--dataset", "digits", "--no-progress", "--eval-every", "10"]


def _model(out):
    return torch.load(out / "model.pt", map_location="cpu", weights_only=True)


# ---- payloads by hand ---------------------------------------------------------------------------
def test_payload_sizes_by_hand():
    """The cnn's 188,810 floats: int8 = 2,951 block scales (ceil(188810 / 64)) x 4 B + one byte an entry; int4 =
    the scales + 94,405 B (two entries a byte); QSGD s = 16: 369 bucket norms (ceil(188810 / 512)) x 4 B +
    ceil(188810 x 6 / 8) (levels -16..16: 33 values, 6 bits); s = 4: 9 values, 4 bits."""
    assert BlockQuant(8).nbytes(N) == 2951 * 4 + 188_810 == 200_614
    assert BlockQuant(4).nbytes(N) == 2951 * 4 + 94_405 == 106_209
    assert QSGD(16).nbytes(N) == 369 * 4 + 141_608 == 143_084
    assert QSGD(4).nbytes(N) == 369 * 4 + 94_405 == 95_881
    assert QSGD(1).bits == 2 and QSGD(127).bits == 8 and QSGD(128).bits == 9


def test_powersgd_layout_by_hand():
    """torch's rule, n m >= 2 (n + m) r': at r = 1 every weight matrix is compressed (conv1 32 x 25, conv2
    64 x 800, fc1 512 x 256, fc2 10 x 512) and the biases go raw; at r = 10 conv1 (800 < 2 x 57 x 10) and fc2
    (5,120 < 10,440) go raw too."""
    m1, plain1 = powersgd_layout(CNN, 1)
    assert m1 == [Matrix(0, 32, 25, 1), Matrix(832, 64, 800, 1), Matrix(52_096, 512, 256, 1),
                  Matrix(183_680, 10, 512, 1)]
    assert plain1 == [(800, 32), (52_032, 64), (183_168, 512), (188_800, 10)]
    m10, plain10 = powersgd_layout(CNN, 10)
    assert [(m.rows, m.cols, m.rank) for m in m10] == [(64, 800, 10), (512, 256, 10)]
    assert sum(n for _, n in plain10) == 832 + 64 + 512 + 5130


def test_block_quantization_codes_by_hand():
    """One block [1, -0.5, 0.25, 0.3]: int8 scale 1/127, codes round(x 127) = 127, -64 (-63.5, ties to even),
    32 (31.75), 38 (38.1); int4 scale 1/7, codes 7, -4 (-3.5), 2 (1.75), 2 (2.1), stored q + 8 = 15, 4, 10, 10
    as the bytes 0xF4, 0xAA. Three entries: the odd one padded with the nibble 8."""
    x = np.array([1.0, -0.5, 0.25, 0.3], np.float32)
    for bits, qmax, codes in ((8, 127, [127, -64, 32, 38]), (4, 7, [7, -4, 2, 2])):
        c = BlockQuant(bits)
        out = np.zeros(c.nbytes(4), np.uint8)
        c.encode(x, out)
        assert out[:4].view(np.float32)[0] == np.float32(1.0) / np.float32(qmax)
        dec = np.zeros(4, np.float32)
        c.decode_add(out, dec)
        np.testing.assert_allclose(dec, np.array(codes, np.float32) * (np.float32(1) / np.float32(qmax)), rtol=1e-6)
    c = BlockQuant(4)
    out = np.zeros(c.nbytes(4), np.uint8)
    c.encode(x, out)
    assert list(out[4:]) == [0xF4, 0xAA]
    out3 = np.zeros(c.nbytes(3), np.uint8)
    c.encode(x[:3], out3)
    assert c.nbytes(3) == 4 + 2 and list(out3[4:]) == [0xF4, 0xA8]


def test_qsgd_by_hand_and_unbiased():
    """x = (3, -4), s = 1: ||x|| = 5, so entry 1 is 5 with probability 0.6 (else 0) and entry 2 is -5 with
    probability 0.8: every decoding is in {0, 5} x {0, -5}, and the mean of 20,000 (sd 5 sqrt(p (1 - p)) /
    sqrt(20,000) <= 0.018 per entry) is x within 0.08 (4.5 sd)."""
    q = QSGD(1)
    rng = np.random.default_rng(0)
    x = np.array([3.0, -4.0], np.float32)
    total = np.zeros(2)
    seen = set()
    for _ in range(20_000):
        out = np.zeros(q.nbytes(2), np.uint8)
        q.encode(x, out, rng)
        dec = np.zeros(2, np.float32)
        q.decode_add(out, dec)
        seen.add(tuple(dec.tolist()))
        total += dec
    assert seen <= {(0.0, 0.0), (5.0, 0.0), (0.0, -5.0), (5.0, -5.0)} and len(seen) == 4
    np.testing.assert_allclose(total / 20_000, x, atol=0.08)
    big = QSGD(2**15)                      # the error bound: |x_i - decoded_i| <= ||bucket|| / s
    y = np.random.default_rng(1).normal(size=1000).astype(np.float32)
    out = np.zeros(big.nbytes(1000), np.uint8)
    big.encode(y, out, rng)
    dec = np.zeros(1000, np.float32)
    big.decode_add(out, dec)
    for b in range(2):
        seg = slice(512 * b, min(512 * (b + 1), 1000))
        assert np.abs(dec[seg] - y[seg]).max() <= np.linalg.norm(y[seg]) / 2**15 * 1.001


# ---- PowerSGD against numpy -----------------------------------------------------------------------
def _numpy_powersgd(grads, q0, shapes, rank, steps):
    """torch's powerSGD_hook (warm start, error feedback, mean), replayed in numpy for K ranks: per matrix
    M_i = g_i + e_i, P = sum_i M_i Q, Gram-Schmidt on P's columns, Q = sum_i M_i^T P / K, g = P Q^T,
    e_i = M_i - P Q^T; the other parameters averaged exactly."""
    mats, plain = powersgd_layout(shapes, rank)
    k = len(grads[0])
    n = sum(math.prod(s) for s in shapes)
    err = [np.zeros(n) for _ in range(k)]
    qs = [q.copy() for q in q0]
    outs = []
    for step in range(steps):
        g = [grads[step][i].astype(np.float64) for i in range(k)]
        out = np.zeros(n)
        for off, num in plain:
            out[off:off + num] = sum(gi[off:off + num] for gi in g) / k
        for j, m in enumerate(mats):
            span = slice(m.offset, m.offset + m.rows * m.cols)
            big_m = [(g[i][span] + err[i][span]).reshape(m.rows, m.cols) for i in range(k)]
            p = sum(bm @ qs[j] for bm in big_m)
            for c in range(p.shape[1]):
                p[:, c] /= np.linalg.norm(p[:, c]) + 1e-8
                p[:, c + 1:] -= (p[:, c:c + 1] * p[:, c + 1:]).sum(axis=0, keepdims=True) * p[:, c:c + 1]
            qs[j] = sum(bm.T @ p for bm in big_m) / k
            est = p @ qs[j].T
            out[span] = est.reshape(-1)
            for i in range(k):
                err[i][span] = (big_m[i] - est).reshape(-1)
        outs.append(out)
    return outs


def test_powersgd_against_a_numpy_replay_of_torchs_hook():
    """3 ranks, a model of two linear layers (8 x 12 compressed at r = 2: 96 >= 2 x 20 x 2; 2 x 8 and the biases
    raw: 16 < 2 x 10 x 2), 4 steps of random gradients: every rank ends each step with the numpy replay's mean
    estimate, bit-identical on every rank."""
    shapes = [(8, 12), (8,), (2, 8), (2,)]
    rng = np.random.default_rng(3)
    grads = [[rng.normal(size=122).astype(np.float32) for _ in range(3)] for _ in range(4)]
    q0 = []

    def fn(rank, comm):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(12, 8), nn.Linear(8, 2))
        flat = FlatParams(model)
        ctx = AlgoContext(rank=rank, world_size=3, seed=5, steps_per_epoch=10, total_steps=4, batch_size=4,
                          label_counts=np.ones((3, 1), dtype=np.int64))
        c = Compressor("powersgd", flat=flat, comm=comm, ctx=ctx, rank=2)
        if rank == 0:
            q0.append(c.q.view(12, 2).double().numpy().copy())
        got = []
        for step in range(4):
            flat.grad.copy_(torch.from_numpy(grads[step][rank]))
            c.mean(flat.grad)
            got.append(flat.grad.double().numpy().copy())
        return got

    got = run_threads(3, fn)
    want = _numpy_powersgd(grads, q0, shapes, 2, 4)
    for rank in range(3):
        for step in range(4):
            np.testing.assert_allclose(got[rank][step], want[step], rtol=1e-4, atol=1e-5)
    assert all(np.array_equal(got[0][s], got[r][s]) for r in (1, 2) for s in range(4))


# ---- runs -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("codec", "extra", "per_rank_step"), [
    ("int8", [], 200_614), ("int4", [], 106_209), ("qsgd", ["--compress-levels", "16"], 143_084),
    ("powersgd", ["--compress-rank", "1"], None)])
def test_bsp_bytes_by_hand(tmp_path, codec, extra, per_rank_step):
    """K = 3, 10 steps. The quantizers all-gather one payload a step: each rank sends K - 1 = 2 payloads.
    PowerSGD r = 1 all-reduces (ring: 2 (K - 1) / K of each vector per rank, in floats: the sent counts of
    geodml's ring) the 618 raw bias floats, P (618 floats) and Q (25 + 800 + 256 + 512 = 1,593)."""
    r = geodml.run(["--algo", "bsp", "--compress", codec, *extra, "--partitions", "3", "--steps", "10", *BASE,
                    "--out", str(tmp_path / "r")])
    if per_rank_step is not None:
        assert r.summary["wan_bytes_total"] == 10 * 3 * 2 * per_rank_step
    else:
        from geodml.comm.collectives import ring_allreduce_sent_elements
        per_step = sum(4 * sum(ring_allreduce_sent_elements(v, 3, k)) for v in (618, 618, 1593) for k in range(3))
        assert r.summary["wan_bytes_total"] == 10 * per_step


def test_lossless_limits(tmp_path):
    """PowerSGD at a rank where no matrix pays off (torch's rule sends every parameter raw) is BSP bit for bit;
    QSGD with s = 32,768 levels is BSP within its bound (per entry ||bucket|| / s) for 10 steps; FedAvg's
    int8 upload is FedAvg within 2e-3 after 2 rounds."""
    args = ["--partitions", "2", "--steps", "10", *BASE]
    bsp = geodml.run(["--algo", "bsp", *args, "--out", str(tmp_path / "bsp")])
    full = geodml.run(["--algo", "bsp", "--compress", "powersgd", "--compress-rank", "1000", *args,
                       "--out", str(tmp_path / "p")])
    mb, mp = _model(bsp.out), _model(full.out)
    assert all(torch.equal(mb[k], mp[k]) for k in mb)
    q = geodml.run(["--algo", "bsp", "--compress", "qsgd", "--compress-levels", "32768", *args,
                    "--out", str(tmp_path / "q")])
    mq = _model(q.out)
    for k in mb:
        torch.testing.assert_close(mq[k], mb[k], rtol=0, atol=2e-4)
    fa = ["--algo", "fedavg", "--iter-local", "10", "--partitions", "4", "--steps", "20", *BASE]
    f = geodml.run([*fa, "--out", str(tmp_path / "f")])
    f8 = geodml.run([*fa, "--compress", "int8", "--out", str(tmp_path / "f8")])
    mf, m8 = _model(f.out), _model(f8.out)
    for k in mf:
        torch.testing.assert_close(m8[k], mf[k], rtol=0, atol=2e-3)


def test_fedavg_upload_bytes_by_hand_and_hosted_poisoned(tmp_path, monkeypatch):
    """K = 4, Iter_Local 10, 40 steps, --compress int8: each round the 3 non-leaders upload a 200,614 B payload to
    rank 0 and download the 755,240 B raw sum (kind model, tag 2t), each message with its envelope. The 4
    partitions hosted in one process give the same run with the shared scratch poisoned at every switch."""
    args = ["--algo", "fedavg", "--iter-local", "10", "--compress", "int8", "--partitions", "4", "--steps", "40", *BASE]
    r = geodml.run([*args, "--out", str(tmp_path / "r")])
    up = sum(200_614 + envelope_nbytes("model", 2 * t, s, [np.zeros(200_614, np.uint8)]) for t in range(4)
             for s in (1, 2, 3))
    down = sum(4 * N + envelope_nbytes("model", 2 * t, 0, [np.zeros(N, np.float32)]) for t in range(4) for _ in range(3))
    assert r.summary["wan_bytes_total"] == up + down
    monkeypatch.setenv("GEODML_POISON_SCRATCH", "1")
    p = geodml.run([*args, "--out", str(tmp_path / "p")])
    a, b = _model(r.out), _model(p.out)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("algo", [["--algo", "bsp", "--compress", "qsgd"],
                                  ["--algo", "bsp", "--compress", "powersgd", "--compress-rank", "2"],
                                  ["--algo", "fedavg", "--iter-local", "5", "--compress", "powersgd"],
                                  ["--algo", "fedavg", "--iter-local", "5", "--client-fraction", "0.5",
                                   "--compress", "qsgd"]])
def test_checkpoint_resume_is_bit_identical(tmp_path, algo):
    args = [*algo, "--partitions", "4", "--steps", "30", "--checkpoint-every", "15", *BASE]
    full = geodml.run([*args, "--out", str(tmp_path / "full")])
    cut = tmp_path / "cut"
    shutil.copytree(full.out, cut)
    for p in [cut / "summary.json", *cut.glob("**/model.pt")]:
        p.unlink()
    resumed = geodml.run([*args, "--out", str(cut), "--resume"])
    a, b = _model(full.out), _model(resumed.out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.summary["wan_bytes_total"] == full.summary["wan_bytes_total"]


@pytest.mark.integration
def test_one_and_two_processes_give_the_same_run(tmp_path):
    env = {"OMP_NUM_THREADS": "1"}
    for name, algo in (("p", ["--algo", "bsp", "--compress", "powersgd", "--compress-rank", "2"]),
                       ("q", ["--algo", "fedavg", "--iter-local", "5", "--client-fraction", "0.5", "--compress", "qsgd"])):
        for procs in ("1", "2"):
            cmd = [sys.executable, "-m", "geodml", *algo, "--partitions", "4", "--steps", "20", *BASE,
                   "--processes", procs, "--out", str(tmp_path / f"{name}{procs}")]
            r = run_command(cmd, timeout_s=240, env=env)
            assert r.returncode == 0, r.stderr[-2000:]
        a, b = _model(tmp_path / f"{name}1"), _model(tmp_path / f"{name}2")
        assert all(torch.equal(a[k], b[k]) for k in a), name
        s1, s2 = (json.loads((tmp_path / f"{name}{d}" / "summary.json").read_text()) for d in ("1", "2"))
        assert s1["wan_bytes_total"] == s2["wan_bytes_total"], name


@pytest.mark.parametrize(("args", "message"), [
    (["--algo", "gaia", "--compress", "int8"], r"--compress int8: compresses BSP's gradients or FedAvg's upload"),
    (["--algo", "fedavg", "--compress", "powersgd", "--client-fraction", "0.5"], r"needs --client-fraction 1"),
    (["--compress", "int5"], r"--compress: choose one of none, powersgd, qsgd, int8, int4|invalid choice"),
    (["--compress", "qsgd", "--compress-levels", "0"], r"--compress-levels must be an integer in \[1, 32768\]"),
    (["--compress", "powersgd", "--compress-rank", "0"], r"--compress-rank must be an integer >= 1"),
])
def test_bad_options_are_one_clear_error(args, message):
    with pytest.raises(ValueError, match=message):
        parse_config(args)
