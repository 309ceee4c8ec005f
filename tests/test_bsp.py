"""BSP end to end with torchrun + gloo: identical weights on every rank, equivalence with
single-process SGD on the union of the same minibatches, ledger charged by the ring model."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.support.procs import run_torchrun

COMMON = ["--dataset", "digits", "--model", "cnn", "--norm", "none", "--no-progress", "--wan", "off"]


def _load_params(path):
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.integration
@pytest.mark.parametrize("k", [2, 3, 5])
def test_bsp_identical_weights_on_every_rank(tmp_path, k):
    out = tmp_path / "run"
    r = run_torchrun(k, [*COMMON, "--algo", "bsp", "--partition", "label", "--epochs", "0.5", "--out", str(out)],
                     timeout_s=180)
    assert r.returncode == 0, r.stderr[-3000:]
    sds = [_load_params(out / f"rank{i}" / "model.pt") for i in range(k)]
    for sd in sds[1:]:
        for name in sds[0]:
            assert torch.equal(sds[0][name], sd[name]), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algo"] == "bsp" and summary["world_size"] == k
    # BSP's partitions hold one model: --partition-scores auto (the default) scores none of them on its own
    assert summary["per_rank_val_accuracy"] is None and summary["per_rank_train_accuracy"] is None


def _reference_bsp(k, seed, steps, lr0, milestones_epochs, momentum, wd, batch, model_name="cnn", mults=None):
    """Single-process momentum SGD on the union of the K ranks' minibatches (paper form:
    u = m*u - lr*(grad + wd*w); w = w + u), using the same data order as the ranks. ``mults``
    ``{name: (lr_mult, decay_mult)}``: Caffe's SGD, u = m*u - lr*lr_mult*(grad + wd*decay_mult*w)."""
    from geodml.config import DataConfig
    from geodml.data.datasets import load_dataset
    from geodml.data.partition import make_partitioner
    from geodml.models import build_model
    from geodml.trainer import BatchSampler, steps_per_epoch

    ds = load_dataset("digits", None, seed=seed)
    labels = ds.train_y.numpy()
    parts = make_partitioner(DataConfig(partition="label", skew=1.0)).split(labels, k, np.random.default_rng([seed, 0xDA7A]))
    samplers = [BatchSampler(parts[r], batch, seed, r) for r in range(k)]
    spe = steps_per_epoch(len(labels), k, batch)
    model = build_model(model_name, "none", ds.input_shape, ds.num_classes, generator_seed=seed,
                        input_scale=ds.pixel_std).double()
    names = [n for n, _ in model.named_parameters()]
    params = list(model.parameters())
    lr_m = [(mults or {}).get(n, (1.0, 1.0))[0] for n in names]
    decay_m = [(mults or {}).get(n, (1.0, 1.0))[1] for n in names]
    u = [torch.zeros_like(p) for p in params]
    x, y = ds.train_x.double(), ds.train_y
    for step in range(steps):
        lr = lr0 * (0.1 ** sum(1 for m in milestones_epochs if step / spe >= m))
        idx = torch.from_numpy(np.concatenate([s.next().copy() for s in samplers]))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g, ui, lm, dm in zip(params, grads, u, lr_m, decay_m):
                ui.mul_(momentum).add_(g + wd * dm * p, alpha=-lr * lm)
                p.add_(ui)
    return {n: p.detach().float() for n, p in model.named_parameters()}, spe


@pytest.mark.integration
def test_bsp_equals_single_process_on_union_of_minibatches(tmp_path):
    k, seed, batch = 3, 11, 8
    out = tmp_path / "run"
    # digits: 1437 train samples -> ceil(1437 / (3*8)) = 60 steps/epoch; 0.5 epoch = 30 steps,
    # with the lr divided by 10 at epoch 0.25 (step 15).
    r = run_torchrun(k, [*COMMON, "--algo", "bsp", "--partition", "label", "--epochs", "0.5", "--batch-size", str(batch),
                         "--lr", "0.05", "--lr-milestones", "0.25", "--momentum", "0.9", "--weight-decay", "0.001",
                         "--seed", str(seed), "--out", str(out)], timeout_s=180)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    ref, spe = _reference_bsp(k, seed, summary["steps"], 0.05, (0.25,), 0.9, 0.001, batch)
    assert spe == 60 and summary["steps"] == 30
    got = _load_params(out / "model.pt")
    moved = 0.0
    for name, p in ref.items():
        torch.testing.assert_close(got[name], p, rtol=1e-4, atol=1e-5)
        moved += float((p - 0).abs().sum())
    assert moved > 0


@pytest.mark.integration
def test_bsp_with_the_prototxt_multipliers_is_caffes_sgd(tmp_path):
    """--model lenet --param-mults prototxt: the released LeNet's biases at lr x 2 and ip1's weights at
    weight decay x 250 (its bias at 0), against the reference written from Caffe's SGD update."""
    k, seed, batch = 2, 5, 8
    out = tmp_path / "run"
    r = run_torchrun(k, ["--dataset", "digits", "--model", "lenet", "--param-mults", "prototxt", "--no-progress",
                         "--wan", "off", "--algo", "bsp", "--partition", "label", "--steps", "20",
                         "--batch-size", str(batch), "--lr", "0.01", "--momentum", "0.9", "--weight-decay", "0.004",
                         "--seed", str(seed), "--out", str(out)], timeout_s=180)
    assert r.returncode == 0, r.stderr[-3000:]
    mults = {"conv1.bias": (2.0, 1.0), "conv2.bias": (2.0, 1.0), "ip1.weight": (1.0, 250.0), "ip1.bias": (2.0, 0.0)}
    got = _load_params(out / "model.pt")
    ref, _ = _reference_bsp(k, seed, 20, 0.01, (), 0.9, 0.004, batch, model_name="lenet", mults=mults)
    plain, _ = _reference_bsp(k, seed, 20, 0.01, (), 0.9, 0.004, batch, model_name="lenet")
    for name, p in ref.items():
        torch.testing.assert_close(got[name], p, rtol=1e-4, atol=1e-6)
    # the multipliers matter: ip1's weights end visibly apart from the plain run's (decay 1.0 vs 0.004)
    assert float((ref["ip1.weight"] - plain["ip1.weight"]).abs().max()) > 100 * 1e-6


@pytest.mark.integration
def test_bsp_ledger_matches_ring_model(tmp_path):
    """K=4, the CNN on 8x8 digits has 188,810 float32 parameters (755,240 B). Ring all-reduce:
    chunks of 47,203 elements (188,810 = 4*47,202 + 2 -> two chunks of 47,203, two of 47,202);
    every rank sends 2(K-1) = 6 chunks per step. Over all ranks each chunk index is sent 6
    times in total, so all ranks together send 6 * 188,810 * 4 B = 4,531,440 B per step."""
    k, out = 4, tmp_path / "run"
    r = run_torchrun(k, [*COMMON, "--algo", "bsp", "--epochs", "0.2", "--out", str(out)], timeout_s=180)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    per_step = 2 * (k - 1) * 188_810 * 4
    assert s["wan_bytes_total"] == s["steps"] * per_step
    assert s["wan_bytes_by_kind"] == {"gradient": s["steps"] * per_step}
    # the "vs BSP" figure every other algorithm's summary carries is this ledger total
    assert s["bsp_equivalent_wan_bytes"] == s["wan_bytes_total"] and s["wan_savings_vs_bsp"] == 1.0
    # default topology: one region per rank; ring successor links only
    regions = _regions(out, k)
    assert set(s["wan_bytes_by_link"]) == {f"{a}->{b}" for a, b in zip(regions, regions[1:] + regions[:1])}


def _regions(out, k):
    return json.loads((out / "config.json").read_text())["region_of_rank"]
