"""--divergence-loss LOSS: a run whose mean training loss at a log line is NaN, infinite or above
LOSS ends there (every partition at the same step), with the final evaluation and summary.json
(``diverged_at_step``) written as usual. Checked against independent references: the stopped run
equals a plain run of that many steps, and a run that never crosses the limit equals one without it."""

from __future__ import annotations

import json
import math

import pytest
import torch

from geodml.cli import main
from geodml.trainer import diverged

# FedAvg on digits, 3 partitions, 60 steps; at lr 1e4 the mean loss at the first log line (step 5) is 1.3e6
BASE = ["--dataset", "digits", "--model", "logreg", "--partition", "label", "--eval-every", "20", "--log-every", "5",
        "--no-progress", "--wan", "virtual", "--partitions", "3", "--algo", "fedavg", "--iter-local", "5"]
SAME = ("final_val_accuracy", "final_val_loss", "final_train_loss", "wan_bytes_total", "wan_bytes_by_link",
        "wan_bytes_by_kind", "messages_total", "steps", "epochs", "per_rank_val_accuracy", "per_rank_train_accuracy",
        "bsp_equivalent_wan_bytes")


def test_diverged_by_hand():
    assert diverged(30.0, 10.0, 5.0) is False      # mean 3 <= 5
    assert diverged(60.0, 10.0, 5.0) is True       # mean 6 > 5
    assert diverged(50.0, 10.0, 5.0) is False      # the limit itself is not above it
    assert diverged(math.nan, 10.0, math.inf) is True and diverged(math.inf, 10.0, math.inf) is True
    assert diverged(1e300, 10.0, math.inf) is False  # finite: only NaN and inf stop a run at LOSS inf
    assert diverged(0.0, 0.0, 5.0) is False and diverged(math.nan, 0.0, 5.0) is True  # no step counted


def _run(out, *extra):
    assert main([*BASE, *extra, "--out", str(out)]) == 0
    return json.loads((out / "summary.json").read_text())


def _models_equal(a, b, parts=3):
    for f in ["model.pt", *(f"rank{k}/model.pt" for k in range(parts))]:
        x, y = torch.load(a / f), torch.load(b / f)
        assert all(torch.equal(x[n], y[n]) for n in x), f


# (extra flags, the step the run stops after): the first line above 1e6 (step 5, a round boundary); with client
# sampling (4 partitions, 2 a round) at a round boundary, where the next round has not begun; mid-round (rounds of
# 10: the partial round is averaged); the second line (step 5's mean, 1.3e6, is under 1e7; step 10's, over 6 steps
# 6-10 alone, 1.4e8, is above it: the window restarts at every line)
STOPS = {"boundary": ([], 5), "sampled": (["--partitions", "4", "--client-fraction", "0.5"], 5),
         "mid-round": (["--iter-local", "10"], 5), "second-line": (["--divergence-loss", "1e7"], 10)}


@pytest.mark.parametrize("case", list(STOPS))
def test_a_diverging_run_stops_at_the_first_log_line_above_the_limit(case, tmp_path):
    """lr 1e4 makes the mean loss grow about 100x every 5 steps. The 60-step run ends after the first log
    step whose mean loss since the line before is above the limit, and equals a plain run of that many
    steps (weights of the global model and every partition, bytes, messages, accuracies, losses) but for
    diverged_at_step; its metrics.jsonl ends with that step's line, with the final evaluation. Without
    the flag it runs all 60."""
    extra, at = STOPS[case]
    parts = 4 if "--partitions" in extra else 3
    stopped = _run(tmp_path / "stopped", "--lr", "1e4", "--steps", "60", "--divergence-loss", "1e6",
                   *extra)
    short = _run(tmp_path / "short", "--lr", "1e4", "--steps", str(at),
                 *[x for x in extra if x != "1e7" and x != "--divergence-loss"])
    assert stopped["diverged_at_step"] == at and short["diverged_at_step"] is None
    assert stopped["final_train_loss"] > (1e7 if case == "second-line" else 1e6)
    for key in SAME:
        assert stopped[key] == short[key], key
    _models_equal(tmp_path / "stopped", tmp_path / "short", parts)
    lines = [json.loads(x) for x in (tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(5, at + 1, 5)) and "val_accuracy" in lines[-1]
    if case == "boundary":
        full = _run(tmp_path / "full", "--lr", "1e4", "--steps", "60")
        assert full["steps"] == 60 and full["diverged_at_step"] is None and full["final_train_loss"] > 1e20


def test_a_run_below_the_limit_is_unchanged(tmp_path):
    """At lr 0.05 the loss stays below 100: --divergence-loss 100 changes no bit of the run."""
    plain = _run(tmp_path / "plain", "--lr", "0.05", "--steps", "30")
    watched = _run(tmp_path / "watched", "--lr", "0.05", "--steps", "30", "--divergence-loss", "100")
    assert watched["diverged_at_step"] is None and watched["steps"] == 30
    for key in SAME:
        assert plain[key] == watched[key], key
    _models_equal(tmp_path / "plain", tmp_path / "watched")


def test_nan_stops_a_run_at_limit_inf(tmp_path, capsys):
    """Gaia on an MLP at lr 1e6 turns the loss NaN by step 5; --divergence-loss inf stops there and says so."""
    s = _run(tmp_path / "nan", "--model", "mlp", "--algo", "gaia", "--t0", "0.01", "--lr", "1e6", "--steps", "60",
             "--divergence-loss", "inf")
    assert s["diverged_at_step"] == 5 and s["steps"] == 5 and math.isnan(s["final_train_loss"])
    assert "stopped after step 5: the mean training loss since the log line before, nan, is NaN" in capsys.readouterr().out


@pytest.mark.integration
def test_every_process_stops_at_the_same_step_under_torchrun(tmp_path, monkeypatch):
    """Two processes of 3 and 3 partitions (gloo between the processes): both leave the loop
    after step 5 and the run ends normally with the same summary as the one-process run."""
    from tests.support.procs import run_torchrun
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    argv = [*BASE[:-6], "--partitions", "6", "--algo", "fedavg", "--iter-local", "5", "--lr", "1e4", "--steps", "60",
            "--divergence-loss", "1e6"]
    one = tmp_path / "one"
    assert main([*argv, "--out", str(one)]) == 0
    r = run_torchrun(2, [*argv, "--out", str(tmp_path / "two")], timeout_s=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "stopped after step 5" in r.stdout
    a, b = (json.loads((d / "summary.json").read_text()) for d in (one, tmp_path / "two"))
    assert b["diverged_at_step"] == 5
    for key in SAME:
        assert a[key] == b[key], key
