"""Tests of geodml.models against parameter counts worked out by hand.

Hand arithmetic (a conv/linear layer has in*out*k*k weights + out biases; a BatchNorm or
GroupNorm layer has 2*C affine parameters; a layer followed by a norm has no bias):

CNN (McMahan et al. 2017's CNN; geodml's "cnn" before issue 21), norm none:
  3x32x32: conv1 3*25*32+32 = 2,432; 32->28->14; conv2 32*25*64+64 = 51,264; 14->10->5;
           fc1 64*5*5*512+512 = 819,712; fc2 512*10+10 = 5,130        -> 878,538
  1x28x28: conv1 1*25*32+32 = 832; 28->24->12; conv2 51,264; 12->8->4;
           fc1 64*4*4*512+512 = 524,800; fc2 5,130                    -> 582,026
  1x8x8:   padding 2: 8->8->4->4->2; conv1 832; conv2 51,264;
           fc1 64*2*2*512+512 = 131,584; fc2 5,130                    -> 188,810
BN-/GN-CNN (norm after each conv): drop conv biases (-32-64), add 2*32+2*64 = 192
  -> +96: 878,634 / 582,122 / 188,906
BN-CNN with norm_fc1: also drop fc1 bias (-512) and add BatchNorm1d(512) (+1,024) -> +512 more:
  879,146 / 582,634 / 189,418
ResNet-20, option A, 3x32x32, 10 classes:
  conv1 3*9*16 = 432 + bn 32; stage1 6*16*9*16 = 13,824 + 6*32 = 192;
  stage2 16*9*32 + 5*32*9*32 = 4,608 + 46,080 = 50,688 + 6*64 = 384;
  stage3 32*9*64 + 5*64*9*64 = 18,432 + 184,320 = 202,752 + 6*128 = 768; fc 64*10+10 = 650
  -> 269,722 (GroupNorm has the same affine size). 1 input channel: conv1 1*9*16 = 144 -> 269,434.
logreg: D*10+10 with D = 3,072 / 784 / 64 -> 30,730 / 7,850 / 650.
mlp (McMahan 2NN): D*200+200 + 200*200+200 + 200*10+10
  -> 3,072: 614,600+40,200+2,010 = 656,810; 784: 157,000+40,200+2,010 = 199,210;
     64: 13,000+40,200+2,010 = 55,210.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from geodml.models import MODEL_NAMES, MODEL_NORMS, build_model, count_parameters
from geodml.models.cnn import CNN, cnn_geometry

CIFAR = (3, 32, 32)
MNIST = (1, 28, 28)
DIGITS = (1, 8, 8)
SHAPES = (CIFAR, MNIST, DIGITS)
COMBOS = [(name, norm) for name in MODEL_NAMES for norm in MODEL_NORMS[name]]


@pytest.mark.parametrize("shape, expected", [(CIFAR, 878_538), (MNIST, 582_026), (DIGITS, 188_810)])
def test_cnn_parameter_count(shape, expected):
    assert count_parameters(build_model("cnn", "none", shape, 10)) == expected


def test_cnn_cifar_layer_sizes():
    m = build_model("cnn", "none", CIFAR, 10)
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in (m.conv1, m.conv2, m.fc1, m.fc2)]
    assert sizes == [2432, 51264, 819712, 5130]


@pytest.mark.parametrize("norm", ["batch", "group"])
@pytest.mark.parametrize("shape, expected", [(CIFAR, 878_634), (MNIST, 582_122), (DIGITS, 188_906)])
def test_normalized_cnn_parameter_count(norm, shape, expected):
    assert count_parameters(build_model("cnn", norm, shape, 10)) == expected


@pytest.mark.parametrize("shape, expected", [(CIFAR, 879_146), (MNIST, 582_634), (DIGITS, 189_418)])
def test_bn_cnn_with_fc1_norm_parameter_count(shape, expected):
    m = CNN(*shape, 10, "batch", norm_fc1=True)
    assert isinstance(m.norm_fc1, nn.BatchNorm1d) and m.fc1.bias is None
    assert count_parameters(m) == expected


def test_fc1_groupnorm_is_refused():
    # Two scalars per group normalize to +-1: the magnitude of fc1's output would be lost.
    with pytest.raises(ValueError, match="norm_fc1"):
        CNN(*CIFAR, 10, "group", norm_fc1=True)


@pytest.mark.parametrize("shape, padding, flat", [
    (CIFAR, 0, 64 * 5 * 5), (MNIST, 0, 64 * 4 * 4), (DIGITS, 2, 64 * 2 * 2),
    ((1, 16, 16), 0, 64 * 1 * 1),   # smallest unpadded: 16->12->6->2->1
    ((1, 15, 15), 2, 64 * 3 * 3),   # 15 would vanish unpadded; 'same': 15->7->3
    ((1, 4, 4), 2, 64 * 1 * 1),
])
def test_cnn_shape_rule(shape, padding, flat):
    m = build_model("cnn", "none", shape, 10)
    assert (m.padding, m.flatten_features) == (padding, flat)
    assert m(torch.zeros(1, *shape)).shape == (1, 10)


def test_cnn_rejects_tiny_input():
    with pytest.raises(ValueError, match="at least 4x4"):
        cnn_geometry(3, 8)


@pytest.mark.parametrize("norm", ["batch", "group"])
@pytest.mark.parametrize("shape, expected", [(CIFAR, 269_722), (MNIST, 269_434), (DIGITS, 269_434)])
def test_resnet20_parameter_count(norm, shape, expected):
    assert count_parameters(build_model("resnet20", norm, shape, 10)) == expected


def test_resnet20_has_20_weighted_layers_and_option_a_shortcuts():
    m = build_model("resnet20", "batch", CIFAR, 10)
    convs = [x for x in m.modules() if isinstance(x, nn.Conv2d)]
    linears = [x for x in m.modules() if isinstance(x, nn.Linear)]
    assert len(convs) + len(linears) == 20
    assert all(c.kernel_size == (3, 3) for c in convs)  # no 1x1 projection shortcuts (option B)


@pytest.mark.parametrize("shape, expected", [(CIFAR, 30_730), (MNIST, 7_850), (DIGITS, 650)])
def test_logreg_parameter_count(shape, expected):
    assert count_parameters(build_model("logreg", "none", shape, 10)) == expected


@pytest.mark.parametrize("shape, expected", [(CIFAR, 656_810), (MNIST, 199_210), (DIGITS, 55_210)])
def test_mlp_parameter_count(shape, expected):
    assert count_parameters(build_model("mlp", "none", shape, 10)) == expected


@pytest.mark.parametrize("name, norm", COMBOS)
@pytest.mark.parametrize("shape", SHAPES)
def test_output_shape(name, norm, shape):
    m = build_model(name, norm, shape, 7, generator_seed=0)
    out = m(torch.randn(3, *shape))
    assert out.shape == (3, 7) and out.dtype == torch.float32 and torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())


@pytest.mark.parametrize("name", ["cnn", "resnet20"])
def test_groupnorm_has_two_channels_per_group(name):
    m = build_model(name, "group", CIFAR, 10)
    gns = [x for x in m.modules() if isinstance(x, nn.GroupNorm)]
    assert gns and not any(isinstance(x, nn.modules.batchnorm._BatchNorm) for x in m.modules())
    assert all(g.num_groups == g.num_channels // 2 for g in gns)
    # CNN: 32 -> 16 groups, 64 -> 32; ResNet-20 stages: 16/32/64 -> 8/16/32 groups.
    expected = {16, 32} if name == "cnn" else {8, 16, 32}
    assert {g.num_groups for g in gns} == expected


def test_bn_cnn_normalizes_after_each_conv_only():
    m = build_model("cnn", "batch", CIFAR, 10)
    bns = [x for x in m.modules() if isinstance(x, nn.modules.batchnorm._BatchNorm)]
    assert [type(b) for b in bns] == [nn.BatchNorm2d, nn.BatchNorm2d]
    assert [b.num_features for b in bns] == [32, 64]
    assert m.conv1.bias is None and m.conv2.bias is None and m.fc1.bias is not None


def test_groupnorm_output_is_independent_of_other_samples_in_train_mode():
    # The property §5.2 relies on: GN normalizes each sample on its own, BN over the batch.
    x = torch.randn(4, *CIFAR)
    gn = build_model("cnn", "group", CIFAR, 10, generator_seed=1).train()
    torch.testing.assert_close(gn(x)[:1], gn(x[:1]))
    bn = build_model("cnn", "batch", CIFAR, 10, generator_seed=1).train()
    assert not torch.allclose(bn(x)[:1], bn(x[:2])[:1])


def test_bn_cnn_eval_is_deterministic_and_per_sample():
    m = build_model("cnn", "batch", CIFAR, 10, generator_seed=3)
    m.train()
    with torch.no_grad():
        m(torch.randn(8, *CIFAR) * 2 + 1)  # move the running statistics away from (0, 1)
    m.eval()
    x = torch.randn(5, *CIFAR)
    with torch.no_grad():
        a, b, first = m(x), m(x), m(x[:1])
    assert torch.equal(a, b)
    torch.testing.assert_close(a[:1], first)  # eval uses running stats, not the batch


@pytest.mark.parametrize("name, norm", COMBOS)
def test_same_seed_same_weights_different_seed_different(name, norm):
    a = build_model(name, norm, DIGITS, 10, generator_seed=42).state_dict()
    b = build_model(name, norm, DIGITS, 10, generator_seed=42).state_dict()
    c = build_model(name, norm, DIGITS, 10, generator_seed=43).state_dict()
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_generator_seed_leaves_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    expected_next = torch.rand(4)
    torch.set_rng_state(before)
    for name, norm in COMBOS:
        build_model(name, norm, CIFAR, 10, generator_seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(torch.rand(4), expected_next)


def test_seeded_build_does_not_depend_on_global_rng():
    torch.manual_seed(0)
    a = build_model("cnn", "group", DIGITS, 10, generator_seed=5).state_dict()
    torch.manual_seed(999)
    torch.rand(10)
    b = build_model("cnn", "group", DIGITS, 10, generator_seed=5).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_unseeded_build_uses_global_rng():
    torch.manual_seed(11)
    a = build_model("mlp", "none", DIGITS, 10).state_dict()
    torch.manual_seed(11)
    b = build_model("mlp", "none", DIGITS, 10).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("norm", MODEL_NORMS["cnn"])
def test_one_sgd_step_reduces_cnn_loss(norm):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, *DIGITS, generator=g)
    y = torch.randint(0, 10, (8,), generator=g)
    m = build_model("cnn", norm, DIGITS, 10, generator_seed=0)
    # Train mode throughout, as the trainer steps: BN uses the same batch's statistics for
    # both losses, so the comparison measures the weight change only.
    loss_fn = nn.CrossEntropyLoss()
    m.train()
    loss = loss_fn(m(x), y)
    loss.backward()
    with torch.no_grad():
        for p in m.parameters():
            p -= 0.01 * p.grad
    after = loss_fn(m(x), y)
    assert after.item() < loss.item()


@pytest.mark.parametrize("args, match", [
    (("alexnet", "none", CIFAR, 10), "unknown model 'alexnet'; choose one of cnn, lenet, resnet20, logreg, mlp"),
    (("cnn", "layer", CIFAR, 10), "unknown norm 'layer'; choose one of none, batch, group, batchrenorm"),
    (("resnet20", "none", CIFAR, 10), "does not support norm 'none'; use one of batch, group"),
    (("logreg", "batch", CIFAR, 10), "does not support norm 'batch'; use one of none"),
    (("mlp", "group", CIFAR, 10), "does not support norm 'group'; use one of none"),
    (("cnn", "none", (32, 32), 10), "input_shape"),
    (("cnn", "none", (3, 0, 32), 10), "input_shape"),
    (("cnn", "none", CIFAR, 1), "num_classes"),
    (("cnn", "none", (1, 2, 2), 10), "at least 4x4"),
])
def test_bad_arguments_raise_value_error(args, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        build_model(*args)


# ---- cifar-cnn: McMahan et al. 2017's CIFAR-10 CNN (the TensorFlow tutorial's), Hsu et al. 2019 -----
@pytest.mark.parametrize("shape, expected", [
    # conv1 5*5*C*64 + 64; conv2 5*5*64*64 + 64 = 102,464; fc1 64*h*w*384 + 384; fc2 384*192 + 192 = 73,920;
    # fc3 192*10 + 10 = 1,930; SAME convolutions and two halving pools: h = ceil(ceil(H/2)/2)
    (CIFAR, 4_864 + 102_464 + (64 * 8 * 8 * 384 + 384) + 73_920 + 1_930),      # 8x8:  1,573,248 in fc1
    (MNIST, 1_664 + 102_464 + (64 * 7 * 7 * 384 + 384) + 73_920 + 1_930),      # 7x7:  1,204,608 in fc1
    ((3, 24, 24), 4_864 + 102_464 + (64 * 6 * 6 * 384 + 384) + 73_920 + 1_930),  # the tutorial's crops
])
def test_cifar_cnn_parameter_count(shape, expected):
    assert expected in (1_756_426, 1_384_586, 1_068_298)   # the sums, written out
    assert count_parameters(build_model("cifar-cnn", "none", shape, 10)) == expected


def test_cifar_cnn_pools_and_lrn_as_tensorflow():
    """SAME 3x3/2 pooling: the -inf padding goes after (32 -> 16, pad 0 before, 1 after; 7 -> 4, 1 and 1),
    so the first window covers rows 0..2. LRN with depth radius 4: x / (1 + 0.001/9 * sum x^2)^0.75."""
    from geodml.models.cifar_cnn import _SamePool, same_pool_padding

    assert [same_pool_padding(n) for n in (32, 28, 16, 14, 7, 1)] == [(0, 1), (0, 1), (0, 1), (0, 1), (1, 1), (1, 1)]
    x = torch.zeros(1, 1, 4, 4)
    x[0, 0, 2, 2] = 5.0                          # in window rows/cols 0..2 and 2..4 (TF), not in -1..1
    assert _SamePool(4, 4)(x)[0, 0].tolist() == [[5.0, 5.0], [5.0, 5.0]]
    m = build_model("cifar-cnn", "none", CIFAR, 10)
    v = torch.zeros(1, 64, 1, 1)
    v[0, 10] = 3.0
    v[0, 14] = 4.0                               # within radius 4 of channel 10; channel 19 is not
    v[0, 19] = 2.0                               # its window, channels 15..23, holds only itself
    got = m.norm1(v)[0, :, 0, 0]
    assert float(got[10]) == pytest.approx(3.0 / (1 + 0.001 / 9 * 25) ** 0.75, rel=1e-6)
    assert float(got[19]) == pytest.approx(2.0 / (1 + 0.001 / 9 * 4) ** 0.75, rel=1e-6)
