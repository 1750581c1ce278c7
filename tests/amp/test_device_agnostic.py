"""amp derives device types from the tensors it is given: no CUDA (or other accelerator)
API, device name or process-group backend is named in its code. The one device named is the
CPU, where its compiled kernels run (amp/_device.py). amp/_torch_compat.py is the exception: on
torches without ``torch.accelerator`` it answers that question the way torch.accelerator does,
which takes naming the device torch itself names there. A guard against regressions: such a
name in amp/ would make amp silently wrong on Ascend's npu (see tests/npu for amp there)."""

from __future__ import annotations

import re
from pathlib import Path

AMP = Path(__file__).resolve().parents[2] / "amp"
#: Reproduces torch >= 2.6's own device lookup for older torches (see the docstring).
EXEMPT = {AMP / "_torch_compat.py"}
# Code, not prose: calls and string literals.
FORBIDDEN = re.compile(
    r"torch\.cuda\b|\.cuda\(|\.npu\(|torch\.npu\b|['\"](cuda|npu|nccl|hccl|xpu|mps)(:\d+)?['\"]"
)


def _code_lines(path: Path) -> list[tuple[int, str]]:
    out, in_doc = [], False
    for no, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        quotes = stripped.count('"""')
        if in_doc or stripped.startswith('"""'):
            if quotes == 1:
                in_doc = not in_doc
            continue
        out.append((no, line.split("#", 1)[0]))
    return out


def test_amp_names_no_accelerator() -> None:
    hits = [
        f"{p.relative_to(AMP.parent)}:{no}: {code.strip()}"
        for p in sorted(AMP.rglob("*.py"))
        if p not in EXEMPT
        for no, code in _code_lines(p)
        if FORBIDDEN.search(code)
    ]
    assert hits == []


def test_the_guard_catches_what_it_is_for() -> None:
    for bad in (
        'device = torch.device("cuda", torch.cuda.current_device())',
        'if dist.get_backend() == "nccl":',
        "x = x.cuda()",
        "y.to('npu:0')",
    ):
        assert FORBIDDEN.search(bad), bad
    assert not FORBIDDEN.search('device.type == "cpu"')
