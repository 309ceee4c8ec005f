"""Settings valid one by one that leave a run unable to measure what it prints (geodml/advice.py,
geodml.cli): each gives one warning line before training, on the CLI and as a SettingWarning."""

from __future__ import annotations

import sys
import warnings

import pytest

import geodml
from tests.support.procs import run_command

BASE = ["--dataset", "digits", "--partitions", "2", "--no-progress"]


def _warned(args, tmp_path, name="r"):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        geodml.run([*BASE, *args, "--out", str(tmp_path / name)])
    return [str(w.message) for w in got if issubclass(w.category, geodml.SettingWarning)]


def test_a_run_shorter_than_one_round(tmp_path):
    got = _warned(["--algo", "fedavg", "--iter-local", "20", "--steps", "10"], tmp_path)
    assert "the run is 10 steps, shorter than one fedavg round of 20 steps: the models are averaged once, at the " \
           "end (lengthen the run or shorten the round)" in got
    got = _warned(["--algo", "diloco", "--inner-steps", "30", "--steps", "10", "--lr", "0.001"], tmp_path, "d")
    assert any("shorter than one diloco round of 30 steps" in m for m in got)
    assert not any("round" in m for m in _warned(["--algo", "fedavg", "--iter-local", "5", "--steps", "10"], tmp_path,
                                                   "ok"))


def test_eval_every_longer_than_the_run_and_empty_regions(tmp_path):
    got = _warned(["--algo", "bsp", "--steps", "10", "--eval-every", "50", "--topology", "five-continents"], tmp_path)
    assert "--eval-every 50 is longer than the run (10 steps): the accuracy curve is the final validation alone" in got
    assert ("--topology has 5 regions but the 2 partitions are placed in 2: asia, europe, oceania hold no data and "
            "their links carry nothing") in got
    assert _warned(["--algo", "bsp", "--steps", "10", "--eval-every", "5"], tmp_path, "quiet") == []


def test_gaia_and_dgc_at_the_default_learning_rate(tmp_path):
    got = _warned(["--algo", "gaia", "--steps", "4"], tmp_path)
    assert any(m.startswith("--algo gaia applies the sum of the partitions' updates: at the default --lr 0.02") for m in got)
    assert not any("applies the sum" in m for m in _warned(["--algo", "dgc", "--lr", "0.01", "--steps", "4"], tmp_path,
                                                           "given"))


def test_resume_without_a_checkpoint_says_it_starts_afresh(tmp_path):
    got = _warned(["--algo", "bsp", "--steps", "4", "--resume"], tmp_path)
    assert f"--resume: no checkpoint in --out {tmp_path / 'r'}: the run starts afresh" in got


@pytest.mark.integration
def test_the_cli_prints_one_line_each_before_training(tmp_path):
    r = run_command([sys.executable, "-m", "geodml", "--algo", "fedavg", "--iter-local", "20", *BASE, "--steps", "10",
                     "--eval-every", "50", "--processes", "1", "--out", str(tmp_path / "r")], timeout_s=120,
                    env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.startswith("geodml: warning:")]
    assert len(lines) == 2 and "shorter than one fedavg round" in lines[0] and "--eval-every 50" in lines[1]
