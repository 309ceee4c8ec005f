"""``--channels-last`` (geodml.channels_last): the forward and backward pass on a channels-last copy
of the model, synced with the flat NCHW buffer every step.

Its gradient must be the model's own to float32 rounding, checked against a float64 reference the
same way as the plain path's; the flat weights and their order must not change; buffers (BatchNorm
statistics, BatchReNorm's step) must be shared; and a whole run must send the same bytes and reach
the same accuracy to rounding.
"""

from __future__ import annotations

import copy
import json
import types

import numpy as np
import pytest
import torch

from geodml.algorithms.base import FlatParams
from geodml.channels_last import ChannelsLastTwin
from geodml.cli import main
from geodml.config import OptimConfig
from geodml.models import build_model
from geodml.trainer import local_gradient

MODELS = [("cnn", "none"), ("cnn", "batch"), ("lenet", "none"), ("lenet", "batch"), ("lenet", "group"),
          ("lenet", "batchrenorm"), ("resnet20", "batch"), ("cifar-cnn", "none")]


def minibatch(model: torch.nn.Module, shape: tuple[int, int, int], batch: int, *, twin: bool) -> types.SimpleNamespace:
    """A geodml.trainer.Minibatch over ``model`` with 32 seeded training images."""
    g = torch.Generator().manual_seed(1)
    train_x = torch.randn(32, *shape, generator=g)
    train_y = torch.randint(0, 10, (32,), generator=g)
    flat = FlatParams(model)
    mb = types.SimpleNamespace(model=model, flat=flat, train_x=train_x, train_y=train_y,
                               xb=torch.empty(batch, *shape), yb=torch.empty(batch, dtype=torch.int64),
                               idx=torch.empty(batch, dtype=torch.int64), optim=OptimConfig(weight_decay=0.0), twin=None)
    if twin:
        mb.twin = ChannelsLastTwin(model, flat, mb.xb)
    return mb


def float64_gradient(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The reference: the same loss in float64 on a copy (its buffers updated on the copy only)."""
    ref = copy.deepcopy(model).double()
    loss = torch.nn.functional.cross_entropy(ref(x.double()), y)
    grads = torch.autograd.grad(loss, [p for p in ref.parameters() if p.requires_grad])
    return torch.cat([g.reshape(-1) for g in grads])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("name, norm", MODELS, ids=[f"{m}-{n}" for m, n in MODELS])
def test_twin_gradient_is_the_models_to_float32_rounding(name, norm):
    shape, batch = (1, 28, 28), 8
    torch.manual_seed(0)
    model = build_model(name, norm, shape, 10)
    plain = minibatch(model, shape, batch, twin=False)
    other = copy.deepcopy(model)
    twin = minibatch(other, shape, batch, twin=True)
    weights_before = twin.flat.data.clone()
    indices = np.arange(3, 3 + batch)
    x, y = plain.train_x[indices], plain.train_y[indices]
    reference = float64_gradient(model, x, y)  # before either updates its statistics
    for step in range(3):  # three steps: the buffers (running statistics, BatchReNorm's step) move alike
        loss_a, correct_a, _ = local_gradient(plain, indices, lambda labels: None)
        loss_b, correct_b, _ = local_gradient(twin, indices, lambda labels: None)
        if step == 0:
            # the twin is as close to the float64 gradient as the plain float32 path (~1e-7 to 1e-6; BN-ResNet-20
            # at batch 8, ~3e-3 for both: BatchNorm's float32 statistics, not the memory format)
            err_plain, err_twin = rel(plain.flat.grad, reference), rel(twin.flat.grad, reference)
            assert err_plain < 1e-2 and err_twin <= 1.5 * err_plain + 1e-6, (err_plain, err_twin)
            tol = max(1e-5, 2 * err_plain)
        assert abs(loss_a - loss_b) <= 1e-5 * max(1.0, abs(loss_a)) and correct_a == correct_b
        assert rel(twin.flat.grad, plain.flat.grad) < tol, (step, rel(twin.flat.grad, plain.flat.grad), tol)
    # the flat weights are the twin's inputs only: untouched, in their NCHW order
    assert torch.equal(twin.flat.data, weights_before)
    for (bn, a), (_, b) in zip(model.named_buffers(), other.named_buffers()):
        if a.is_floating_point():
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), bn
        else:
            assert torch.equal(a, b), bn
    # the twin holds the model's buffers themselves, and its conv weights channels-last
    tw = twin.twin.model
    assert all(x is y for x, y in zip(tw.buffers(), other.buffers()))
    convs = [p for p in tw.parameters() if p.dim() == 4]
    assert convs and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
    # every other parameter is the model's own (a view into the flat buffer): never copied per step
    own = {id(p) for p in other.parameters()}
    assert all(id(p) in own for p in tw.parameters() if p.dim() != 4)
    assert not any(id(p) in own for p in convs)


def test_twin_follows_the_flat_weights_and_the_models_mode():
    shape, batch = (1, 28, 28), 8
    torch.manual_seed(0)
    model = build_model("lenet", "batch", shape, 10)
    other = copy.deepcopy(model)
    plain, twin = minibatch(model, shape, batch, twin=False), minibatch(other, shape, batch, twin=True)
    indices = np.arange(batch)
    local_gradient(plain, indices, lambda labels: None)
    local_gradient(twin, indices, lambda labels: None)
    for mb in (plain, twin):  # an algorithm's update of the flat weights, between steps
        mb.flat.data.mul_(0.9).add_(0.001)
        mb.model.eval()  # evaluation mode: BatchNorm uses its running statistics
    la, _, _ = local_gradient(plain, indices, lambda labels: None)
    lb, _, _ = local_gradient(twin, indices, lambda labels: None)
    assert not twin.twin.model.training
    assert abs(la - lb) <= 1e-5 * abs(la) and rel(twin.flat.grad, plain.flat.grad) < 1e-4


RUN = ["--dataset", "digits", "--model", "lenet", "--norm", "batch", "--steps", "24", "--eval-every", "12",
       "--no-progress", "--partitions", "4", "--partition", "label", "--skew", "0.5"]


@pytest.mark.parametrize("algo", [["--algo", "fedavg", "--iter-local", "6", "--client-fraction", "0.5"],
                                  ["--algo", "bsp"]], ids=["fedavg-pool", "bsp-threads"])
def test_a_run_with_channels_last_sends_the_same_bytes_and_learns_alike(algo, tmp_path):
    outs = {}
    for cl in (False, True):
        out = tmp_path / ("cl" if cl else "plain")
        assert main([*RUN, *algo, "--out", str(out), *(["--channels-last"] if cl else [])]) == 0
        outs[cl] = json.loads((out / "summary.json").read_text())
    a, b = outs[False], outs[True]
    assert b["wan_bytes_total"] == a["wan_bytes_total"] > 0  # dense algorithms: the same messages
    assert abs(a["final_val_accuracy"] - b["final_val_accuracy"]) <= 0.02
    assert abs(a["final_val_loss"] - b["final_val_loss"]) <= 0.01 * a["final_val_loss"]
    assert json.loads((tmp_path / "cl" / "config.json").read_text())["config"]["channels_last"] is True
