"""The ``npu`` extra: ``pip install <wheel>[npu]`` brings the torch-npu release that pairs with
the torch the wheel was built against.

torch-npu (the Ascend NPU adapter) is built for exactly one torch release, so the extra pins one
release (``Requires-Dist: torch-npu==2.13.0; extra == "npu"``); which one is decided by the
support table (``torch_npu`` in configs/support.yaml, :meth:`SupportTable.npu_pin`) and carried
by the resolved cell. The rewrite happens with the version label (builder.wheel.localversion),
after the project's own build, so every backend and every ``--project`` gets the same lines.
"""

from __future__ import annotations

from typing import Optional

from builder.wheel.requires import repin

NPU_EXTRA = "npu"
TORCH_NPU = "torch-npu"


def npu_requirement(release: str, spec: Optional[str] = None) -> str:
    """The extra's requirement line value, e.g. ``torch-npu==2.13.0; extra == "npu"``, or with
    *spec* (a stable wheel's range, ``>=2.10``) ``torch-npu>=2.10; extra == "npu"``."""
    return f'{TORCH_NPU}{spec or "==" + release}; extra == "{NPU_EXTRA}"'


def add_npu_extra(metadata: str, release: str, spec: Optional[str] = None) -> str:
    """*metadata* (a METADATA file's text) with the ``npu`` extra pinning torch-npu *release*
    (or requiring *spec*: a stable wheel serves many torches, and each torch-npu release
    requires its own torch, so pip's resolver pairs them).

    A torch-npu requirement the project declared itself gets the same pin (its marker kept):
    a second, different torch-npu would be uninstallable next to ours. ``Provides-Extra: npu``
    and our requirement are added once; a second rewrite changes nothing.
    """
    head, sep, body = metadata.partition("\n\n")
    lines = head.split("\n")
    repin(lines, TORCH_NPU, f"{TORCH_NPU}{spec or '==' + release}")
    wanted = [f"Provides-Extra: {NPU_EXTRA}", f"Requires-Dist: {npu_requirement(release, spec)}"]
    missing = [w for w in wanted if w not in lines]
    if missing:
        # After the last dependency field, else after the last header line (never into the body).
        deps = [
            i for i, ln in enumerate(lines) if ln.startswith(("Requires-Dist:", "Provides-Extra:"))
        ]
        filled = [i for i, ln in enumerate(lines) if ln.strip()]
        at = (deps or filled or [-1])[-1] + 1
        lines[at:at] = missing
    return "\n".join(lines) + sep + body
