"""The ``apex`` import name (amp/_shim/apex): every ``apex.X`` is the ampforge module itself.

In the development venv ``make setup`` writes the same ``ampforge-apex.pth`` the wheel carries
(pointing at this checkout); tests/builder/e2e/test_apex_coexistence.py installs the built
wheel into a fresh venv, next to another distribution that owns ``apex/``."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch.nn.functional as F
from amp_testlib import make_data, quickstart_model

import amp
import amp.combine_tensors
import amp.optimizers
import amp.parallel


def test_the_apex_modules_are_ampforge_modules():
    import apex  # noqa: PLC0415
    from apex import amp as apex_amp  # noqa: PLC0415
    from apex.amp import _amp_state  # noqa: PLC0415
    from apex.contrib.combine_tensors import combine_npu  # noqa: PLC0415
    from apex.multi_tensor_apply import multi_tensor_applier  # noqa: PLC0415
    from apex.parallel import LARC  # noqa: PLC0415

    assert apex_amp is amp and apex.amp is amp
    assert _amp_state is amp._amp_state
    assert sys.modules["apex.amp._amp_state"] is sys.modules["amp._amp_state"]
    assert combine_npu is amp.combine_tensors.combine_npu
    assert LARC is amp.parallel.LARC
    assert apex.optimizers is amp.optimizers
    assert multi_tensor_applier is amp.multi_tensor_applier
    # The module keeps its own spec (reload, pickling by reference, tracebacks name amp's file).
    assert apex.amp.__spec__.name == "amp"


def test_every_name_of_amp_optimizers_is_in_apex_optimizers():
    import apex.optimizers  # noqa: PLC0415

    assert amp.optimizers.__all__  # names added to amp.optimizers need no listing in apex/
    for name in amp.optimizers.__all__:
        assert getattr(apex.optimizers, name) is getattr(amp.optimizers, name), name
    from apex.optimizers import FusedAdam, FusedSGD  # noqa: F401, PLC0415


def test_importing_a_submodule_through_apex_keeps_the_package_attributes():
    # `import apex.parallel.LARC` loads a submodule whose name the package binds to the class
    # (and amp._amp_state to the state object): the alias must not replace those bindings.
    importlib.import_module("apex.parallel.LARC")
    importlib.import_module("apex.amp._amp_state")
    from apex.parallel.LARC import LARC  # noqa: PLC0415

    assert amp.parallel.LARC is LARC and isinstance(LARC, type)
    assert type(amp._amp_state).__name__ == "AmpState"
    scaler = importlib.import_module("apex.amp.scaler")
    assert scaler is sys.modules["amp.scaler"] and scaler.LossScaler is amp.LossScaler


def test_names_apex_does_not_have_fail_as_imports_do():
    import apex  # noqa: PLC0415

    with pytest.raises(ModuleNotFoundError, match=r"apex\.amp\.no_such_module"):
        importlib.import_module("apex.amp.no_such_module")
    with pytest.raises(AttributeError, match="no attribute 'fp16_utils'"):
        apex.fp16_utils  # noqa: B018
    with pytest.raises(ImportError):
        exec("from apex.contrib import no_such_thing", {})


@pytest.mark.half_device
def test_state_set_through_apex_amp_is_seen_through_amp():
    from apex import amp as apex_amp  # noqa: PLC0415

    model, opt = quickstart_model()
    model, opt = apex_amp.initialize(model, opt, opt_level="O2", loss_scale=128.0, verbosity=0)
    x, y = make_data()
    with apex_amp.scale_loss(F.mse_loss(model(x), y), opt) as scaled:
        scaled.backward()
    opt.step()
    assert amp._amp_state.loss_scalers[0].loss_scale() == 128.0
    assert amp._amp_state.opt_properties.opt_level == "O2"
