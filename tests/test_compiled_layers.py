"""geodml.models.compiled against torch: MaxPool2d against nn.MaxPool2d (the same outputs, argmax
indices and input gradients bit for bit, on the pools the models use, 2/2 floor, 3/2 ceil, 3/2
after a -inf pad, and on inputs made to stress the tie and NaN rules), LocalResponseNorm against
nn.LocalResponseNorm (outputs and input gradients bit for bit), and whole models' SGD steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from geodml import kernels
from geodml.models import build_model, compiled
from geodml.models.compiled import LocalResponseNorm, MaxPool2d, _pool_size

needs_ext = pytest.mark.skipif(kernels.compiled is None, reason=f"geodml._kernels unavailable: {kernels.UNAVAILABLE_REASON}")


def _inputs(shape: tuple[int, ...], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    ties = torch.randint(-2, 3, shape, generator=g).float()        # few distinct values: ties everywhere
    special = x.clone()
    flat = special.view(-1)
    flat[::7] = float("-inf")
    flat[::11] = float("nan")
    flat[::13] = float("inf")
    flat[::17] = -0.0
    flat[1::17] = 0.0
    allneg = torch.full(shape, float("-inf"))                       # every window -inf: index of its first pixel
    return {"randn": x, "relu": torch.relu(x), "ties": ties, "special": special, "all-inf": allneg}


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy().view(np.uint32 if t.dtype == torch.float32 else np.int64).copy()


CASES = [  # (kernel, stride, ceil_mode, input shape): the models' pools and odd sides
    (2, 2, False, (3, 5, 28, 28)), (2, 2, False, (2, 4, 7, 9)), (3, 2, True, (3, 5, 28, 28)),
    (3, 2, True, (2, 3, 8, 8)), (3, 2, True, (2, 3, 7, 4)), (3, 2, False, (2, 3, 17, 33)),
    ((3, 2), (1, 2), True, (2, 2, 6, 7)), (2, 1, False, (1, 2, 5, 5)), (4, 3, True, (1, 3, 10, 11)),
    (2, 2, False, (2, 3, 14, 14)), (2, 2, False, (1, 2, 6, 15)), ((3, 2), (1, 2), True, (2, 2, 9, 17)),
    (3, 2, True, (1, 2, 16, 16)), (2, 2, True, (1, 2, 9, 9)),
]  # W >= 6 + kW with stride 2 takes the four-lane path (geodml/_kernels.c pool_four), the rest the scalar one


@needs_ext
@pytest.mark.parametrize("kernel,stride,ceil_mode,shape", CASES)
def test_forward_indices_and_gradient_equal_torch_bit_for_bit(kernel, stride, ceil_mode, shape):
    ours = MaxPool2d(kernel, stride, ceil_mode=ceil_mode)
    ref = nn.MaxPool2d(kernel, stride, ceil_mode=ceil_mode, return_indices=True)
    for name, x in _inputs(shape, 3).items():
        xa = x.clone().requires_grad_()
        xb = x.clone().requires_grad_()
        ya = ours(xa)
        yb, ib = ref(xb)
        assert ya.shape == yb.shape, name
        assert np.array_equal(_bits(ya), _bits(yb)), name
        # the indices the backward pass used: ours are saved in the autograd node
        ia = ya.grad_fn.saved_tensors[1]
        assert torch.equal(ia, ib), name
        g = torch.randn(ya.shape, generator=torch.Generator().manual_seed(5))
        ya.backward(g)
        yb.backward(g)
        assert np.array_equal(_bits(xa.grad), _bits(xb.grad)), name


@needs_ext
def test_no_grad_skips_indices_and_keeps_values():
    x = torch.relu(torch.randn(4, 8, 14, 14))
    with torch.no_grad():
        y = MaxPool2d(2)(x)
    assert y.grad_fn is None
    assert np.array_equal(_bits(y), _bits(nn.functional.max_pool2d(x, 2)))


def test_output_size_matches_torch():
    for size in range(1, 40):
        for kernel, stride in ((2, 2), (3, 2), (3, 1), (4, 3), (5, 5)):
            for ceil_mode in (False, True):
                if size < kernel:
                    continue
                expected = nn.functional.max_pool2d(torch.zeros(1, 1, size, 1), (kernel, 1), (stride, 1),
                                                    ceil_mode=ceil_mode).shape[2]
                assert _pool_size(size, kernel, stride, ceil_mode) == expected, (size, kernel, stride, ceil_mode)


def test_falls_back_outside_the_fast_paths_contract(monkeypatch):
    """channels-last, float64, padding and vmap take nn.MaxPool2d's own path (no custom node),
    with the same values."""
    calls = []
    monkeypatch.setattr(compiled._FastMaxPool2d, "apply", lambda *a: calls.append(a))
    x = torch.randn(2, 3, 8, 8)
    for pool, inp in [(MaxPool2d(2), x.contiguous(memory_format=torch.channels_last)), (MaxPool2d(2), x.double()),
                      (MaxPool2d(2, padding=1), x), (MaxPool2d(2, return_indices=True), x)]:
        out = pool(inp)
        ref = nn.MaxPool2d(pool.kernel_size, pool.stride, pool.padding, return_indices=pool.return_indices)(inp)
        assert all(torch.equal(a, b) for a, b in zip(out, ref)) if pool.return_indices else torch.equal(out, ref)
    xs = torch.randn(3, 2, 3, 8, 8)                # --vmap's use: per-model gradients of 4-D batches
    vm = torch.func.vmap(torch.func.grad(lambda v: (MaxPool2d(2)(v) ** 2).sum()))(xs)
    ref = torch.func.vmap(torch.func.grad(lambda v: (nn.functional.max_pool2d(v, 2) ** 2).sum()))(xs)
    assert torch.equal(vm, ref)
    assert calls == []


@needs_ext
@pytest.mark.parametrize("name,norm,shape", [("cnn", "none", (1, 28, 28)), ("lenet", "none", (1, 28, 28)),
                                             ("lenet", "batch", (3, 32, 32)), ("cifar-cnn", "none", (3, 24, 24))])
def test_models_train_bit_identically_with_the_fast_pool(name, norm, shape, monkeypatch):
    """Three SGD steps of each max-pooling model (lenet and cifar-cnn with LRN): the weights with
    the compiled layers and with torch's (the compiled path disabled) are equal bit for bit."""
    def steps() -> list[np.ndarray]:
        torch.manual_seed(0)
        model = build_model(name, norm, shape, 10)
        assert any(isinstance(m, MaxPool2d) for m in model.modules())
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            x, y = torch.randn(16, *shape, generator=g), torch.randint(0, 10, (16,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return [_bits(p) for p in model.parameters()]
    fast = steps()
    with monkeypatch.context() as m:
        m.setattr(compiled.kernels, "compiled", None)
        slow = steps()
    assert all(np.array_equal(a, b) for a, b in zip(fast, slow))


@needs_ext
@pytest.mark.parametrize("size,alpha,beta,k", [(3, 5e-5, 0.75, 1.0), (9, 0.001, 0.75, 1.0), (1, 0.1, 0.5, 2.0),
                                               (2, 1e-3, 0.75, 1.0), (4, 0.5, 0.9, 0.5), (5, 1.0, 0.75, 1.0)])
@pytest.mark.parametrize("shape", [(3, 32, 14, 14), (2, 3, 5, 7), (2, 1, 4, 4), (1, 12, 1, 9)])
def test_lrn_forward_and_gradient_equal_torch_bit_for_bit(size, alpha, beta, k, shape):
    """lenet's LRN (size 3) and cifar-cnn's (size 9), even sizes (asymmetric padding), windows wider
    than the channels, and large values (alpha 1: the mean dominates k)."""
    ours = LocalResponseNorm(size, alpha, beta, k)
    ref = nn.LocalResponseNorm(size, alpha, beta, k)
    for name, x in _inputs(shape, 7).items():
        if name == "all-inf":
            continue                                # inf / inf: NaN either way, nothing to compare but NaN bits
        for scale in (1.0, 30.0):
            xa = (x * scale).requires_grad_()
            xb = (x * scale).requires_grad_()
            ya, yb = ours(xa), ref(xb)
            assert ya.grad_fn is not None and "ChannelWindowMean" in str(_graph_nodes(ya)), "compiled path not taken"
            assert np.array_equal(_bits(ya), _bits(yb)), (name, scale)
            g = torch.randn(shape, generator=torch.Generator().manual_seed(9))
            ya.backward(g)
            yb.backward(g)
            assert np.array_equal(_bits(xa.grad), _bits(xb.grad)), (name, scale)


def _graph_nodes(y: torch.Tensor) -> list[str]:
    seen, todo = [], [y.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or type(node).__name__ in seen:
            continue
        seen.append(type(node).__name__)
        todo += [f for f, _ in node.next_functions]
    return seen


@needs_ext
def test_lrn_mean_by_hand():
    """lrn_mean on one pixel of 4 channels, size 3 (one zero channel padded on each side):
    out[c] = (x[c-1]^2 + x[c]^2 + x[c+1]^2) / 3 with the missing neighbours 0."""
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 4, 1, 1)
    mean = compiled._ChannelWindowMean.apply(x * x, 3).flatten().tolist()
    assert mean == pytest.approx([(1 + 4) / 3, (1 + 4 + 9) / 3, (4 + 9 + 16) / 3, (9 + 16) / 3], rel=1e-7)
    s = torch.ones(1, 4, 1, 1, requires_grad=True)
    compiled._ChannelWindowMean.apply(s, 3).backward(torch.tensor([3.0, 6.0, 9.0, 12.0]).view(1, 4, 1, 1))
    # channel c gets grad[o] / 3 from every output o whose window holds it: o in c-1 .. c+1
    assert s.grad.flatten().tolist() == pytest.approx([1 + 2, 1 + 2 + 3, 2 + 3 + 4, 3 + 4], rel=1e-7)
