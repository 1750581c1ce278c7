"""Every illegal combination and bad value of amp.initialize / scale_loss / load_state_dict raises
a clear error, before any model or optimizer is touched."""

from __future__ import annotations

import pytest
import torch
from amp_testlib import quickstart_model

import amp

ILLEGAL_COMBINATIONS = [
    (dict(opt_level="O1", cast_model_type=torch.float16), "O1"),
    (dict(opt_level="O1", cast_model_type=torch.bfloat16), "half_dtype=torch.bfloat16"),
    (dict(opt_level="O0", patch_torch_functions=True), "opt_level='O1'"),
    (dict(opt_level="O2", patch_torch_functions=True), "opt_level='O1'"),
    (dict(opt_level="O3", patch_torch_functions=True), "opt_level='O1'"),
    (dict(opt_level="O1", keep_batchnorm_fp32=True), "keep_batchnorm_fp32"),
    (dict(opt_level="O1", keep_batchnorm_fp32="False"), "keep_batchnorm_fp32"),
    (dict(opt_level="O1", master_weights=True), "master_weights"),
    (dict(opt_level="O1", master_weights=False), "master_weights"),
]


@pytest.mark.parametrize("kwargs,hint", ILLEGAL_COMBINATIONS)
def test_illegal_combinations_raise_runtime_error_and_leave_model_alone(kwargs, hint):
    model, optimizer = quickstart_model()
    with pytest.raises(RuntimeError, match=hint.replace("(", r"\(").replace(".", r"\.")):
        amp.initialize(model, optimizer, verbosity=0, **kwargs)
    assert model.weight.dtype == torch.float32
    assert "forward" not in vars(model) and not hasattr(optimizer, "_amp_stash")


@pytest.mark.half_device
def test_legal_neighbours_of_the_illegal_combinations():
    for kwargs in (
        dict(opt_level="O1", cast_model_type=torch.float32),
        dict(opt_level="O1", patch_torch_functions=False),
        dict(opt_level="O2", patch_torch_functions=False),
        dict(opt_level="O3", keep_batchnorm_fp32=True),
        dict(opt_level="O0", master_weights=True),
    ):
        model, optimizer = quickstart_model()
        amp.initialize(model, optimizer, verbosity=0, **kwargs)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(opt_level="O4"), RuntimeError, "Unexpected optimization level 'O4'"),
        (dict(opt_level="01"), RuntimeError, "letter O, not the number zero"),
        (dict(opt_level=1), TypeError, "opt_level must be one of"),
        (dict(loss_scale=-1.0), ValueError, "loss_scale"),
        (dict(loss_scale=0), ValueError, "loss_scale"),
        (dict(loss_scale=float("nan")), ValueError, "loss_scale"),
        (dict(loss_scale="huge"), TypeError, "loss_scale must be 'dynamic' or a positive"),
        (dict(loss_scale=True), TypeError, "loss_scale"),
        (dict(keep_batchnorm_fp32="yes", opt_level="O2"), TypeError, "keep_batchnorm_fp32"),
        (dict(keep_batchnorm_fp32=1, opt_level="O2"), TypeError, "keep_batchnorm_fp32"),
        (dict(master_weights="True", opt_level="O2"), TypeError, "master_weights"),
        (dict(patch_torch_functions=1), TypeError, "patch_torch_functions"),
        (dict(cast_model_type="float16", opt_level="O2"), TypeError, "cast_model_type"),
        (dict(cast_model_type=torch.int8, opt_level="O2"), TypeError, "cast_model_type"),
        (dict(cast_model_outputs=torch.float64), TypeError, "cast_model_outputs"),
        (dict(half_dtype=torch.float32), TypeError, "half_dtype"),
        (
            dict(opt_level="O2", cast_model_type=torch.float16, half_dtype=torch.bfloat16),
            ValueError,
            "contradicts",
        ),
        (dict(enabled="yes"), TypeError, "enabled"),
        (dict(num_losses=0), ValueError, "num_losses"),
        (dict(num_losses=1.5), ValueError, "num_losses"),
        (dict(verbosity=-1), ValueError, "verbosity"),
        (dict(min_loss_scale=-2.0), ValueError, "min_loss_scale"),
        (dict(max_loss_scale=0.0), ValueError, "max_loss_scale"),
        (dict(max_loss_scale="big"), TypeError, "max_loss_scale"),
        (dict(min_loss_scale=1024.0, max_loss_scale=2.0), ValueError, "must not exceed"),
        (dict(dynamic_init_scale=-1.0), ValueError, "dynamic_init_scale"),
        (dict(scale_growth_factor=1.0), ValueError, "scale_growth_factor must be > 1.0"),
        (dict(scale_backoff_factor=1.5), ValueError, "scale_backoff_factor must be in"),
        (dict(scale_backoff_factor=0), ValueError, "scale_backoff_factor"),
        (dict(scale_window=0), ValueError, "scale_window"),
        (dict(scale_window=2.5), ValueError, "scale_window"),
    ],
)
def test_bad_values_raise_clear_errors(kwargs, exc, match):
    model, optimizer = quickstart_model()
    with pytest.raises(exc, match=match):
        amp.initialize(model, optimizer, **{"verbosity": 0, **kwargs})
    assert model.weight.dtype == torch.float32 and not hasattr(optimizer, "_amp_stash")


def test_wrong_model_and_optimizer_types():
    model, optimizer = quickstart_model()
    with pytest.raises(TypeError, match=r"models must be a torch\.nn"):
        amp.initialize("model", optimizer)
    with pytest.raises(TypeError, match=r"optimizers must be a torch\.optim"):
        amp.initialize(model, [optimizer, "sgd"])
    with pytest.raises(ValueError, match="models must not be an empty list"):
        amp.initialize([], optimizer)
    ddp_like = torch.nn.parallel.DistributedDataParallel.__new__(
        torch.nn.parallel.DistributedDataParallel
    )
    torch.nn.Module.__init__(ddp_like)
    with pytest.raises(RuntimeError, match=r"AFTER amp\.initialize"):
        amp.initialize(ddp_like, optimizer)


@pytest.mark.half_device
def test_string_forms_accepted_as_apex_does():
    model, optimizer = quickstart_model()
    amp.initialize(
        model,
        optimizer,
        opt_level="O2",
        keep_batchnorm_fp32="True",
        loss_scale="128.0",
        verbosity=0,
    )
    props = amp._amp_state.opt_properties
    assert props.keep_batchnorm_fp32 is True and props.loss_scale == 128.0
    model, optimizer = quickstart_model()
    amp.initialize(model, optimizer, opt_level="O3", loss_scale="dynamic", verbosity=0)
    assert amp._amp_state.loss_scalers[0].dynamic


@pytest.mark.half_device
def test_initial_scale_is_min_of_max_and_init():
    model, optimizer = quickstart_model()
    amp.initialize(model, optimizer, opt_level="O1", max_loss_scale=1000.0, verbosity=0)
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 1000.0


@pytest.mark.half_device
def test_initialize_twice_on_the_same_objects_is_refused():
    model, optimizer = quickstart_model()
    amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
    with pytest.raises(RuntimeError, match="only once"):
        amp.initialize(torch.nn.Linear(10, 1), optimizer, opt_level="O1", verbosity=0)
    with pytest.raises(RuntimeError, match=r"already went through amp\.initialize"):
        amp.initialize(model, opt_level="O1", verbosity=0)


@pytest.mark.half_device
def test_scale_loss_misuse():
    model, optimizer = quickstart_model()
    loss = model(torch.randn(2, 10)).sum()
    with pytest.raises(RuntimeError, match=r"before amp\.initialize"):
        with amp.scale_loss(loss, optimizer):
            pass
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
    _, stranger = quickstart_model()
    with pytest.raises(RuntimeError, match=r"did not go through amp\.initialize"):
        with amp.scale_loss(loss, stranger):
            pass
    with pytest.raises(ValueError, match="loss_id=1 is out of range"):
        with amp.scale_loss(loss, optimizer, loss_id=1):
            pass
    with pytest.raises(TypeError, match=r"torch\.optim\.Optimizer"):
        with amp.scale_loss(loss, "sgd"):
            pass


@pytest.mark.half_device
def test_load_state_dict_mismatch():
    model, optimizer = quickstart_model()
    amp.initialize(model, optimizer, opt_level="O1", num_losses=2, verbosity=0)
    with pytest.raises(ValueError, match="num_losses=2"):
        amp.load_state_dict({"loss_scaler0": {"loss_scale": 2.0, "unskipped": 0}})
    with pytest.raises(ValueError, match="'loss_scale' and 'unskipped'"):
        amp.load_state_dict({"loss_scaler0": {"scale": 2.0}, "loss_scaler1": {}})
    with pytest.raises(TypeError, match="expects a dict"):
        amp.load_state_dict([1, 2])
