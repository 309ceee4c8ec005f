"""The vectorized gradient path (geodml.stacked, ``--vmap``): every row's gradient equals the one
``loss.backward()`` gives for that model alone, to float32 rounding; a pool run with ``--vmap``
ends where the per-partition loop ends, with the identical ledger."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from geodml.algorithms import FlatParams
from geodml.cli import main
from geodml.models import build_model
from geodml.stacked import StackedGradient, vmap_refusal
from tests.test_pool import BASE, CONFIGS

BYTES = ("wan_bytes_total", "lan_bytes_total", "wan_bytes_by_kind", "wan_bytes_by_link", "bytes_by_link",
         "wan_messages_total", "messages_total", "steps")


def _one_at_a_time(model, flat, weights, x, y):
    """The reference: load each row into the model, forward, backward (geodml.trainer.local_gradient)."""
    grads, losses, correct = torch.empty_like(weights), [], []
    for i in range(len(weights)):
        flat.data.copy_(weights[i])
        flat.zero_grad()
        logits = model(x[i])
        loss = F.cross_entropy(logits, y[i])
        loss.backward()
        grads[i] = flat.grad
        losses.append(float(loss.detach()))
        correct.append(int((logits.argmax(1) == y[i]).sum()))
    return grads, losses, correct


@pytest.mark.parametrize("name", ["cnn", "lenet", "mlp"])
def test_every_row_is_its_own_models_gradient(name):
    torch.manual_seed(0)
    model = build_model(name, "none", (1, 8, 8), 10, generator_seed=3)
    flat = FlatParams(model)
    m, b = 4, 20
    weights = flat.data.repeat(m, 1) + 0.05 * torch.randn(m, flat.numel)  # four different models
    x, y = torch.randn(m, b, 1, 8, 8), torch.randint(0, 10, (m, b))
    ref, ref_loss, ref_correct = _one_at_a_time(model, flat, weights, x, y)
    out = torch.full_like(weights, float("nan"))
    losses, correct, compute_s = StackedGradient(model)(weights, x, y, out)
    assert compute_s > 0
    scale = ref.abs().max()
    assert scale > 0 and (out - ref).abs().max() <= 1e-5 * scale
    assert not torch.equal(out[0], out[1])                    # rows differ: each used its own weights
    assert losses.tolist() == pytest.approx(ref_loss, rel=1e-5)
    assert correct.tolist() == ref_correct


def test_chunks_of_participants_give_the_same_gradients():
    torch.manual_seed(1)
    model = build_model("cnn", "none", (1, 8, 8), 10, generator_seed=3)
    flat = FlatParams(model)
    m, b = 5, 20
    weights = flat.data.repeat(m, 1) + 0.05 * torch.randn(m, flat.numel)
    x, y = torch.randn(m, b, 1, 8, 8), torch.randint(0, 10, (m, b))
    whole, chunked = torch.empty_like(weights), torch.empty_like(weights)
    StackedGradient(model)(weights, x, y, whole)
    StackedGradient(model, images_per_call=2 * b)(weights, x, y, chunked)  # chunks of 2, 2 and 1 rows
    assert (whole - chunked).abs().max() <= 1e-5 * whole.abs().max()


def test_models_with_running_statistics_are_refused():
    assert vmap_refusal(build_model("cnn", "none", (1, 8, 8), 10)) is None
    assert "BatchNorm" in (vmap_refusal(build_model("lenet", "batch", (1, 8, 8), 10)) or "")


def test_vmap_without_the_pool_engine_is_an_input_error(tmp_path, capsys):
    for argv, why in ((["--algo", "fedavg", "--partitions", "3", "--fedir"], "FedIR"),
                      (["--algo", "fedavg", "--partitions", "3", "--engine", "threads"], "--engine threads"),
                      (["--algo", "fedavg"], "one partition per process")):
        out = tmp_path / "never"
        assert main([*argv, "--vmap", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[0].startswith("geodml: error: --vmap needs the pool engine, which this run does not use: ")
        assert why in err[0]
        assert not out.exists()
    # Gaia and DGC run on the pool but train partitions one after another: --vmap would do nothing; BSP never pools
    for algo in ("gaia", "dgc", "bsp"):
        assert main(["--algo", algo, "--partitions", "3", "--vmap", "--out", str(tmp_path / "never")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[0] == (f"geodml: error: --vmap applies to --algo fedavg only (it stacks the participants' "
                          f"gradients on the pool engine), not to --algo {algo}: leave out --vmap")
        assert not (tmp_path / "never").exists()


@pytest.mark.integration
def test_pool_with_vmap_ends_where_the_loop_ends(tmp_path):
    """Star rounds, downloads, FedAvgM (Nesterov), FedProx: the same ledger to the byte (values do
    not change sizes), the weights to float32 rounding accumulated over 30 steps."""
    argv = [*BASE, *CONFIGS["sampled-fedavgm-fedprox"], "--engine", "pool"]
    assert main([*argv, "--out", str(tmp_path / "loop")]) == 0
    assert main([*argv, "--vmap", "--out", str(tmp_path / "vmap")]) == 0
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("loop", "vmap"))
    for key in BYTES:
        assert a[key] == b[key], key
    assert b["final_val_accuracy"] == pytest.approx(a["final_val_accuracy"], abs=0.01)
    for f in ["model.pt", "rank3/model.pt"]:
        x, y = (torch.load(tmp_path / d / f) for d in ("loop", "vmap"))
        for name in x:
            assert (x[name] - y[name]).abs().max() <= 1e-4 * x[name].abs().max() + 1e-7, (f, name)
        assert any(not torch.equal(x[n], y[n]) for n in x)  # it did take the other path
