"""Several partitions in one process (issue "many partitions per process", first part: P > R = 1).

``python -m geodml --partitions P`` runs the P partitions as P threads of one process over the
in-process Comm (geodml.comm.inprocess), which charges every byte, message and emulated second
as DistComm does. So a run with P partitions on one process must match the same run on P
torchrun processes: the ledger exactly, and the weights up to the order of floating-point sums
(gloo's ring all-reduce adds the K contributions chunk by chunk around the ring, the in-process
group in rank order; measured: at most 3e-8 apart after 40 steps, one float32 rounding).
"""

from __future__ import annotations

import json

import pytest
import torch

from geodml.cli import main
from geodml.trainer import EvalCache, evaluate

BASE = ["--dataset", "digits", "--steps", "40", "--eval-every", "20", "--log-every", "10", "--no-progress"]
LEDGER = ("wan_bytes_total", "lan_bytes_total", "wan_bytes_by_kind", "wan_bytes_by_link", "wan_messages_total", "steps")
ALGOS = {
    "bsp": ["--algo", "bsp"],
    "gaia-skewscout": ["--algo", "gaia", "--skewscout", "--travel-every", "10"],
    "dgc": ["--algo", "dgc", "--e-warm", "0.5"],
    "fedavgm-sampled": ["--algo", "fedavg", "--iter-local", "5", "--client-fraction", "0.67", "--server-momentum", "0.9"],
}


def _load(out):
    return json.loads((out / "summary.json").read_text())


@pytest.mark.integration
@pytest.mark.parametrize("name", list(ALGOS))
def test_three_partitions_in_one_process_equal_three_processes(name, tmp_path, monkeypatch):
    from tests.support.procs import run_torchrun
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    argv = [*BASE, *ALGOS[name]]
    hosted, procs = tmp_path / "hosted", tmp_path / "procs"
    assert main([*argv, "--partitions", "3", "--out", str(hosted)]) == 0
    r = run_torchrun(3, [*argv, "--out", str(procs)], timeout_s=240)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = _load(hosted), _load(procs)
    assert a["world_size"] == b["world_size"] == 3
    for key in LEDGER:
        assert a[key] == b[key], key
    assert a.get("theta_trajectory") == b.get("theta_trajectory")
    assert a["final_model"] == b["final_model"]
    for name_ in ["model.pt", *(f"rank{k}/model.pt" for k in range(3))]:
        x, y = torch.load(hosted / name_), torch.load(procs / name_)
        assert list(x) == list(y)
        for key in x:
            torch.testing.assert_close(x[key], y[key], rtol=0, atol=1e-6, msg=f"{name_}:{key}")
    n_test = 359  # digits: 1797 images, 20% held out
    assert abs(a["final_val_accuracy"] - b["final_val_accuracy"]) <= 1 / n_test
    assert (json.loads((hosted / "config.json").read_text())["region_of_rank"]
            == json.loads((procs / "config.json").read_text())["region_of_rank"])


def test_eval_cache_evaluates_each_distinct_model_once(monkeypatch):
    """Partitions holding byte-identical models share one evaluation; a different model (or a
    changed buffer) is evaluated again; the numbers are evaluate()'s."""
    import geodml.trainer as trainer
    calls = []

    def counting(model, x, y, batch=1000):
        calls.append(id(model))
        return evaluate(model, x, y, batch)

    monkeypatch.setattr(trainer, "evaluate", counting)
    torch.manual_seed(0)
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))
    a, b, c = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    cache = EvalCache()
    ra, rb, rc = cache.evaluate(a, x, y), cache.evaluate(b, x, y), cache.evaluate(c, x, y)
    assert len(calls) == 2 and ra == rb == evaluate(a, x, y) and rc == evaluate(c, x, y)
    with torch.no_grad():
        b.bias[0] += 1.0
    cache.evaluate(b, x, y)
    assert len(calls) == 3
