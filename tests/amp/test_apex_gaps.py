"""What NVIDIA apex's own L0 tests touch beyond the training loop: ``_amp_state.handle``,
``LARC.zero_grad(set_to_none)`` positionally, ``FusedAdam(master_weights=True, capturable=True)``,
FusedSGD with several models, losses and optimizers, the O1 cast cache as autocast shows it;
and the cast registry (``amp.register_*_function``, ``user_cast_preferred``)."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

import amp
from amp._amp_state import _amp_state
from amp.optimizers import FusedAdam, FusedSGD
from amp.parallel import LARC

BF16 = {"half_dtype": torch.bfloat16}  # CPU autocast's half type


@pytest.fixture(autouse=True)
def _no_active_handle() -> Iterator[None]:
    yield
    _amp_state.handle._deactivate()  # restores anything a test registered


class MatMul(torch.nn.Module):
    """y = (x @ w) @ w, recording the dtype each op computed in."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(64, dtype=dtype).view(8, 8) / 64)
        self.seen: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.mm(x, self.weight)
        out = torch.mm(h, self.weight)
        self.seen += [h.dtype, out.dtype]
        return out.sum()


def _o1(model: torch.nn.Module, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    return amp.initialize(model, opt, opt_level="O1", verbosity=0, **BF16, **kw)


# ------------------------------------------------------------------ _amp_state.handle
def test_handle_is_active_after_o1_and_deactivate_turns_o1_casting_off():
    assert not _amp_state.handle.is_active()
    _amp_state.handle._deactivate()  # apex's tests call it unconditionally: never raises
    model, _ = _o1(MatMul())
    handle = _amp_state.handle
    assert handle.is_active() and handle.props is _amp_state.opt_properties
    model(torch.ones(2, 8))
    assert model.seen == [torch.bfloat16] * 2
    handle._deactivate()
    assert not handle.is_active()
    model.seen.clear()
    model(torch.ones(2, 8))
    assert model.seen == [torch.float32] * 2  # the model still runs, without autocast


def test_one_handle_serves_the_models_of_one_initialize():
    a, b = MatMul(), MatMul()
    opt = torch.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.1)
    amp.initialize([a, b], opt, opt_level="O1", verbosity=0, **BF16)
    first = _amp_state.handle
    amp.initialize(
        MatMul(),
        torch.optim.SGD(MatMul().parameters(), lr=0.1),
        opt_level="O1",
        verbosity=0,
        **BF16,
    )
    assert _amp_state.handle is not first and first.is_active()
    first._deactivate()
    a(torch.ones(1, 8)), b(torch.ones(1, 8))
    assert a.seen == b.seen == [torch.float32] * 2


# ------------------------------------------------------------------ the O1 cast cache
@pytest.mark.filterwarnings("ignore:amp.initialize. found weight")  # bf16 in, as apex's test
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_o1_cast_cache_never_serves_a_stale_weight(dtype):
    """apex's test_cache: train, change the weight, eval under no_grad, train again; the
    gradient is always that of the current weight (autocast's cache lives for one forward)."""
    _amp_state.allow_incoming_model_not_fp32 = True
    try:
        model, opt = _o1(MatMul(dtype))
    finally:
        _amp_state.allow_incoming_model_not_fp32 = False
    x = torch.ones(2, 8)

    def step() -> None:
        model.weight.grad = None
        with amp.scale_loss(model(x), opt) as scaled:
            scaled.backward()
        w = model.weight.detach().float().requires_grad_()
        (x @ w @ w).sum().backward()  # the fp32 reference on the same (exact) values
        assert model.weight.grad.dtype == dtype
        torch.testing.assert_close(model.weight.grad.float(), w.grad, rtol=2e-2, atol=1e-2)
        model.weight.data -= 1.0

    step()
    with torch.no_grad():
        model(x)
    step()
    step()


# ------------------------------------------------------------------ LARC, FusedAdam, FusedSGD
@pytest.mark.parametrize(
    "opt_level",
    ["O0", *(pytest.param(level, marks=pytest.mark.half_device) for level in ("O1", "O2"))],
)
def test_larc_zero_grad_takes_set_to_none_positionally(opt_level):
    model = torch.nn.Linear(3, 1)
    model, opt = amp.initialize(
        model, LARC(torch.optim.SGD(model.parameters(), lr=0.1)), opt_level=opt_level, verbosity=0
    )
    model(torch.ones(2, 3)).sum().backward()
    opt.zero_grad(False)
    assert model.weight.grad is not None and not model.weight.grad.any()
    opt.zero_grad(True)
    assert model.weight.grad is None


@pytest.mark.parametrize(
    "dtype", [pytest.param(torch.float16, marks=pytest.mark.half_device), torch.bfloat16]
)
def test_fused_adam_master_weights_steps_fp32_masters_of_half_params(dtype):
    torch.manual_seed(0)
    half = torch.nn.Linear(8, 4).to(dtype)
    ref = copy.deepcopy(half).float()  # the fp32 run from the very same starting values
    opt = FusedAdam(
        half.parameters(), lr=1e-2, weight_decay=0.01, master_weights=True, capturable=True
    )
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)
    for _ in range(5):
        half.zero_grad()
        (half(torch.randn(16, 8, dtype=dtype)).float() ** 2).mean().backward()
        for r, h in zip(ref.parameters(), half.parameters()):
            r.grad = h.grad.float()  # the same gradients for both
        opt.step()
        ref_opt.step()
    for r, h in zip(ref.parameters(), half.parameters()):
        master = opt._masters[id(h)]
        torch.testing.assert_close(master, r.detach(), rtol=1e-6, atol=1e-7)
        assert h.dtype == dtype and torch.equal(h.detach(), master.to(dtype))
        assert opt.state[h]["exp_avg"].dtype == torch.float32
    # torch's state_dict layout; a reload keeps the moments fp32 and takes masters anew.
    opt.load_state_dict(opt.state_dict())
    opt.step()
    assert opt.state[half.weight]["exp_avg"].dtype == torch.float32


def test_fused_adam_capturable_takes_grad_scalers_scale_even_for_fp16_params():
    # GradScaler refuses to unscale fp16 gradients itself; a capturable FusedAdam (apex's
    # _step_supports_amp_scaling) gets the scale and the overflow flag and does it.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).half()
    opt = FusedAdam(model.parameters(), lr=1e-2, capturable=True, master_weights=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    before = model.weight.detach().clone()
    scaler.scale(model(torch.full((2, 4), float("inf"), dtype=torch.half)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(model.weight.detach(), before) and scaler.get_scale() == 2.0**7
    assert "exp_avg" not in opt.state[model.weight]  # skipped: no step taken
    x = torch.ones(2, 4, dtype=torch.half)
    opt.zero_grad()
    model(x).sum().backward()
    true_grad = model.weight.grad.clone()
    opt.zero_grad()
    scaler.scale(model(x).sum()).backward()
    scaler.step(opt)
    assert torch.equal(model.weight.grad, true_grad)  # unscaled in place, as apex's kernel
    assert not torch.equal(model.weight.detach(), before)
    with pytest.raises(TypeError, match="master_weights must be True or False"):
        FusedAdam(model.parameters(), master_weights="yes")


def _models(n: int) -> list[torch.nn.Module]:
    torch.manual_seed(1)
    return [torch.nn.Linear(4, 2) for _ in range(n)]


def _train(models, make_opts, opt_level, steps=4):
    """apex's test_multiple_models_optimizers_losses shape: loss 0 over the first two
    models, loss 1 over the last, each with its own loss_id; optimizers as given."""
    opts = make_opts(models)
    models, opts = amp.initialize(
        models,
        opts,
        opt_level=opt_level,
        num_losses=2,
        verbosity=0,
        **(BF16 if opt_level == "O1" else {}),
    )
    torch.manual_seed(2)
    for _ in range(steps):
        x = torch.randn(8, 4)
        for o in opts:
            o.zero_grad()
        loss0 = sum(F.mse_loss(m(x).float(), torch.ones(8, 2)) for m in models[:2])
        loss1 = F.mse_loss(models[-1](x).float(), torch.zeros(8, 2))
        for loss_id, loss in enumerate((loss0, loss1)):
            owner = opts[0] if len(opts) == 1 or loss_id == 0 else opts[1]
            with amp.scale_loss(loss, owner, loss_id=loss_id) as scaled:
                scaled.backward()
        for o in opts:
            o.step()
    _amp_state.handle._deactivate()
    return [p.detach().float().clone() for m in models for p in m.parameters()]


@pytest.mark.parametrize("n_models", [2, 3])
@pytest.mark.parametrize("n_opts", [1, 2])
@pytest.mark.parametrize(
    "opt_level", ["O0", "O1", pytest.param("O2", marks=pytest.mark.half_device)]
)
def test_fused_sgd_with_several_models_losses_and_optimizers(n_models, n_opts, opt_level):
    def split(models, cls):
        params = [list(m.parameters()) for m in models]
        if n_opts == 1:
            return [cls([p for ps in params for p in ps], lr=0.5, momentum=0.125)]
        return [
            cls([p for ps in params[:-1] for p in ps], lr=0.5, momentum=0.125),
            cls(params[-1], lr=0.25, momentum=0.125),
        ]

    want = _train(_models(n_models), lambda ms: split(ms, torch.optim.SGD), opt_level)
    got = _train(_models(n_models), lambda ms: split(ms, FusedSGD), opt_level)
    tol = {"rtol": 1e-6, "atol": 1e-7} if opt_level == "O0" else {"rtol": 1e-3, "atol": 1e-4}
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)


# ------------------------------------------------------------------ the cast registry
class Registered(torch.nn.Module):
    """Calls the module-level functions a test registers, recording their result dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(8, 8) / 8)
        self.seen: dict[str, torch.dtype] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mm = torch.mm(x, self.weight)
        mine = torch.nn.functional.gelu(x)  # a function autocast leaves in the input dtype
        mixed = torch.add(mm.to(torch.bfloat16), x)
        self.seen.update(mm=mm.dtype, gelu=mine.dtype, add=mixed.dtype)
        return mm.sum()


def test_register_errors_are_apexs():
    with pytest.raises(ValueError, match=r"^No function named nope in module <module 'torch'"):
        amp.register_half_function(torch, "nope")
    with pytest.raises(ValueError, match="No function named nope"):
        amp.register_float_function(torch, "nope")
    with pytest.raises(ValueError, match="No function named nope"):
        amp.register_promote_function(torch.nn.functional, "nope")


def test_registered_functions_get_their_cast_only_inside_an_o1_forward():
    original_gelu = torch.nn.functional.gelu
    amp.register_half_function(torch.nn.functional, "gelu")
    model, _ = _o1(Registered())
    assert torch.nn.functional.gelu is not original_gelu  # wrapped for the process, as apex
    model(torch.ones(2, 8))
    assert model.seen["gelu"] == torch.bfloat16
    assert model.seen["mm"] == torch.bfloat16  # autocast's own choice, untouched
    assert torch.nn.functional.gelu(torch.ones(2)).dtype == torch.float32  # outside: as is
    _amp_state.handle._deactivate()
    assert torch.nn.functional.gelu is original_gelu


def test_float_registration_of_an_autocast_op_needs_user_cast_preferred_to_win():
    # Without it autocast still lowers torch.mm inside the call (its list comes last, at the
    # dispatcher); with it, Ascend's rule: the user's registration wins over the lists.
    amp.register_float_function(torch, "mm")
    model, _ = _o1(Registered())
    model(torch.ones(2, 8))
    assert model.seen["mm"] == torch.bfloat16
    _amp_state.handle._deactivate()
    amp.register_float_function(torch, "mm")
    model, _ = _o1(Registered(), user_cast_preferred=True)
    model(torch.ones(2, 8))
    assert model.seen["mm"] == torch.float32


def test_promote_registration_casts_to_the_widest_type():
    seen = []

    def concat(a, b):
        seen.append((a.dtype, b.dtype))
        return torch.cat([a, b])

    promoted = amp.promote_function(concat)
    halved = amp.half_function(concat)
    model = MatMul()
    model.forward = lambda x: (promoted(x.to(torch.bfloat16), x), halved(x, x))[0].sum()
    _o1(model)
    model(torch.ones(2, 8))
    assert seen == [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)]
    promoted(torch.ones(1, dtype=torch.bfloat16), torch.ones(1))  # outside a forward: as is
    assert seen[-1] == (torch.bfloat16, torch.float32)


@pytest.mark.half_device
def test_registrations_are_consumed_by_the_o1_initialize():
    amp.register_half_function(torch.nn.functional, "gelu")
    amp.initialize(
        MatMul(), torch.optim.SGD(MatMul().parameters(), lr=0.1), opt_level="O2", verbosity=0
    )  # not O1: the registry waits, as apex's
    assert not _amp_state.handle.is_active()
    _o1(Registered())
    assert len(_amp_state.handle._wrapped) == 1
    _amp_state.handle._deactivate()
    _o1(Registered())
    assert _amp_state.handle._wrapped == []  # consumed


# ------------------------------------------------------------------ LossScaler's keywords
def test_loss_scaler_takes_ascends_names_and_keeps_the_others_as_aliases():
    ascend = amp.LossScaler("dynamic", 8.0, 4.0, 0.25, 1)  # Ascend's positions
    ascend.update(False)
    assert ascend.loss_scale() == 32.0
    ascend.update(True)
    assert ascend.loss_scale() == 8.0
    for kw in (
        {"scale_growth_factor": 4.0, "scale_backoff_factor": 0.25},
        {"growth_factor": 4.0, "backoff_factor": 0.25},
        {"scale_factor": 4.0, "backoff_factor": 0.25},
    ):
        s = amp.LossScaler("dynamic", dynamic_init_scale=8.0, scale_window=1, **kw)
        s.update(False)
        assert s.loss_scale() == 32.0, kw
    with pytest.raises(TypeError, match="scale_growth_factor and growth_factor name the same"):
        amp.LossScaler("dynamic", scale_growth_factor=3.0, growth_factor=3.0)
    with pytest.raises(TypeError, match="init_scale and dynamic_init_scale"):
        amp.LossScaler("dynamic", init_scale=4.0, dynamic_init_scale=8.0)
