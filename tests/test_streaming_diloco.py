"""Streaming DiLoCo (issue 67 item 2, geodml/algorithms/streaming_diloco.py): the E3M0 codes by hand, DiLoCo
bit for bit in the degenerate setting, the fragment schedule's bytes by hand (32 and 4 bits), the overlap on
the emulated clock, resume with messages in flight, 1 vs 2 processes, flags."""

from __future__ import annotations

import json
import math
import shutil
import sys

import numpy as np
import pytest
import torch

import geodml
from geodml.algorithms.codecs import E3M0
from geodml.cli import parse_config
from geodml.comm.wire import envelope_nbytes
from tests.support.procs import run_command

N = 188_810
FRAG = (832 + 131_584, 51_264 + 5_130)   # the cnn's layers in 2 fragments: (conv1, fc1), (conv2, fc2)
BASE = ["--dataset", "digits", "--no-progress", "--eval-every", "20", "--lr", "0.001"]


def _model(out):
    return torch.load(out / "model.pt", map_location="cpu", weights_only=True)


def test_e3m0_codes_by_hand():
    """Block max 1: magnitudes 0, 2^-6 .. 2^0; 0.3 -> 0.25 (nearer than 0.5), 0.74 -> 0.5, 0.76 -> 1, 0.01 -> 2^-6
    (above 2^-7, the midpoint to 0), 0.007 -> 0. Codes sign << 3 | e: 1 -> 7, -0.5 -> 8 | 6 = 14, packed two a byte."""
    c = E3M0()
    x = np.array([1.0, -0.5, 0.3, 0.74, -0.76, 0.01, 0.007], np.float32)
    out = np.zeros(c.nbytes(7), np.uint8)
    c.encode(x, out)
    assert c.nbytes(7) == 4 + 4 and out[:4].view(np.float32)[0] == 1.0
    assert out[4] == (7 << 4) | 14
    dec = np.zeros(7, np.float32)
    c.decode_add(out, dec)
    assert dec.tolist() == [1.0, -0.5, 0.25, 0.5, -1.0, 2.0 ** -6, 0.0]
    assert c.nbytes(N) == 4 * math.ceil(N / 64) + N // 2


def test_one_fragment_no_overlap_full_precision_is_diloco(tmp_path):
    """--fragments 1 --overlap-steps 0 --mixing-alpha 0 --outer-bits 32 is DiLoCo: the same models bit for bit (the
    K contributions theta - theta_k, each times 1/K, summed in rank order, then the same outer step). Bytes: the
    same payload, 2 (K - 1) n floats a sync (a star through rank 0 instead of a ring); the difference is the
    star's message envelopes."""
    args = ["--inner-steps", "10", "--partitions", "4", "--steps", "40", *BASE]
    d = geodml.run(["--algo", "diloco", *args, "--out", str(tmp_path / "d")])
    s = geodml.run(["--algo", "streaming-diloco", "--fragments", "1", "--overlap-steps", "0", "--mixing-alpha", "0",
                    "--outer-bits", "32", *args, "--out", str(tmp_path / "s")])
    a, b = _model(d.out), _model(s.out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    z = [np.zeros(N, np.float32)]
    envelopes = sum(envelope_nbytes("model", t, src, z) for t in (10, 20, 30, 40) for src in (1, 2, 3)) + \
        sum(envelope_nbytes("model", t, 0, z) for t in (10, 20, 30, 40)) * 3
    assert s.summary["wan_bytes_total"] - d.summary["wan_bytes_total"] == envelopes
    assert s.summary["final_model"] == "global"


@pytest.mark.parametrize("bits", [32, 4])
def test_fragment_schedule_bytes_by_hand(tmp_path, bits):
    """2 fragments, H = 10, K = 3, 30 steps: fragment 0 syncs after steps 10, 20, 30 and fragment 1 after 5, 15, 25
    (offset H/2). Each sync: 2 workers upload their fragment to rank 0 and rank 0 sends the sum to both: 4 messages
    of the fragment (float32: 4 x its floats; 4 bits: E3M0, 4 ceil(n/64) + ceil(n/2) bytes) plus envelopes."""
    r = geodml.run(["--algo", "streaming-diloco", "--inner-steps", "10", "--fragments", "2", "--overlap-steps", "2",
                    "--outer-bits", str(bits), "--partitions", "3", "--steps", "30", *BASE, "--out", str(tmp_path / "r")])
    total = 0
    for p, tags in ((0, (10, 20, 30)), (1, (5, 15, 25))):
        n = FRAG[p]
        arr = [np.zeros(n, np.float32)] if bits == 32 else [np.zeros(E3M0().nbytes(n), np.uint8)]
        size = arr[0].nbytes
        for t in tags:
            total += sum(size + envelope_nbytes("model", t, src, arr) for src in (1, 2))
            total += 2 * (size + envelope_nbytes("model", t, 0, arr))
    assert r.summary["wan_bytes_total"] == total
    assert r.metrics[-1]["diloco_outer_steps"] == 6
    assert r.summary["final_val_accuracy"] > 0.5


def test_overlap_hides_the_transfer_on_the_emulated_clock(tmp_path):
    """Each step costs 0.05 s of emulated compute; a fragment's transfer (~0.1 s on five-continents' 100 Mbit/s)
    is waited for at once with tau = 0 and hidden behind 4 inner steps with tau = 4: the same bytes, less time."""
    args = ["--algo", "streaming-diloco", "--inner-steps", "10", "--fragments", "2", "--partitions", "5",
            "--topology", "five-continents", "--wan", "virtual", "--compute-s-per-step", "0.05", "--steps", "40", *BASE]
    t0 = geodml.run([*args, "--overlap-steps", "0", "--out", str(tmp_path / "t0")])
    t4 = geodml.run([*args, "--overlap-steps", "4", "--out", str(tmp_path / "t4")])
    assert t0.summary["wan_bytes_total"] == t4.summary["wan_bytes_total"]
    assert t4.summary["emulated_seconds"] < t0.summary["emulated_seconds"]
    assert set(t4.summary["wan_peak_bps_by_link"]) >= {"africa->americas", "americas->africa"}


@pytest.mark.parametrize(("every", "steps"), [(16, 20), (6, 20)])
def test_checkpoint_resume_with_messages_in_flight_is_bit_identical(tmp_path, every, steps):
    """H = 10, 2 fragments, tau = 4: fragment 1 is sent after step 15, summed by rank 0 after 17, merged after 19.
    A checkpoint after step 16 holds the uploads in flight; one after step 18 holds rank 0's sum in flight. The run
    resumed from the last checkpoint has the same models and bytes."""
    args = ["--algo", "streaming-diloco", "--inner-steps", "10", "--fragments", "2", "--overlap-steps", "4",
            "--partitions", "4", "--steps", str(steps), "--checkpoint-every", str(every), *BASE]
    full = geodml.run([*args, "--out", str(tmp_path / "full")])
    cut = tmp_path / "cut"
    shutil.copytree(full.out, cut)
    for p in [cut / "summary.json", *cut.glob("**/model.pt")]:
        p.unlink()
    resumed = geodml.run([*args, "--out", str(cut), "--resume"])
    a, b = _model(full.out), _model(resumed.out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.summary["wan_bytes_total"] == full.summary["wan_bytes_total"]
    assert resumed.summary["per_rank_val_accuracy"] == full.summary["per_rank_val_accuracy"]


@pytest.mark.integration
def test_one_and_two_processes_give_the_same_run(tmp_path):
    cmd = [sys.executable, "-m", "geodml", "--algo", "streaming-diloco", "--inner-steps", "10", "--fragments", "2",
           "--overlap-steps", "3", "--partitions", "4", "--steps", "30", *BASE]
    env = {"OMP_NUM_THREADS": "1"}
    for procs in ("1", "2"):
        r = run_command([*cmd, "--processes", procs, "--out", str(tmp_path / procs)], timeout_s=240, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
    a, b = _model(tmp_path / "1"), _model(tmp_path / "2")
    assert all(torch.equal(a[k], b[k]) for k in a)
    s1, s2 = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("1", "2"))
    assert s1["wan_bytes_by_link"] == s2["wan_bytes_by_link"] and s1["per_rank_val_accuracy"] == s2["per_rank_val_accuracy"]


@pytest.mark.parametrize(("args", "message"), [
    (["--fragments", "0"], r"--fragments must be an integer >= 1"),
    (["--inner-steps", "4", "--fragments", "5"], r"--fragments 5 is more than --inner-steps 4"),
    (["--overlap-steps", "100"], r"--overlap-steps must be an integer in \[0, --inner-steps\)"),
    (["--mixing-alpha", "1"], r"--mixing-alpha must be in \[0, 1\)"),
    (["--outer-bits", "8"], r"--outer-bits: choose 4 or 32"),
    (["--client-fraction", "0.5"], r"--client-fraction: every Streaming DiLoCo worker"),
])
def test_bad_options_are_one_clear_error(args, message):
    with pytest.raises(ValueError, match=message):
        parse_config(["--algo", "streaming-diloco", *args])
