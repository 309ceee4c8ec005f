"""DiLoCo (issue 67 item 1, geodml/algorithms/diloco.py): its inner AdamW and outer Nesterov step against
torch's own optimizers bit for bit, its equivalence with FedAvg (item 7), its bytes worked out by hand,
hosting and checkpoints, and its command line."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

import geodml
from geodml.algorithms.diloco import DiLoCo
from geodml.cli import build_parser, parse_config, plugin_of
from geodml.config import API_ALGOS
from tests.support.procs import run_command


def _model(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "model.pt", map_location="cpu", weights_only=True)


def _same_weights(a: Path, b: Path) -> None:
    ma, mb = _model(a), _model(b)
    assert ma.keys() == mb.keys()
    for k in ma:
        assert torch.equal(ma[k], mb[k]), k


class _Half:
    """Just what DiLoCo's inner and outer steps read (a partition's flat parameters and its buffers)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randn(n, generator=g)
        self.grad = torch.zeros(n)


def _bare_diloco(n: int, **attrs) -> DiLoCo:
    d = DiLoCo.__new__(DiLoCo)
    d.flat = _Half(n, 0)
    for k, v in attrs.items():
        setattr(d, k, v)
    return d


def test_inner_adamw_step_is_torch_adamw_bit_for_bit():
    """Twelve steps with a changing learning rate and gradient, decoupled weight decay 0.1 and betas
    (0.9, 0.95): DiLoCo's preallocated step equals torch.optim.AdamW's single-tensor step exactly."""
    n = 1000
    d = _bare_diloco(n, beta1=0.9, beta2=0.95, adam_eps=1e-8, decoupled_decay=0.1, adam_steps=0,
                     exp_avg=torch.zeros(n), exp_avg_sq=torch.zeros(n), _denom=torch.empty(n))
    ref = torch.nn.Parameter(d.flat.data.clone())
    opt = torch.optim.AdamW([ref], lr=1.0, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False)
    g = torch.Generator().manual_seed(1)
    for t in range(12):
        lr = 4e-4 * (1 + t % 3)
        grad = torch.randn(n, generator=g) * (10.0 ** (t % 4 - 2))
        d.flat.grad.copy_(grad)
        d.adamw_step(lr)
        for group in opt.param_groups:
            group["lr"] = lr
        ref.grad = grad.clone()
        opt.step()
        assert torch.equal(d.flat.data, ref.detach()), t
    assert d.adam_steps == 12
    assert torch.equal(d.exp_avg_sq, opt.state[ref]["exp_avg_sq"])


def test_outer_step_is_torch_nesterov_sgd_bit_for_bit():
    """Four outer steps at the paper's lr 0.7 and momentum 0.9 against torch.optim.SGD(nesterov=True)
    fed the averaged outer gradient as its gradient."""
    n = 500
    theta = torch.randn(n, generator=torch.Generator().manual_seed(2))
    d = _bare_diloco(n, server_momentum=0.9, server_lr=0.7, v=torch.zeros(n), global_w=theta.clone())
    ref = torch.nn.Parameter(theta.clone())
    opt = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True, foreach=False)
    g = torch.Generator().manual_seed(3)
    for t in range(4):
        delta = torch.randn(n, generator=g)
        ref.grad = delta.clone()
        opt.step()
        d.server_update(delta.clone())
        assert torch.equal(d.global_w, ref.detach()), t
    # by hand, one element: v1 = 1, theta1 = 0 - 0.7 (1 + 0.9) = -1.33; v2 = 0.9 + 2 = 2.9,
    # theta2 = -1.33 - 0.7 (2 + 0.9 * 2.9) = -1.33 - 3.227 = -4.557
    e = _bare_diloco(1, server_momentum=0.9, server_lr=0.7, v=torch.zeros(1, dtype=torch.float64),
                     global_w=torch.zeros(1, dtype=torch.float64))
    e.server_update(torch.ones(1, dtype=torch.float64))
    assert e.global_w.item() == pytest.approx(-1.33, abs=1e-12)
    e.server_update(torch.full((1,), 2.0, dtype=torch.float64))
    assert e.global_w.item() == pytest.approx(-4.557, abs=1e-12)


def test_the_average_is_uniform_over_the_participants():
    d = _bare_diloco(1)
    assert d.averaging_weights((0, 3, 5)).tolist() == [1 / 3] * 3


# ---- runs -----------------------------------------------------------------------------------
TWO = ["--dataset", "digits", "--partitions", "2", "--steps", "45", "--no-progress", "--eval-every", "15"]


def test_diloco_with_unit_outer_sgd_and_inner_sgd_is_fedavg_bit_for_bit(tmp_path, monkeypatch):
    """Item 7: --outer-lr 1 --outer-momentum 0 --inner-optimizer sgd is FedAvg with Iter_Local = H (two
    equal partitions of 719 digits, so FedAvg's size weights are DiLoCo's 1/2; BatchNorm buffers in the
    message; 45 steps = 4 rounds of 10 and a partial one of 5, averaged at the end by both). Scratch is
    poisoned at every switch between the hosted partitions."""
    monkeypatch.setenv("GEODML_POISON_SCRATCH", "1")
    common = [*TWO, "--model", "cnn", "--norm", "batch"]
    fed = geodml.run(["--algo", "fedavg", "--iter-local", "10", *common, "--out", str(tmp_path / "fedavg")])
    dl = geodml.run(["--algo", "diloco", "--inner-steps", "10", "--outer-lr", "1", "--outer-momentum", "0",
                     "--inner-optimizer", "sgd", *common, "--out", str(tmp_path / "diloco")])
    _same_weights(fed.out, dl.out)
    assert dl.summary["final_val_accuracy"] == fed.summary["final_val_accuracy"]
    assert dl.summary["wan_bytes_total"] == fed.summary["wan_bytes_total"]
    assert dl.summary["wan_bytes_by_link"] == fed.summary["wan_bytes_by_link"]


def test_bytes_are_one_ring_all_reduce_of_the_model_per_outer_step(tmp_path):
    """K = 4, H = 20, 50 steps: outer steps after steps 20, 40 and (the partial round) 50. The ring
    all-reduce of n float32 parameters costs 2 (K - 1) * 4n bytes in all (geodml.comm cost model): by hand
    for the 188,810-parameter CNN, 3 * 2 * 3 * 4 * 188,810 = 13,594,320 bytes; 20x fewer than BSP's
    50 all-reduces."""
    r = geodml.run(["--algo", "diloco", "--inner-steps", "20", "--lr", "0.001", "--dataset", "digits",
                    "--partitions", "4", "--steps", "50", "--no-progress", "--out", str(tmp_path / "d")])
    n = 188_810
    assert sum(p.numel() for p in _model(r.out).values()) == n
    assert r.summary["wan_bytes_total"] == 3 * 2 * 3 * 4 * n == 13_594_320
    assert r.metrics[-1]["diloco_outer_steps"] == 3


def test_adamw_diloco_learns_and_decays_weights_itself(tmp_path):
    """The paper's inner AdamW (lr 1e-3 here) and outer Nesterov (0.7, 0.9) train the CNN on digits past
    chance by far; --weight-decay is the AdamW's decoupled decay, so the trainer adds no L2 term."""
    r = geodml.run(["--algo", "diloco", "--inner-steps", "10", "--lr", "0.001", "--weight-decay", "0.1",
                    "--dataset", "digits", "--partitions", "4", "--epochs", "3", "--no-progress",
                    "--out", str(tmp_path / "a")])
    assert r.summary["final_val_accuracy"] > 0.6
    assert r.config.plugin.inner_optimizer == "adamw" and r.config.plugin.outer_lr == 0.7
    algo = _built(["--algo", "diloco"])
    assert algo.l2_in_gradient is False
    assert _built(["--algo", "diloco", "--inner-optimizer", "sgd"]).l2_in_gradient is True


def _built(args: list[str]) -> DiLoCo:
    """DiLoCo as the engine builds it on one partition of a run of 2 (no traffic is sent)."""
    import numpy as np

    from geodml.algorithms import build_algorithm
    from geodml.algorithms.base import AlgoContext, FlatParams
    cfg = parse_config([*args, "--partitions", "2"])
    flat = FlatParams(torch.nn.Linear(3, 2))
    ctx = AlgoContext(rank=0, world_size=2, seed=0, steps_per_epoch=10, total_steps=100, batch_size=4,
                      label_counts=np.ones((2, 2), dtype=np.int64))
    algo = build_algorithm(cfg, flat=flat, comm=None, ctx=ctx)  # type: ignore[arg-type]
    assert isinstance(algo, DiLoCo)
    return algo


def test_rounds_count_outer_steps_and_skewscout_tunes_h(tmp_path):
    r = geodml.run(["--algo", "diloco", "--inner-steps", "7", "--rounds", "3", "--lr", "0.001", "--dataset", "digits",
                    "--partitions", "2", "--no-progress", "--out", str(tmp_path / "r")])
    assert r.metrics[-1]["step"] == 21 and r.metrics[-1]["diloco_outer_steps"] == 3
    s = geodml.run(["--algo", "diloco", "--inner-steps", "20", "--lr", "0.001", "--dataset", "digits",
                    "--partitions", "4", "--steps", "60", "--skewscout", "--travel-every", "20", "--no-progress",
                    "--out", str(tmp_path / "sk")])
    traj = s.summary["theta_trajectory"]
    assert traj[0] == {"step": 0, "theta": 20.0} or traj[0]["theta"] == 20.0
    assert all(t["theta"] in DiLoCo.KNOB.grid for t in traj) and len(traj) >= 2


def test_checkpoint_resume_is_bit_identical(tmp_path):
    """AdamW's moments and step count, the outer momentum and the round survive a checkpoint."""
    args = ["--algo", "diloco", "--inner-steps", "15", "--lr", "0.001", "--dataset", "digits", "--partitions", "4",
            "--client-fraction", "0.5", "--steps", "45", "--checkpoint-every", "25", "--no-progress"]
    full = geodml.run([*args, "--out", str(tmp_path / "full")])
    cut = tmp_path / "cut"
    shutil.copytree(full.out, cut)
    for p in [cut / "summary.json", *cut.glob("**/model.pt")]:
        p.unlink()
    # one checkpoint, mid-round (H = 15: step 25 is the 10th inner step of round 2)
    assert sorted(p.name for p in cut.glob("rank*/ckpt-*.pt")) == ["ckpt-00000025.pt"] * 4
    resumed = geodml.run([*args, "--out", str(cut), "--resume"])
    _same_weights(full.out, resumed.out)
    assert resumed.summary["wan_bytes_total"] == full.summary["wan_bytes_total"]


@pytest.mark.integration
def test_one_and_two_processes_give_the_same_run(tmp_path):
    """Item "what must be shown": --partitions 4 on 1 and 2 processes, identical weights and bytes per link."""
    cmd = [sys.executable, "-m", "geodml", "--algo", "diloco", "--inner-steps", "10", "--lr", "0.001",
           "--partitions", "4", "--dataset", "digits", "--epochs", "1", "--no-progress"]
    env = {"OMP_NUM_THREADS": "1"}
    one = run_command([*cmd, "--processes", "1", "--out", str(tmp_path / "r1")], timeout_s=240, env=env)
    assert one.returncode == 0, one.stderr[-2000:]
    two = run_command([*cmd, "--processes", "2", "--out", str(tmp_path / "r2")], timeout_s=240, env=env)
    assert two.returncode == 0, two.stderr[-2000:]
    _same_weights(tmp_path / "r1", tmp_path / "r2")
    s1, s2 = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("r1", "r2"))
    assert s1["wan_bytes_by_link"] == s2["wan_bytes_by_link"] and s1["wan_bytes_total"] > 0


# ---- the command line -------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "message"), [
    (["--inner-steps", "0"], r"--inner-steps must be an integer >= 1, got 0"),
    (["--inner-optimizer", "lamb"], r"--inner-optimizer: choose one of adamw, sgd|invalid choice: 'lamb'"),
    (["--outer-momentum", "1"], r"--outer-momentum must be in \[0, 1\), got 1.0"),
    (["--adam-betas", "0.9"], r"--adam-betas takes two numbers in \[0, 1\) such as 0.9,0.999"),
    (["--reset-momentum"], r"--reset-momentum resets momentum SGD's buffer; the inner AdamW keeps its moments"),
    (["--local-epochs", "1"], r"--local-epochs: a DiLoCo outer step is H inner steps"),
])
def test_bad_options_are_one_clear_error(args, message):
    with pytest.raises(ValueError, match=message):
        parse_config(["--algo", "diloco", *args])


def test_help_group_and_warnings():
    text = " ".join(build_parser(plugin_of("diloco")).format_help().split())
    assert "algorithm diloco: --inner-steps H diloco: inner steps between outer steps (the paper's H = 500)" in text
    assert API_ALGOS[0] == "diloco"
    names = "{bsp,gaia,dgc,fedavg,local," + ",".join(API_ALGOS) + "}|MODULE:CLASS"
    assert names in " ".join(build_parser().format_help().split())
    warned: list[str] = []
    cfg = parse_config(["--algo", "diloco", "--iter-local", "5", "--server-momentum", "0.5", "--client-fraction",
                        "0.5"], warn=warned.append)
    assert warned == ["geodml: warning: --iter-local, --server-momentum has no effect with --algo diloco"]
    assert cfg.fedavg_iter_local() == 500 and cfg.fedavg.client_fraction == 0.5
    with pytest.warns(UserWarning, match="--momentum does nothing with --inner-optimizer adamw"):
        _built(["--algo", "diloco", "--momentum", "0.5"])
