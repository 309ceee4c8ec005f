"""--rounds R (training length in FedAvg rounds) and --eval-every-rounds N: the rounds' lengths by
hand, a run that ends on its R-th average and validates at every round's end, bit-identical to the
same run given in steps, and the configuration errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from geodml.algorithms.fedavg import round_steps
from geodml.cli import main
from geodml.config import AlgoConfig, FedAvgConfig, OptimConfig, RunConfig, SkewScoutConfig

SIZES = np.array([209, 489, 360, 380])


def test_round_steps_by_hand():
    """B = 20, E = 0.5: ceil(0.5 n_k / 20) = ceil(5.225, 12.225, 9, 9.5) = 6, 13, 9, 10 local steps."""
    kw = dict(seed=3, batch_size=20, iter_local=7)
    assert round_steps(SIZES, rounds=3, client_fraction=1.0, local_epochs=0.5, **kw) == [13, 13, 13]
    assert round_steps(SIZES, rounds=2, client_fraction=0.5, **kw) == [7, 7]              # Iter_Local
    assert round_steps(SIZES, rounds=2, client_fraction=0.5, virtual_client_size=50, **kw) == [3, 3]  # FedVC
    # m = floor(0.5 * 4) = 2 of 4 per round, drawn as FedAvg's docstring states: default_rng([seed, t, 0xFEDA])
    local = [6, 13, 9, 10]
    want = [max(local[int(i)] for i in np.random.default_rng([3, t, 0xFEDA]).choice(4, size=2, replace=False))
            for t in range(6)]
    assert round_steps(SIZES, rounds=6, client_fraction=0.5, local_epochs=0.5, **kw) == want
    assert set(want) <= {9, 10, 13} and len(set(want)) > 1  # the draw makes the rounds differ


ARGV = ["--dataset", "digits", "--partition", "lda", "--alpha", "0.5", "--partitions", "4", "--algo", "fedavg",
        "--local-epochs", "0.5", "--client-fraction", "0.5", "--log-every", "1", "--wan", "off", "--no-progress",
        "--seed", "3", "--eval-every", "100000"]


def _lines(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.integration
def test_a_rounds_run_ends_on_its_last_average_and_equals_the_run_in_steps(tmp_path):
    out = tmp_path / "rounds"
    assert main([*ARGV, "--rounds", "3", "--eval-every-rounds", "1", "--out", str(out)]) == 0
    sizes = json.loads((out / "partitions.json").read_text())["sizes"]
    assert sum(sizes) == 1438 and len(set(sizes)) == 4            # lda: every sample, unequal sizes
    local = [math.ceil(0.5 * n / 20) for n in sizes]               # batch size 20 (digits' default)
    lengths = [max(local[int(i)] for i in np.random.default_rng([3, t, 0xFEDA]).choice(4, size=2, replace=False))
               for t in range(3)]
    ends = np.cumsum(lengths).tolist()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == ends[-1]
    assert summary["theta_name"] is None and summary["theta_final"] is None  # Iter_Local is no knob with --local-epochs
    lines = _lines(out)
    assert [x["step"] for x in lines if "val_accuracy" in x] == ends  # one validation per round, at its end
    # what FedAvg itself did, logged after every step: round t (0-based) runs steps ends[t-1]+1 .. ends[t], its
    # length as drawn, and the average at ends[t] moves it to round t+1 (the last one sets no round up)
    assert [x["step"] for x in lines] == list(range(1, ends[-1] + 1))
    for x in lines:
        done = sum(e <= x["step"] for e in ends)
        assert x["fedavg_round"] == done, x["step"]
        assert x["fedavg_round_steps"] == lengths[min(done, 2)], x["step"]

    steps = tmp_path / "steps"
    assert main([*ARGV, "--steps", str(ends[-1]), "--eval-at", ",".join(map(str, ends[:-1])), "--out", str(steps)]) == 0
    assert json.loads((steps / "summary.json").read_text())["final_val_accuracy"] == summary["final_val_accuracy"]
    a, b = torch.load(out / "model.pt"), torch.load(steps / "model.pt")
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert [x["step"] for x in _lines(steps) if "val_accuracy" in x] == ends


@pytest.mark.parametrize("make, match", [
    (lambda: FedAvgConfig(rounds=0), "--rounds must be an integer >= 1"),
    (lambda: FedAvgConfig(rounds=2.5), "--rounds must be an integer >= 1"),
    (lambda: FedAvgConfig(eval_every_rounds=-1), "--eval-every-rounds must be an integer >= 0"),
    (lambda: FedAvgConfig(eval_every_rounds=2), "give --rounds too"),
    (lambda: FedAvgConfig(rounds=3, eval_every_rounds=4), "more than the run's --rounds 3"),
    (lambda: RunConfig(algo=AlgoConfig(algo="gaia"), fedavg=FedAvgConfig(rounds=3)), "--algo gaia has none"),
    (lambda: RunConfig(algo=AlgoConfig(algo="fedavg"), fedavg=FedAvgConfig(rounds=3), optim=OptimConfig(steps=10)),
     "--rounds and --steps both set the training length"),
    (lambda: RunConfig(algo=AlgoConfig(algo="fedavg"), fedavg=FedAvgConfig(rounds=3), skewscout=SkewScoutConfig(enabled=True)),
     "--skewscout changes Iter_Local"),
])
def test_bad_rounds_settings_are_value_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()
