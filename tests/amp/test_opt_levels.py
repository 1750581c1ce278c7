"""Training at every opt level, as a user writes it (the apex quick start), and what each level does
to the model and the optimizer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from amp_testlib import make_data, quickstart_model
from torch import nn

import amp


def _train(model, optimizer, steps=30, x=None, y=None):
    if x is None:
        x, y = make_data()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize(
    "opt_level",
    ["O0", *(pytest.param(level, marks=pytest.mark.half_device) for level in ("O1", "O2", "O3"))],
)
def test_quickstart_loop_loss_decreases(opt_level):
    model, optimizer = quickstart_model()
    model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, verbosity=0)
    losses = _train(model, optimizer)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0], losses


def test_o0_is_bit_identical_to_plain_fp32():
    x, y = make_data()
    ref_model, ref_opt = quickstart_model()
    ref_losses = []
    for _ in range(20):
        ref_opt.zero_grad()
        loss = F.mse_loss(ref_model(x), y)
        loss.backward()
        ref_opt.step()
        ref_losses.append(loss.item())

    model, optimizer = quickstart_model()
    model, optimizer = amp.initialize(model, optimizer, opt_level="O0", verbosity=0)
    losses = _train(model, optimizer, steps=20, x=x, y=y)
    assert losses == ref_losses
    assert torch.equal(model.weight, ref_model.weight) and torch.equal(model.bias, ref_model.bias)


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).mean(dim=(2, 3)))


@pytest.mark.half_device
def test_o2_half_model_fp32_batchnorm_and_fp32_masters():
    torch.manual_seed(0)
    model = ConvBN()
    fp32_weight = model.conv.weight.detach().clone()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    assert model.conv.weight.dtype == torch.float16 and model.fc.weight.dtype == torch.float16
    assert model.bn.weight.dtype == torch.float32 and model.bn.running_mean.dtype == torch.float32
    masters = list(amp.master_params(optimizer))
    assert [m.dtype for m in masters] == [torch.float32] * len(masters)
    # The masters start from the exact fp32 weights, not from their fp16 rounding.
    assert torch.equal(masters[0], fp32_weight)
    assert masters[0] is not model.conv.weight
    assert masters[2] is model.bn.weight  # fp32 params are their own masters

    x = torch.randn(8, 3, 6, 6)  # fp32 input: cast to half by the wrapped forward
    out = model(x)
    assert out.dtype == torch.float32  # outputs come back fp32, as in apex
    target = torch.randn(8, 2)
    for _ in range(3):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), target)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
    assert all(s["exp_avg"].dtype == torch.float32 for s in optimizer.state.values())
    # After every step the half model is the masters' rounding.
    assert torch.equal(model.conv.weight, masters[0].half())
    assert not torch.equal(masters[0], fp32_weight)


@pytest.mark.half_device
def test_o2_cast_model_outputs():
    model, optimizer = quickstart_model()
    model, optimizer = amp.initialize(
        model, optimizer, opt_level="O2", cast_model_outputs=torch.float16, verbosity=0
    )
    assert model(torch.randn(2, 10)).dtype == torch.float16


@pytest.mark.half_device
def test_o3_pure_half_no_masters():
    model, optimizer = quickstart_model()
    model, optimizer = amp.initialize(model, optimizer, opt_level="O3", verbosity=0)
    assert model.weight.dtype == torch.float16
    assert next(amp.master_params(optimizer)) is model.weight
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 1.0


def _hooked_model(seen):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 1))
    # A hook on the inner layer sees what it computed inside the (wrapped) forward.
    model[0].register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


@pytest.mark.half_device
def test_o1_runs_forward_under_autocast_and_keeps_fp32_weights():
    seen = []
    model, _optimizer = amp.initialize(*_hooked_model(seen), opt_level="O1", verbosity=0)
    out = model(torch.randn(2, 10))
    assert model[0].weight.dtype == torch.float32
    assert seen == [torch.float16]  # the linear ran in fp16 (autocast) ...
    assert out.dtype == torch.float32  # ... and the output is handed back in fp32
    # autocast is confined to the model: torch itself is not patched.
    assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.float32


@pytest.mark.parametrize("opt_level", ["O1", "O2", "O3"])
def test_bf16_through_half_dtype_at_every_level(opt_level):
    seen = []
    model, optimizer = amp.initialize(
        *_hooked_model(seen), opt_level=opt_level, half_dtype=torch.bfloat16, verbosity=0
    )
    losses = _train(model, optimizer, steps=20)
    assert seen[0] == torch.bfloat16
    expected_weight = torch.float32 if opt_level == "O1" else torch.bfloat16
    assert model[0].weight.dtype == expected_weight
    assert losses[-1] < 0.5 * losses[0]


def test_bf16_through_cast_model_type_at_o2():
    model, optimizer = quickstart_model()
    model, optimizer = amp.initialize(
        model, optimizer, opt_level="O2", cast_model_type=torch.bfloat16, verbosity=0
    )
    assert model.weight.dtype == torch.bfloat16
    assert next(amp.master_params(optimizer)).dtype == torch.float32
    assert amp._amp_state.opt_properties.half_dtype == torch.bfloat16


@pytest.mark.half_device
def test_overrides_replace_level_defaults():
    model, optimizer = quickstart_model()
    model, optimizer = amp.initialize(
        model,
        optimizer,
        opt_level="O2",
        master_weights=False,
        loss_scale=128.0,
        keep_batchnorm_fp32="False",
        verbosity=0,
    )
    props = amp._amp_state.opt_properties
    assert props.master_weights is False and props.keep_batchnorm_fp32 is False
    assert next(amp.master_params(optimizer)) is model.weight  # no separate masters
    assert amp.state_dict()["loss_scaler0"] == {"loss_scale": 128.0, "unskipped": 0}


@pytest.mark.half_device
def test_returns_the_shape_passed():
    m1, o1 = quickstart_model()
    m2, o2 = quickstart_model()
    models, opts = amp.initialize([m1, m2], [o1, o2], opt_level="O1", verbosity=0)
    assert isinstance(models, list) and models == [m1, m2] and opts == [o1, o2]
    m3, _ = quickstart_model()
    assert amp.initialize(m3, opt_level="O2", verbosity=0) is m3


def test_disabled_returns_inputs_untouched_and_loss_passes_through():
    model, optimizer = quickstart_model()
    forward, step = model.forward, optimizer.step
    m, o = amp.initialize(model, optimizer, enabled=False, opt_level="O2")
    assert m is model and o is optimizer
    assert model.forward == forward and optimizer.step == step
    assert model.weight.dtype == torch.float32
    loss = F.mse_loss(model(torch.randn(2, 10)), torch.randn(2, 1))
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        assert scaled_loss is loss


@pytest.mark.half_device
def test_any_torch_optimizer_works_at_o2():
    for make in (
        lambda p: torch.optim.Adam(p, lr=1e-2),
        lambda p: torch.optim.AdamW(p, lr=1e-2),
        lambda p: torch.optim.RMSprop(p, lr=1e-3),
        lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, nesterov=True),
    ):
        torch.manual_seed(0)
        model = nn.Linear(10, 1)
        model, optimizer = amp.initialize(
            model, make(model.parameters()), opt_level="O2", verbosity=0
        )
        losses = _train(model, optimizer, steps=25)
        assert losses[-1] < losses[0], (type(optimizer).__name__, losses)


@pytest.mark.half_device
def test_add_param_group_after_initialize_gets_masters():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 4), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.01)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    optimizer.add_param_group({"params": list(model[1].parameters())})
    assert all(p.dtype == torch.float32 for p in amp.master_params(optimizer))
    before = model[1].weight.detach().clone()
    _train(model, optimizer, steps=2)
    assert not torch.equal(before, model[1].weight)


@pytest.mark.half_device
def test_gradient_accumulation_with_delay_unscale_matches_big_batch():
    x, y = make_data(n=64)
    ref, ref_opt = quickstart_model()
    ref_opt.zero_grad()
    F.mse_loss(ref(x), y).backward()
    ref_opt.step()

    model, optimizer = quickstart_model()
    model, optimizer = amp.initialize(
        model, optimizer, opt_level="O2", verbosity=0, dynamic_init_scale=256.0
    )  # no fp16 overflow here
    optimizer.zero_grad()
    chunks = list(zip(x.chunk(4), y.chunk(4)))
    for i, (xc, yc) in enumerate(chunks):
        loss = F.mse_loss(model(xc), yc) / len(chunks)
        with amp.scale_loss(loss, optimizer, delay_unscale=i < len(chunks) - 1) as scaled:
            scaled.backward()
    optimizer.step()
    assert amp.state_dict()["loss_scaler0"]["unskipped"] == 1  # one scaler update per step
    master_w = next(amp.master_params(optimizer))
    torch.testing.assert_close(master_w, ref.weight, atol=2e-3, rtol=0)


@pytest.mark.half_device
def test_two_losses_two_scalers_accumulate_with_their_own_scales():
    x, y = make_data()
    ref, ref_opt = quickstart_model()
    ref_opt.zero_grad()
    (F.mse_loss(ref(x), y) + F.l1_loss(ref(x), y)).backward()
    ref_grad = ref.weight.grad.clone()

    model, optimizer = quickstart_model()
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", num_losses=2, verbosity=0)
    # Give the two scalers different scales so that mixing them up would show.
    amp.load_state_dict(
        {
            "loss_scaler0": {"loss_scale": 1024.0, "unskipped": 0},
            "loss_scaler1": {"loss_scale": 8.0, "unskipped": 0},
        }
    )
    optimizer.zero_grad()
    for loss_id, fn in enumerate((F.mse_loss, F.l1_loss)):
        with amp.scale_loss(fn(model(x), y), optimizer, loss_id=loss_id) as scaled:
            scaled.backward()
    master_w = next(amp.master_params(optimizer))
    torch.testing.assert_close(master_w.grad, ref_grad, atol=1e-2, rtol=1e-2)
    assert amp.state_dict() == {
        "loss_scaler0": {"loss_scale": 1024.0, "unskipped": 1},
        "loss_scaler1": {"loss_scale": 8.0, "unskipped": 1},
    }


@pytest.mark.half_device
def test_o2_model_zero_grad_is_enough_between_steps():
    x, y = make_data()
    results = []
    for use_model_zero_grad in (False, True):
        model, optimizer = quickstart_model()
        model, optimizer = amp.initialize(
            model, optimizer, opt_level="O2", verbosity=0, dynamic_init_scale=256.0
        )
        for _ in range(4):
            (model if use_model_zero_grad else optimizer).zero_grad()
            with amp.scale_loss(F.mse_loss(model(x), y), optimizer) as scaled:
                scaled.backward()
            optimizer.step()
        results.append(next(amp.master_params(optimizer)).detach().clone())
    assert torch.equal(results[0], results[1])


@pytest.mark.half_device
def test_o2_masters_follow_weights_loaded_after_initialize():
    pretrained, _ = quickstart_model(seed=42)
    model, optimizer = quickstart_model(seed=0)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    model.load_state_dict(pretrained.state_dict())  # fine-tuning: weights arrive after initialize
    x, y = make_data()
    with amp.scale_loss(F.mse_loss(model(x), y), optimizer) as scaled:
        scaled.backward()
    master_w = next(amp.master_params(optimizer))
    torch.testing.assert_close(master_w, pretrained.weight.half().float())  # before the step
    optimizer.step()
    torch.testing.assert_close(master_w, pretrained.weight, atol=0.05, rtol=0)


@pytest.mark.half_device
def test_o2_untouched_masters_keep_exact_fp32_initial_weights():
    model, optimizer = quickstart_model()
    fp32_weight = model.weight.detach().clone()
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    x, y = make_data()
    with amp.scale_loss(F.mse_loss(model(x), y), optimizer) as scaled:
        scaled.backward()
    assert torch.equal(next(amp.master_params(optimizer)), fp32_weight)
    assert not torch.equal(fp32_weight.half().float(), fp32_weight)  # rounding would show
