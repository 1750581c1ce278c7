"""What apex code touches besides the training loop: fp32 checkpoints from ``model.state_dict()``
at every opt level, the keyword spellings apex accepts, and ``amp._amp_state`` as apex's state
object."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from amp_testlib import make_data, quickstart_model

import amp

# half_device (tests/conftest.py): the cases that compute in float16.
_HALF = pytest.mark.half_device
LEVELS = [
    ("O0", {}),
    pytest.param(("O1", {}), marks=_HALF),
    pytest.param(("O2", {}), marks=_HALF),
    pytest.param(("O3", {}), marks=_HALF),
    ("O2", {"cast_model_type": torch.bfloat16}),
    ("O3", {"half_dtype": torch.bfloat16}),
    pytest.param(("O2", {"keep_batchnorm_fp32": False}), marks=_HALF),
]
LEVEL_IDS = ["O0", "O1", "O2", "O3", "O2-bf16", "O3-bf16", "O2-half-bn"]


def _bn_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(10, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )


@pytest.mark.parametrize("level", LEVELS, ids=LEVEL_IDS)
def test_state_dict_is_fp32_at_every_opt_level(level):
    opt_level, kw = level
    model = _bn_model()
    fp32_reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = amp.initialize(model, opt, opt_level=opt_level, verbosity=0, **kw)
    x, y = make_data()
    for _ in range(3):
        opt.zero_grad()
        with amp.scale_loss(F.mse_loss(model(x), y), opt) as scaled:
            scaled.backward()
        opt.step()
    sd = model.state_dict()
    for key, value in sd.items():
        if value.is_floating_point():
            assert value.dtype == torch.float32, key
    live = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    for key, value in sd.items():
        assert torch.equal(value, live[key].to(value.dtype)), key  # the values, only widened
    # apex users load such checkpoints into a plain fp32 model ...
    fp32_reference.load_state_dict(sd)
    # ... and back into the amp model, which keeps its types and gets its exact values back
    before = {k: v.clone() for k, v in live.items()}
    model.load_state_dict(sd)
    for key, value in dict(model.named_parameters()).items():
        assert value.dtype == before[key].dtype and torch.equal(value, before[key]), key


@pytest.mark.half_device
def test_state_dict_hook_leaves_a_parent_model_alone():
    inner = _bn_model()
    model, _ = amp.initialize(
        inner, torch.optim.SGD(inner.parameters(), lr=0.1), opt_level="O3", verbosity=0
    )
    outer = torch.nn.ModuleDict({"amp": model, "other": torch.nn.Linear(2, 2).half()})
    sd = outer.state_dict()
    assert sd["amp.0.weight"].dtype == torch.float32
    assert sd["other.weight"].dtype == torch.float16  # not amp's model: untouched


# O1 autocasts to float16; the others cast nothing (cast_model_type=False).
@pytest.mark.parametrize("opt_level", ["O0", pytest.param("O1", marks=_HALF), "O2", "O3"])
def test_cast_model_type_false_means_do_not_cast(opt_level):
    model = _bn_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = amp.initialize(model, opt, opt_level=opt_level, cast_model_type=False, verbosity=0)
    assert amp._amp_state.opt_properties.cast_model_type is False
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(p.dtype == torch.float32 for p in amp.master_params(opt))
    x, y = make_data()
    out = model(x)
    assert out.dtype == torch.float32
    with amp.scale_loss(F.mse_loss(out, y), opt) as scaled:
        scaled.backward()
    opt.step()


@pytest.mark.half_device
def test_apex_spellings():
    model, opt = quickstart_model()
    amp.initialize(
        model, opt, opt_level="O2", keep_batchnorm_fp32="False", loss_scale="128.0", verbosity=0
    )
    props = amp._amp_state.opt_properties
    assert props.keep_batchnorm_fp32 is False and props.loss_scale == 128.0
    model, opt = quickstart_model()
    amp.initialize(model, opt, opt_level="O0", loss_scale="dynamic", verbosity=0)
    assert amp._amp_state.loss_scalers[0].dynamic
    model, opt = quickstart_model()
    amp.initialize(model, opt, opt_level="O1", loss_scale=64, verbosity=0)
    assert amp._amp_state.loss_scalers[0].loss_scale() == 64.0
    model, opt = quickstart_model()
    with pytest.raises(TypeError, match=r"cast_model_type must be None, False .* got True"):
        amp.initialize(model, opt, opt_level="O2", cast_model_type=True, verbosity=0)
    with pytest.raises(TypeError, match="defer_unscale must be True or False; got 'yes'"):
        amp.initialize(model, opt, defer_unscale="yes", verbosity=0)


@pytest.mark.half_device
def test_amp_state_is_apexs_state_object():
    from amp import _amp_state  # noqa: PLC0415
    from amp._amp_state import _amp_state as same  # noqa: PLC0415
    from amp._amp_state import maybe_log  # noqa: PLC0415 (its helpers stay importable)

    assert _amp_state is same and callable(maybe_log)
    assert _amp_state._amp_state is _amp_state  # code written against the module form
    model, opt = quickstart_model()
    model, opt = amp.initialize(
        model,
        opt,
        opt_level="O2",
        num_losses=2,
        verbosity=0,
        min_loss_scale=4.0,
        dynamic_init_scale=256.0,
    )
    assert _amp_state.opt_properties.opt_level == "O2"
    assert [s.loss_scale() for s in _amp_state.loss_scalers] == [256.0, 256.0]
    assert _amp_state.min_loss_scale == 4.0 and _amp_state.max_loss_scale == 2.0**24
    assert _amp_state.hard_override is False and _amp_state.verbosity == 0
    x, y = make_data()
    with amp.scale_loss(F.mse_loss(model(x), y), opt, loss_id=1) as scaled:
        scaled.backward()
        model.weight.grad.fill_(float("inf"))
    opt.step()  # skipped
    assert [s.loss_scale() for s in _amp_state.loss_scalers] == [256.0, 128.0]


def test_optimizer_like_objects_accepted_and_others_named():
    model, _opt = quickstart_model()
    with pytest.raises(TypeError, match=r"optimizer-like object .* got dict"):
        amp.initialize(model, {"param_groups": []}, verbosity=0)
