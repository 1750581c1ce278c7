"""The ``npu`` extra a cell's wheel should carry, derived from configs/support.yaml with plain
``yaml.safe_load`` -- not the builder's loader: the tests hold the builder to the file itself --
and read back from a wheel's METADATA with the standard library's email parser."""

from __future__ import annotations

import email.parser
import zipfile
from pathlib import Path
from typing import Optional

import yaml
from packaging.requirements import Requirement

from builder.config import REPO_ROOT

SUPPORT = REPO_ROOT / "configs" / "support.yaml"


def expected_torch_npu(
    torch: str, python: str, machine: str, support: Path = SUPPORT
) -> Optional[str]:
    """The table's torch-npu release for *torch* when it has a wheel for *python* on *machine*."""
    entry = (yaml.safe_load(support.read_text()).get("torch_npu") or {}).get(torch)
    if not entry or python not in entry.get(machine, []):
        return None
    return str(entry["release"])


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [
            n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
        ]
        return zf.read(name).decode("utf-8")


def npu_fields(metadata: str) -> tuple[list[str], list[str]]:
    """(every ``Provides-Extra``, the ``Requires-Dist`` values that name torch-npu)."""
    msg = email.parser.Parser().parsestr(metadata, headersonly=True)
    extras = msg.get_all("Provides-Extra") or []
    reqs = [
        r
        for r in msg.get_all("Requires-Dist") or []
        if Requirement(r).name.lower().replace("_", "-") == "torch-npu"
    ]
    return extras, reqs


def assert_npu_extra(metadata: str, release: Optional[str], spec: Optional[str] = None) -> None:
    """*metadata* has the ``npu`` extra pinning torch-npu *release* (None: no extra at all), or,
    for a stable-ABI wheel, requiring the range *spec* (``>=2.10``), and pip reads it that way:
    the requirement applies with ``[npu]`` and only then."""
    extras, reqs = npu_fields(metadata)
    if release is None:
        assert "npu" not in extras and reqs == [], (extras, reqs)
        return
    want = spec or f"=={release}"
    assert extras.count("npu") == 1, extras
    assert reqs == [f'torch-npu{want}; extra == "npu"'], reqs
    req = Requirement(reqs[0])
    assert [str(s) for s in req.specifier] == [want]
    assert req.marker is not None
    assert req.marker.evaluate({"extra": "npu"}) and not req.marker.evaluate({"extra": ""})
