"""The per-ISA builds of amp._C: the dispatch (auto picks the best the CPU runs, forcing one
works or is refused clearly), the builds agreeing with each other, the streamed half copy
being the same bits as the ordinary one, results not depending on the thread count, and
the benchmark's limit probe doing what it says."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
import torch

from amp import _ext
from amp.kernels import ops as mt

ISAS = ("generic", "avx2", "avx512")
# Uneven sizes across the block (512) and chunk (32768) edges, big enough (> 64K elements
# in all) that the driver runs in parallel.
SIZES = [1, 511, 513, 32768, 32769, 70001, 3]


@pytest.fixture
def mod() -> Iterator[object]:
    m = _ext.load()
    assert m is not None, "amp._C must be built for the test suite (make setup)"
    yield m
    m.set_isa("auto")


def test_auto_picks_the_best_supported(mod) -> None:
    supported = _ext.supported_isas()
    assert supported[0] == "generic" and set(supported) <= set(ISAS)
    mod.set_isa("auto")
    assert _ext.isa() == supported[-1]


@pytest.mark.parametrize("name", ISAS)
def test_forcing_an_isa(mod, name: str) -> None:
    if name in _ext.supported_isas():
        _ext.set_isa(name)
        assert _ext.isa() == name
    else:  # e.g. AVX-512 on a CPU (or VM) without it: refused, the choice unchanged
        before = _ext.isa()
        with pytest.raises(ValueError, match="lacks"):
            _ext.set_isa(name)
        assert _ext.isa() == before


def test_unknown_isa_is_refused(mod) -> None:
    with pytest.raises(ValueError, match="unknown ISA"):
        mod.set_isa("avx1024")


def _import_with(env_isa: str) -> str:
    code = (
        "import warnings; warnings.simplefilter('always')\nfrom amp import _ext; print(_ext.isa())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**_env(), "AMP_KERNEL_ISA": env_isa},
        check=True,
    )
    return out.stdout.strip() + "\n" + out.stderr


def _env() -> dict[str, str]:
    import os  # noqa: PLC0415

    return {k: v for k, v in os.environ.items() if k != "AMP_DISABLE_EXTENSION"}


def test_env_forces_the_isa_at_import() -> None:
    assert _import_with("generic").splitlines()[0] == "generic"


def test_env_naming_an_unusable_isa_warns_and_uses_auto() -> None:
    out = _import_with("avx1024")
    assert out.splitlines()[0] == _ext.supported_isas()[-1]
    assert "AMP_KERNEL_ISA='avx1024' ignored" in out


# --- the builds agree -------------------------------------------------------------------
def _data(gdtype: torch.dtype, seed: int = 0) -> dict[str, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda s=1.0: [torch.randn(n, generator=gen) * s for n in SIZES]  # noqa: E731
    grads = [g.to(gdtype) for g in rnd(1e-2)]
    grads[2][5] = 3e-39  # a float32 subnormal (bf16 keeps it; some conversions flush it)
    return dict(
        g=grads,
        p=rnd(),
        m=rnd(1e-2),
        v=[x.abs() for x in rnd(1e-4)],
        h=[torch.empty(n, dtype=torch.bfloat16) for n in SIZES],
    )


def _run_all(d: dict[str, list[torch.Tensor]]) -> list[torch.Tensor]:
    """Every kernel with a half copy, plus the reductions, on copies of `d`."""
    c = {k: [t.clone() for t in v] for k, v in d.items()}
    out: list[torch.Tensor] = []
    mt.adam(
        c["g"],
        c["p"],
        c["m"],
        c["v"],
        c["h"],
        lr=1e-3,
        beta1=0.9,
        beta2=0.999,
        eps=1e-8,
        step=3,
        adam_w_mode=True,
        weight_decay=0.01,
        grad_scale=0.5,
    )
    out += c["p"] + c["m"] + c["v"] + c["h"]
    for adam_w_mode in (True, False):  # LAMB's per-tensor norms: the sums' order is fixed
        ratios = mt.lamb(
            c["g"],
            c["p"],
            c["m"],
            c["v"],
            c["h"],
            lr=1e-3,
            beta1=0.9,
            beta2=0.999,
            eps=1e-6,
            step=2,
            weight_decay=0.01,
            adam_w_mode=adam_w_mode,
            grad_scale=0.5,
        )
        out += c["p"] + c["m"] + c["v"] + c["h"] + [ratios]
    mt.sgd(c["g"], c["p"], c["m"], c["h"], lr=0.1, momentum=0.9, weight_decay=1e-4, grad_scale=0.5)
    out += c["p"] + c["m"] + c["h"]
    mt.adagrad(
        c["g"],
        c["p"],
        c["v"],
        c["h"],
        lr=0.1,
        eps=1e-10,
        weight_decay=1e-4,
        w_mode=False,
        grad_scale=0.5,
    )
    out += c["p"] + c["v"] + c["h"]
    norms = torch.zeros(len(SIZES))
    mt.novograd(
        c["g"],
        c["p"],
        c["m"],
        c["h"],
        grad_norms=norms,
        lr=1e-2,
        beta1=0.95,
        beta2=0.98,
        eps=1e-8,
        step=2,
        bias_correction=True,
        weight_decay=1e-3,
        grad_averaging=True,
        moment_mode=0,
        norm_type=2,
        init_norms=True,
        grad_scale=0.5,
    )
    out += c["p"] + c["m"] + c["h"] + [norms]
    total, per, _ = mt.l2norm(c["g"], 0.5, per_tensor=True)
    out += [torch.tensor([total], dtype=torch.float64), per]
    outs = [torch.empty(n) for n in SIZES]
    nrm, _ = mt.scale_l2norm(c["g"], outs, 0.25)
    out += outs + [torch.tensor([nrm], dtype=torch.float64)]
    return out


def _bitwise_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and torch.equal(
            x.view(-1).view(torch.uint8), y.view(-1).view(torch.uint8)
        ), i


def _on(mod, name: str, fn: Callable[[], list[torch.Tensor]]) -> list[torch.Tensor]:
    mod.set_isa(name)
    return fn()


@pytest.mark.parametrize("gdtype", [torch.float32, torch.bfloat16, torch.float16])
def test_avx512_is_bitwise_avx2(mod, gdtype: torch.dtype) -> None:
    """Both builds fuse the same multiply-adds; the accumulators are explicit 8-lane vectors."""
    if "avx512" not in _ext.supported_isas():
        pytest.skip("this CPU (or its OS) cannot run the AVX-512 kernels")
    d = _data(gdtype)
    _bitwise_equal(_on(mod, "avx2", lambda: _run_all(d)), _on(mod, "avx512", lambda: _run_all(d)))


@pytest.mark.parametrize("gdtype", [torch.float32, torch.bfloat16])
def test_streamed_half_copy_is_the_same_bits(
    mod, gdtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _data(gdtype, seed=1)
    for name in _ext.supported_isas():
        mod.set_isa(name)
        monkeypatch.setenv("AMP_STREAM_HALF", "0")
        plain = _run_all(d)
        monkeypatch.setenv("AMP_STREAM_HALF", "1")
        _bitwise_equal(plain, _run_all(d))


@pytest.mark.parametrize("gdtype", [torch.float32, torch.bfloat16])
def test_lamb_in_cache_groups_is_the_same_bits(
    mod, gdtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LAMB's stage 2 applies the updates stage 1 kept, per group of whole tensors that fits
    the cache budget, and recomputes them from the moments for a tensor over it: the same bits
    either way, and as with no groups at all (AMP_CACHE_BLOCK=0)."""
    d = _data(gdtype, seed=3)
    for name in _ext.supported_isas():
        mod.set_isa(name)
        monkeypatch.setenv("AMP_CACHE_BLOCK", "0")
        plain = _run_all(d)
        # 800 kB: three groups that fit and the 70001-element tensor over it; 1 byte: every
        # tensor alone, none fitting.
        for budget in ("800000", "1"):
            monkeypatch.setenv("AMP_CACHE_BLOCK", budget)
            _bitwise_equal(plain, _run_all(d))
        monkeypatch.delenv("AMP_CACHE_BLOCK")
        _bitwise_equal(plain, _run_all(d))  # the default budget: this list is one group


def test_lamb_ratios_of_empty_tensors_between_cache_groups(monkeypatch: pytest.MonkeyPatch):
    """Empty tensors have no chunks: before, between and after the groups, each still gets its
    ratio (lr), and the others theirs, whatever the grouping."""
    sizes = [0, 5, 0, 70001, 0, 40000, 0]
    results = []
    for budget in ("0", "800000", "1", None):
        if budget is None:
            monkeypatch.delenv("AMP_CACHE_BLOCK", raising=False)
        else:
            monkeypatch.setenv("AMP_CACHE_BLOCK", budget)
        gen = torch.Generator().manual_seed(4)
        g = [torch.randn(n, generator=gen) for n in sizes]
        p = [torch.randn(n, generator=gen) for n in sizes]
        m, v = [torch.zeros(n) for n in sizes], [torch.zeros(n) for n in sizes]
        ratios = mt.lamb(
            g, p, m, v, None, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-6, step=1,
            weight_decay=0.01,
        )  # fmt: skip
        assert [float(ratios[i]) for i in (0, 2, 4, 6)] == [pytest.approx(1e-2, rel=1e-6)] * 4
        results.append([ratios] + p)
    for other in results[1:]:
        _bitwise_equal(results[0], other)


def test_results_do_not_depend_on_the_thread_count(mod) -> None:
    d = _data(torch.bfloat16, seed=2)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run_all(d)
        torch.set_num_threads(max(2, before))
        _bitwise_equal(one, _run_all(d))
    finally:
        torch.set_num_threads(before)


# --- the limit probe (benchmarks/optimizer_step.py's yardstick) --------------------------
@pytest.mark.parametrize("gdtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("half", [False, True])
def test_limit_probe_touches_every_element(mod, gdtype: torch.dtype, half: bool) -> None:
    d = _data(gdtype, seed=3)
    g, p, m, v = d["g"], d["p"], d["m"], d["v"]
    p0, m0, v0 = ([t.clone() for t in x] for x in (p, m, v))
    h = d["h"] if half else None
    sumsq = mod._limit_probe(g, p, m, v, h, 3)
    ref = sum(float((x.double() ** 2).sum()) for x in g)
    assert sumsq == pytest.approx(ref, rel=1e-4)
    for i, gi in enumerate(g):
        gf = gi.float()
        assert torch.equal(m[i], m0[i] + gf) and torch.equal(v[i], v0[i] + gf)
        assert torch.equal(p[i], p0[i] - gf)
        if h is not None:
            assert torch.equal(h[i], p[i].to(torch.bfloat16))
    assert mod._limit_probe(g, p, m, v, h, 1) == pytest.approx(ref, rel=1e-4)
    with pytest.raises(ValueError, match="passes"):
        mod._limit_probe(g, p, m, v, h, 4)
