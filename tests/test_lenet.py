"""The authors' Caffe LeNet (geodml.models.lenet) and its norm layers (geodml.models.norms),
checked against the released prototxts (github.com/kevinhsieh/non_iid_dml,
apps/caffe/examples/cifar10/2parts/{lenet,bnlenet,gnlenet,brnlenet}_train_val.prototxt.template)
and against numbers worked out by hand.

Parameter counts (conv in*out*25 weights + out biases; ip1 in*10 + 10; the BN/GN/BRN variants
have no conv biases and parameter-free norm layers). Caffe's 3/2 pool: ceil((h - 3) / 2) + 1.
  3x32x32: sides 32 -> 16 -> 8 -> 4. conv1 3*25*32+32 = 2,432; conv2 32*25*32+32 = 25,632;
           conv3 32*25*64+64 = 51,264; ip1 64*4*4*10+10 = 10,250        -> 89,578
           normalized: 2,400 + 25,600 + 51,200 + 10,250                -> 89,450
  1x28x28: sides 28 -> 14 -> 7 -> 3. conv1 1*25*32+32 = 832; ip1 64*3*3*10+10 = 5,770
           -> 832 + 25,632 + 51,264 + 5,770 = 83,498; normalized 800 + 25,600 + 51,200 + 5,770 = 83,370
  1x8x8:   sides 8 -> 4 -> 2 -> 1. ip1 64*10+10 = 650
           -> 832 + 25,632 + 51,264 + 650 = 78,378; normalized 800 + 25,600 + 51,200 + 650 = 78,250
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from geodml.config import MODEL_NORM_CHANNELS, ModelConfig
from geodml.models import build_from_config, build_model, count_parameters
from geodml.models.lenet import LeNet, caffe_pool_side, lenet_geometry
from geodml.models.norms import BatchReNorm2d, BatchReNormSchedule, CaffeBatchNorm2d, group_count

CIFAR, MNIST, DIGITS = (3, 32, 32), (1, 28, 28), (1, 8, 8)
NORMALIZED = ("batch", "group", "batchrenorm")


def test_lenet_parameter_count_is_the_authors():
    assert count_parameters(build_model("lenet", "none", CIFAR, 10)) == 89_578


@pytest.mark.parametrize("shape, plain, normalized", [(CIFAR, 89_578, 89_450), (MNIST, 83_498, 83_370),
                                                      (DIGITS, 78_378, 78_250)])
def test_parameter_counts_by_hand(shape, plain, normalized):
    assert count_parameters(build_model("lenet", "none", shape, 10)) == plain
    for norm in NORMALIZED:
        assert count_parameters(build_model("lenet", norm, shape, 10)) == normalized


def test_layers_are_the_prototxts():
    m = build_model("lenet", "none", CIFAR, 10)
    convs = [m.conv1, m.conv2, m.conv3]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs] == [
        (3, 32, (5, 5), (1, 1), (2, 2)), (32, 32, (5, 5), (1, 1), (2, 2)), (32, 64, (5, 5), (1, 1), (2, 2))]
    assert all(c.bias is not None for c in convs)
    assert isinstance(m.pool1, nn.MaxPool2d) and isinstance(m.pool2, nn.AvgPool2d) and isinstance(m.pool3, nn.AvgPool2d)
    assert all(p.kernel_size == 3 and p.stride == 2 and p.ceil_mode for p in (m.pool1, m.pool2, m.pool3))
    for lrn in (m.norm1, m.norm2):
        assert isinstance(lrn, nn.LocalResponseNorm)
        assert (lrn.size, lrn.alpha, lrn.beta, lrn.k) == (3, 5e-5, 0.75, 1.0)
    assert (m.ip1.in_features, m.ip1.out_features) == (64 * 4 * 4, 10)
    for norm in NORMALIZED:
        n = build_model("lenet", norm, CIFAR, 10)
        assert all(c.bias is None for c in (n.conv1, n.conv2, n.conv3)) and n.ip1.bias is not None
        assert not any(isinstance(x, nn.LocalResponseNorm) for x in n.modules())
        assert sum(p.numel() for x in (n.norm1, n.norm2, n.norm3) for p in x.parameters()) == 0


def _call_order(model: nn.Module, x: torch.Tensor) -> list[str]:
    order: list[str] = []
    hooks = [mod.register_forward_hook(lambda mod, i, o, name=name: order.append(name))
             for name, mod in model.named_children()]
    model(x)
    for h in hooks:
        h.remove()
    return order


def test_layer_order_plain_and_normalized():
    x = torch.randn(2, *CIFAR)
    # lenet_train_val: conv1, pool1 (max), relu1, norm1 (LRN), conv2, relu2, pool2 (ave), norm2 (LRN), conv3, relu3, pool3
    assert _call_order(build_model("lenet", "none", CIFAR, 10), x) == [
        "conv1", "pool1", "relu", "norm1", "conv2", "relu", "pool2", "norm2", "conv3", "relu", "pool3", "ip1"]
    # bnlenet/gnlenet/brnlenet: conv1, pool1, bn1, relu1, conv2, bn2, relu2, pool2, conv3, bn3, relu3, pool3, ip1
    for norm in NORMALIZED:
        assert _call_order(build_model("lenet", norm, CIFAR, 10), x) == [
            "conv1", "pool1", "norm1", "relu", "conv2", "norm2", "relu", "pool2", "conv3", "norm3", "relu", "pool3",
            "ip1"]


def test_caffe_pooling_rounds_up():
    assert [caffe_pool_side(s) for s in (32, 16, 8, 28, 14, 7, 4, 2)] == [16, 8, 4, 14, 7, 3, 2, 1]
    assert lenet_geometry(32, 32) == (4, 4) and lenet_geometry(28, 28) == (3, 3) and lenet_geometry(8, 8) == (1, 1)
    with pytest.raises(ValueError, match="at least 8x8"):
        lenet_geometry(7, 8)
    m = build_model("lenet", "none", CIFAR, 10)
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    # windows rows/cols {0,1,2} and {2,3}: a window past the edge averages only the pixels inside it
    # (0+1+2+4+5+6+8+9+10)/9 = 5; (2+3+6+7+10+11)/6 = 6.5; (8+9+10+12+13+14)/6 = 11; (10+11+14+15)/4 = 12.5
    assert m.pool2(x).tolist() == [[[[5.0, 6.5], [11.0, 12.5]]]]
    assert m.pool1(x).tolist() == [[[[10.0, 11.0], [14.0, 15.0]]]]


def test_lrn_by_hand():
    m = build_model("lenet", "none", CIFAR, 10)
    x = torch.tensor([1.0, 2.0, 3.0]).reshape(1, 3, 1, 1)
    # Caffe ACROSS_CHANNELS: y_c = x_c / (1 + alpha/3 * sum of x^2 over channels c-1..c+1) ** 0.75
    sums = [1 + 4, 1 + 4 + 9, 4 + 9]
    expected = [v / (1 + 5e-5 / 3 * s) ** 0.75 for v, s in zip([1.0, 2.0, 3.0], sums)]
    torch.testing.assert_close(m.norm1(x).flatten(), torch.tensor(expected), rtol=1e-6, atol=0)


def test_gaussian_initialization_as_the_prototxt():
    m = build_model("lenet", "none", CIFAR, 10, generator_seed=0)
    for name, std in (("conv1", 1e-4), ("conv2", 0.01), ("conv3", 0.01), ("ip1", 0.01)):
        w = getattr(m, name).weight.detach()
        assert abs(float(w.std()) / std - 1) < 0.1, name  # >= 2,400 draws: relative error ~2%
        assert abs(float(w.mean())) < 0.1 * std, name
        assert torch.count_nonzero(getattr(m, name).bias) == 0


def test_groupnorm_readings():
    text = build_model("lenet", "group", CIFAR, 10)
    assert [g.num_groups for g in (text.norm1, text.norm2, text.norm3)] == [16, 16, 32]  # G_size = 2
    code = build_model("lenet", "group", CIFAR, 10, gn_groups=2)
    assert [g.num_groups for g in (code.norm1, code.norm2, code.norm3)] == [2, 2, 2]  # group_num: 2
    assert all(not g.affine and g.eps == 1e-5 for g in (code.norm1, code.norm2, code.norm3))
    assert group_count(64, group_size=4) == 16 and group_count(64, groups=2) == 2
    with pytest.raises(ValueError, match="not both"):
        build_model("lenet", "group", CIFAR, 10, gn_groups=2, gn_group_size=2)
    with pytest.raises(ValueError, match="divisible"):
        group_count(32, groups=3)
    cnn = build_model("cnn", "group", CIFAR, 10, gn_groups=4)
    assert [g.num_groups for g in cnn.modules() if isinstance(g, nn.GroupNorm)] == [4, 4]


def test_config_channels_registry_matches_models():
    for name, channels in MODEL_NORM_CHANNELS.items():
        m = build_model(name, "group", CIFAR, 10, gn_group_size=1)
        assert tuple(dict.fromkeys(g.num_channels for g in m.modules() if isinstance(g, nn.GroupNorm))) == \
            tuple(dict.fromkeys(channels))


def test_config_group_options():
    assert ModelConfig(model="lenet", norm="group", gn_groups=2).gn_groups == 2
    with pytest.raises(ValueError, match="give one"):
        ModelConfig(model="lenet", norm="group", gn_groups=2, gn_group_size=2)
    with pytest.raises(ValueError, match="do not divide"):
        ModelConfig(model="resnet20", norm="group", gn_groups=32)  # 16-channel stage
    with pytest.raises(ValueError, match="not available"):
        ModelConfig(model="cnn", norm="batchrenorm")
    with pytest.raises(ValueError, match="step_to_init must come before"):
        ModelConfig(model="lenet", norm="batchrenorm", brn_steps=(10.0, 10.0, 20.0))
    with pytest.raises(ValueError, match="whole step counts"):
        ModelConfig(model="lenet", norm="batchrenorm", brn_steps=(1.5, 10.0, 20.0))
    m = build_from_config(ModelConfig(model="lenet", norm="batchrenorm", brn_steps=(1.0, 3.0, 5.0), brn_r_max=2.0,
                                      brn_d_max=1.0, brn_average_fraction=0.5), CIFAR, 10)
    assert m.norm1.schedule == BatchReNormSchedule(step_to_init=1, step_to_r_max=3, step_to_d_max=5, r_max=2.0,
                                                   d_max=1.0, moving_average_fraction=0.5)


# ---- BatchNorm and BatchReNorm as the authors' Caffe layers ---------------------------------------

def test_brn_schedule_by_hand():
    s = BatchReNormSchedule()  # 2parts/brnlenet: init 5000, r_max 4 at 20000, d_max 6 at 20000
    assert s.limits(4999) is None
    r, d = s.limits(5000)  # j = 1: 1 + 3/15000, 6/15000
    assert math.isclose(r, 1.0002) and math.isclose(d, 0.0004)
    assert s.limits(19999) == (4.0, 6.0) and s.limits(10 ** 6) == (4.0, 6.0)
    r, d = s.limits(12499)  # j = 7500: 1 + 7500 * 3/15000 = 2.5, 7500 * 6/15000 = 3
    assert math.isclose(r, 2.5) and math.isclose(d, 3.0)


def test_brn_forward_by_hand():
    """One channel, schedule init 1, r_max 2 at step 3, d_max 1 at step 5, fraction 0.5.

    step 0 (plain BN), batch [1, 3]: mean 2, var 1 -> y = (x - 2)/sqrt(1 + eps) = [-1, 1];
      moving: W = 1, mean 2, var 2/(2-1) * 1 = 2.
    step 1, batch [4, 8]: mean 6, var 4, sigma_B = 2; j = 1: r_max 1 + 1/2 = 1.5, d_max 1/4 = 0.25;
      sigma = sqrt(2) -> r = 2/sqrt(2) = 1.41421 (inside 1/1.5..1.5), d = (6 - 2)/sqrt(2) = 2.83 -> 0.25;
      y = [-1, 1] * 1.41421 + 0.25 = [-1.16421, 1.66421];
      moving: W = 0.5 + 1 = 1.5, mean (0.5*2 + 6)/1.5 = 4.6667, var (0.5*2 + 2*4)/1.5 = 6.
    eval, x = 5: (5 - 4.6667)/sqrt(6) = 0.13608.
    """
    layer = BatchReNorm2d(1, BatchReNormSchedule(step_to_init=1, step_to_r_max=3, step_to_d_max=5, r_max=2.0,
                                                 d_max=1.0, moving_average_fraction=0.5)).train()
    y0 = layer(torch.tensor([1.0, 3.0]).reshape(2, 1, 1, 1))
    torch.testing.assert_close(y0.flatten(), torch.tensor([-1.0, 1.0]), atol=1e-4, rtol=0)
    y1 = layer(torch.tensor([4.0, 8.0]).reshape(2, 1, 1, 1))
    torch.testing.assert_close(y1.flatten(), torch.tensor([-1.16421, 1.66421]), atol=1e-4, rtol=0)
    assert int(layer.step) == 2
    torch.testing.assert_close(layer.running_mean, torch.tensor([14 / 3]))
    torch.testing.assert_close(layer.running_var, torch.tensor([6.0]))
    layer.eval()
    torch.testing.assert_close(layer(torch.tensor([5.0]).reshape(1, 1, 1, 1)).flatten(), torch.tensor([0.13608]),
                               atol=1e-4, rtol=0)
    assert int(layer.step) == 2  # evaluation is no training step


def _caffe_brn_reference(batches: list[np.ndarray], s: BatchReNormSchedule, test: np.ndarray):
    """Caffe's BatchReNormLayer in float64, with its own unnormalized sums S and weight W."""
    c = batches[0].shape[1]
    s_mean, s_var, w = np.zeros(c), np.zeros(c), 0.0
    outs = []
    for step, x in enumerate(batches):
        mean = x.mean(axis=(0, 2, 3))
        var = ((x - mean[None, :, None, None]) ** 2).mean(axis=(0, 2, 3))
        y = (x - mean[None, :, None, None]) / np.sqrt(var + s.eps)[None, :, None, None]
        if step >= s.step_to_init:
            j = step - s.step_to_init + 1
            r_max = max(1.0, min(1 + j * (s.r_max - 1) / (s.step_to_r_max - s.step_to_init), s.r_max))
            d_max = max(0.0, min(j * s.d_max / (s.step_to_d_max - s.step_to_init), s.d_max))
            sigma = np.sqrt(s_var / w + s.eps)
            r = np.clip(np.sqrt(var + s.eps) / sigma, 1 / r_max, r_max)
            d = np.clip((mean - s_mean / w) / sigma, -d_max, d_max)
            y = y * r[None, :, None, None] + d[None, :, None, None]
        m = x.size // c
        f = s.moving_average_fraction
        w, s_mean, s_var = f * w + 1, f * s_mean + mean, f * s_var + m / (m - 1) * var
        outs.append(y)
    test_out = (test - (s_mean / w)[None, :, None, None]) / np.sqrt(s_var / w + s.eps)[None, :, None, None]
    return outs, test_out


def test_brn_matches_a_numpy_reference_of_the_caffe_layer():
    rng = np.random.default_rng(0)
    sched = BatchReNormSchedule(step_to_init=2, step_to_r_max=5, step_to_d_max=4, r_max=3.0, d_max=2.0,
                                moving_average_fraction=0.9)
    # batches whose statistics drift, so r and d are clipped at some steps and not at others
    batches = [rng.normal(loc=0.5 * t, scale=1 + 0.4 * t, size=(4, 3, 3, 2)) for t in range(7)]
    test = rng.normal(size=(5, 3, 3, 2))
    want, want_test = _caffe_brn_reference(batches, sched, test)
    layer = BatchReNorm2d(3, sched).train()
    for x, ref in zip(batches, want):
        np.testing.assert_allclose(layer(torch.tensor(x, dtype=torch.float32)).detach().numpy(), ref, rtol=1e-4,
                                   atol=1e-5)
    layer.eval()
    np.testing.assert_allclose(layer(torch.tensor(test, dtype=torch.float32)).detach().numpy(), want_test,
                               rtol=1e-4, atol=1e-5)
    # Caffe BatchNorm = BatchReNorm that never renormalizes (same moving averages)
    bn = CaffeBatchNorm2d(3, moving_average_fraction=0.9).train()
    plain, plain_test = _caffe_brn_reference(batches, BatchReNormSchedule(
        step_to_init=10 ** 6, step_to_r_max=10 ** 6 + 1, step_to_d_max=10 ** 6 + 1, moving_average_fraction=0.9), test)
    for x, ref in zip(batches, plain):
        np.testing.assert_allclose(bn(torch.tensor(x, dtype=torch.float32)).detach().numpy(), ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn.eval()(torch.tensor(test, dtype=torch.float32)).detach().numpy(), plain_test,
                               rtol=1e-4, atol=1e-5)


def test_brn_gradient_is_r_times_the_bn_gradient():
    """r and d are constants for the gradient (Ioffe 2017; Caffe multiplies BN's input gradient by r)."""
    sched = BatchReNormSchedule(step_to_init=1, step_to_r_max=2, step_to_d_max=2, r_max=5.0, d_max=5.0,
                                moving_average_fraction=0.5)
    brn, bn = BatchReNorm2d(2, sched).train(), CaffeBatchNorm2d(2, moving_average_fraction=0.5).train()
    g = torch.Generator().manual_seed(1)
    first = torch.randn(6, 2, 2, 2, generator=g)
    brn(first)
    bn(first)
    x = (torch.randn(6, 2, 2, 2, generator=g) * 3 + 1).requires_grad_()
    weights = torch.randn(6, 2, 2, 2, generator=g)
    (brn(x) * weights).sum().backward()
    g_brn = x.grad.clone()
    x.grad = None
    (bn(x) * weights).sum().backward()
    sigma_b = torch.sqrt(x.detach().var(dim=(0, 2, 3), unbiased=False) + 1e-5)
    r = (sigma_b / torch.sqrt(torch.tensor([first[:, c].var(unbiased=True) for c in range(2)]) + 1e-5)).clamp(0.2, 5)
    torch.testing.assert_close(g_brn, x.grad * r[None, :, None, None], rtol=1e-4, atol=1e-6)


def test_caffe_bn_evaluation_before_training_divides_by_sqrt_eps():
    bn = CaffeBatchNorm2d(1).eval()  # W = 0: Caffe's scale factor 0 -> mean 0, var 0
    torch.testing.assert_close(bn(torch.ones(1, 1, 1, 1)).flatten(), torch.tensor([1 / math.sqrt(1e-5)]))


def test_brn_statistics_are_buffers_and_the_step_is_not_averaged():
    m = LeNet(*CIFAR, 10, "batchrenorm")
    floats = {n for n, b in m.named_buffers() if b.is_floating_point()}
    assert floats == {f"norm{i}.{k}" for i in (1, 2, 3) for k in ("running_mean", "running_var", "average_weight")}
    assert {n for n, b in m.named_buffers() if not b.is_floating_point()} == {"norm1.step", "norm2.step", "norm3.step"}


@pytest.mark.parametrize("norm", ("none", *NORMALIZED))
def test_one_sgd_step_reduces_the_loss(norm):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, *DIGITS, generator=g) * 50  # Caffe's input scale (raw pixels minus the mean)
    y = torch.randint(0, 10, (8,), generator=g)
    m = build_model("lenet", norm, DIGITS, 10, generator_seed=0).train()
    loss_fn = nn.CrossEntropyLoss()
    loss = loss_fn(m(x), y)
    loss.backward()
    with torch.no_grad():
        for p in m.parameters():
            p -= 0.05 * p.grad
    # train mode throughout, as the trainer steps: before step_to_init BN and BRN normalize with the
    # batch's own statistics, the same for both losses, so the comparison measures the weight change only
    assert loss_fn(m(x), y).item() < loss.item()


@pytest.mark.parametrize("norm", ["none", "batch"])
def test_input_at_caffes_pixel_scale(norm):
    """LeNet(input_scale=s) on x is LeNet on x * s, bit for bit; build_from_config passes the dataset's pixel std."""
    x = torch.randn(4, *DIGITS, generator=torch.Generator().manual_seed(1))
    scaled = build_model("lenet", norm, DIGITS, 10, generator_seed=0, input_scale=93.5)
    plain = build_model("lenet", norm, DIGITS, 10, generator_seed=0)
    assert torch.equal(scaled(x), plain(x * 93.5))
    assert build_from_config(ModelConfig(model="lenet"), DIGITS, 10, pixel_std=63.0).input_scale == 63.0
    assert not any(b.is_floating_point() for b in scaled.buffers()) or norm != "none"  # a constant, not a buffer
    assert not hasattr(build_from_config(ModelConfig(model="cnn"), DIGITS, 10, pixel_std=63.0), "input_scale")
    with pytest.raises(ValueError, match="input_scale must be a finite number > 0"):
        build_model("lenet", "none", DIGITS, 10, input_scale=0.0)


def test_cli_flags_and_the_warning_for_an_unused_norm_option():
    from geodml.cli import parse_config
    warnings: list[str] = []
    cfg = parse_config(["--model", "lenet", "--norm", "group", "--gn-groups", "2"], warn=warnings.append)
    assert (cfg.model.model, cfg.model.norm, cfg.model.gn_groups, cfg.model.gn_group_size) == ("lenet", "group", 2, None)
    assert warnings == []
    cfg = parse_config(["--model", "lenet", "--norm", "batchrenorm", "--brn-steps", "100,400,300"], warn=warnings.append)
    assert cfg.model.brn_steps == (100.0, 400.0, 300.0) and warnings == []
    parse_config(["--gn-groups", "2", "--brn-r-max", "3"], warn=warnings.append)
    assert warnings == ["geodml: warning: --gn-groups, --brn-r-max has no effect with --norm none"]
    assert parse_config([]).model.model == "cnn"  # the default keeps the meaning of earlier runs


def _flat_mults(model, cfg_mults="prototxt", name="lenet", norm="none"):
    from geodml.algorithms.base import FlatParams
    from geodml.models import param_multipliers
    return FlatParams(model, param_multipliers(ModelConfig(model=name, norm=norm, param_mults=cfg_mults), model))


def test_prototxt_multipliers_are_the_prototxts():
    # lenet_train_val.prototxt: conv1/conv2 bias lr_mult 2, conv3 no param block, ip1 weight
    # decay_mult 250, ip1 bias lr_mult 2 decay_mult 0; on CIFAR shapes ip1 has 64*4*4*10 weights.
    flat = _flat_mults(build_model("lenet", "none", CIFAR, 10))
    lr, decay = flat.lr_mult, flat.decay_mult
    assert lr is not None and decay is not None and lr.numel() == 89_578
    assert int((lr == 2).sum()) == 32 + 32 + 10 and int((lr == 1).sum()) == 89_578 - 74
    assert int((decay == 250).sum()) == 10_240 and int((decay == 0).sum()) == 10
    assert int((decay == 1).sum()) == 89_578 - 10_240 - 10
    conv2_bias = 3 * 32 * 25 + 32 + 32 * 32 * 25  # after conv1's weight and bias and conv2's weight
    assert torch.equal(lr[conv2_bias:conv2_bias + 32], torch.full((32,), 2.0)) and float(lr[conv2_bias - 1]) == 1.0
    # bn/gn/brnlenet: only ip1's bias has decay_mult 0; no lr multiplier at all
    for norm in NORMALIZED:
        flat = _flat_mults(build_model("lenet", norm, CIFAR, 10))
        assert flat.lr_mult is None and flat.decay_mult is not None
        assert int((flat.decay_mult == 0).sum()) == 10 and float(flat.decay_mult[-10:].sum()) == 0.0
    # resnet20 prototxts: conv / fc weights decay_mult 2, fc bias 0, the Scale (norm affine) 1
    flat = _flat_mults(build_model("resnet20", "batch", CIFAR, 10), name="resnet20", norm="batch")
    assert flat.lr_mult is None and flat.decay_mult is not None
    conv_fc_weights = 16 * 3 * 9 + 6 * 16 * 16 * 9 + (32 * 16 + 5 * 32 * 32) * 9 + (64 * 32 + 5 * 64 * 64) * 9 + 640
    assert int((flat.decay_mult == 2).sum()) == conv_fc_weights
    assert int((flat.decay_mult == 0).sum()) == 10
    assert int((flat.decay_mult == 1).sum()) == 2 * (16 * 7 + 32 * 6 + 64 * 6)  # 19 norms: weight and bias
    assert _flat_mults(build_model("lenet", "none", CIFAR, 10), "none").lr_mult is None


def test_regularize_by_hand():
    from geodml.algorithms.base import FlatParams, regularize
    lin = nn.Linear(2, 1)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0]]))
        lin.bias.copy_(torch.tensor([3.0]))
    flat = FlatParams(lin, {"weight": (1.0, 250.0), "bias": (2.0, 0.0)})
    flat.grad.copy_(torch.tensor([0.1, 0.2, 0.3]))
    regularize(flat, 0.001)
    # weight: g + 0.001 * 250 * w = 0.1 + 0.25, 0.2 + 0.5; bias: 2 * (0.3 + 0)
    torch.testing.assert_close(flat.grad, torch.tensor([0.35, 0.7, 0.6]))
    plain = FlatParams(nn.Linear(2, 1))
    plain.data.copy_(torch.tensor([1.0, 2.0, 3.0]))
    plain.grad.copy_(torch.tensor([0.1, 0.2, 0.3]))
    regularize(plain, 0.001)
    torch.testing.assert_close(plain.grad, torch.tensor([0.101, 0.202, 0.303]))
    with pytest.raises(ValueError, match="name no trainable parameter of the model: nope"):
        FlatParams(nn.Linear(2, 1), {"nope": (1.0, 1.0)})


def test_param_mults_needs_an_authors_model(tmp_path, capsys):
    from geodml.cli import main
    with pytest.raises(ValueError, match="--param-mults prototxt needs a network from the authors' Caffe files"):
        ModelConfig(model="cnn", param_mults="prototxt")
    out = tmp_path / "never"
    assert main(["--model", "mlp", "--param-mults", "prototxt", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[0] == (
        "geodml: error: --param-mults prototxt needs a network from the authors' Caffe files "
        "(--model lenet or --model resnet20), not --model mlp")
    assert not out.exists()
