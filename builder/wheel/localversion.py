"""Give a built wheel the torch it was built against as a PEP 440 local version label.

``--project`` builds any PEP 517 project, and most projects know nothing of our
``+torch2.13`` convention (README.md, wheel names). Rather than asking each project to read an
environment variable, the pipeline rewrites the finished wheel: the ``.dist-info`` folder's
name, ``Version:`` in ``METADATA``, the file name, and a fresh ``RECORD`` (hashes per PEP 376 /
the wheel spec). A version that already has a local label gets ours appended with a dot
(``1.0+abc`` -> ``1.0+abc.torch2.13``); one that already ends in the label is left alone.

The same rewrite pins the torch requirement to the release series the binary was compiled
against (``Requires-Dist: torch==2.13.*``): a C++ extension is tied to torch's ABI, and the pin
is what lets pip pick the matching ``+torchX.Y`` wheel out of an index that holds several
(the others' requirements cannot be met next to the installed torch, so pip backtracks).
A ``torch`` requirement the project declared is replaced (its environment marker kept); a
project that declared none gets one. When the cell's torch has a torch-npu release, the same
rewrite adds the ``npu`` extra that pins it (builder.wheel.npuextra).

A wheel on torch's stable ABI (builder.plan.builds) gets no label (*label* None): it serves every
torch from its minimum on, so its requirement is that range (``Requires-Dist: torch>=2.10``,
*pin*) and its ``npu`` extra a range of torch-npu releases (*npu_spec*), of which pip takes the
one whose own torch requirement matches the torch it installs.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from pathlib import Path
from typing import Optional

from builder.errors import StepFailed
from builder.wheel.npuextra import add_npu_extra
from builder.wheel.repair import split_wheel_name
from builder.wheel.requires import repin

_LABEL = re.compile(r"^[A-Za-z0-9]+(\.[A-Za-z0-9]+)*$")
#: ``torch2.13``, or a CUDA wheel's ``torch2.14.cu130`` (the same series pin: the CUDA is the
#: installed torch's build, which a requirement cannot name; docs/cuda-wheels.md).
_TORCH_LABEL = re.compile(r"^torch(\d+)\.(\d+)(?:\.cu\d+)?$")


def torch_pin(label: str) -> Optional[str]:
    """``torch2.13`` (or ``torch2.14.cu130``) -> ``torch==2.13.*``; None for a label that
    names no torch series."""
    m = _TORCH_LABEL.match(label)
    return f"torch=={m.group(1)}.{m.group(2)}.*" if m else None


def pin_torch_requirement(metadata: str, pin: str) -> str:
    """*metadata* (a METADATA file's text) with every ``Requires-Dist: torch…`` replaced by
    *pin* (markers kept), or *pin* added when torch is not required at all."""
    head, sep, body = metadata.partition("\n\n")
    lines = head.split("\n")
    found = repin(lines, "torch", pin)
    if not found:
        # After the last Requires-Dist, else after the last header line: a METADATA without a
        # description ends in "\n", and an insertion after that empty line would land in the
        # body, where no installer reads it.
        deps = [i for i, line in enumerate(lines) if line.startswith("Requires-Dist:")]
        filled = [i for i, line in enumerate(lines) if line.strip()]
        lines.insert((deps or filled or [-1])[-1] + 1, f"Requires-Dist: {pin}")
    return "\n".join(lines) + sep + body


def with_local(version: str, label: str) -> str:
    if not _LABEL.match(label):
        raise StepFailed(
            f"local version label {label!r} is not valid; expected letters, digits, dots"
        )
    if "+" in version and (version.endswith("+" + label) or version.endswith("." + label)):
        return version
    return f"{version}.{label}" if "+" in version else f"{version}+{label}"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def add_local_version(
    wheel: Path,
    label: Optional[str],
    out_dir: Path,
    *,
    torch_npu: Optional[str] = None,
    pin: Optional[str] = None,
    npu_spec: Optional[str] = None,
) -> Path:
    """Write a copy of *wheel* whose version carries ``+label`` into *out_dir*; return it.

    A ``torchX.Y`` label also pins the torch requirement (:func:`pin_torch_requirement`);
    *pin* replaces that requirement (a stable wheel: *label* None, ``torch>=2.10``);
    *torch_npu* (a torch-npu release) adds the ``npu`` extra pinning it, or requiring
    *npu_spec* (``>=2.10``) when given. Returns *wheel* unchanged (not copied) when its version
    already carries the label and its metadata already has the pin and the extra.
    """
    dist, version, py, abi, plats = split_wheel_name(wheel.name)
    new_version = with_local(version, label) if label else version
    if pin is None and label:
        pin = torch_pin(label)

    def requirements(text: str) -> str:
        if pin is not None:
            text = pin_torch_requirement(text, pin)
        if torch_npu is None:
            return text
        return add_npu_extra(text, torch_npu, spec=npu_spec)

    old_info = f"{dist}-{version}.dist-info/"
    if new_version == version:
        with zipfile.ZipFile(wheel) as src:
            try:
                meta = src.read(old_info + "METADATA").decode("utf-8")
            except KeyError:
                raise StepFailed(
                    f"{wheel.name}: no {old_info}METADATA; not a valid wheel"
                ) from None
        if requirements(meta) == meta:
            return wheel
    new_info = f"{dist}-{new_version}.dist-info/"
    # PEP 427 keeps '+' in file names ('1.0+torch2.13'); only '-' would need escaping.
    target = out_dir / f"{dist}-{new_version}-{py}-{abi}-{'.'.join(plats)}.whl"
    if target.resolve() == wheel.resolve():
        raise StepFailed(
            f"{wheel.name}: the metadata rewrite must write into another folder than {out_dir}"
        )
    records: list[str] = []
    with zipfile.ZipFile(wheel) as src:
        names = src.namelist()
        if old_info + "METADATA" not in names:
            raise StepFailed(f"{wheel.name}: no {old_info}METADATA; not a valid wheel")
        with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                name = info.filename
                if name == old_info + "RECORD":
                    continue
                data = src.read(info)
                if name.startswith(old_info):
                    name = new_info + name[len(old_info) :]
                    if name == new_info + "METADATA":
                        text = data.decode("utf-8")
                        text, n = re.subn(
                            r"(?m)^Version: .*$", f"Version: {new_version}", text, count=1
                        )
                        if n != 1:
                            raise StepFailed(f"{wheel.name}: METADATA has no Version line")
                        data = requirements(text).encode("utf-8")
                copy = zipfile.ZipInfo(name, date_time=info.date_time)
                copy.external_attr = info.external_attr
                copy.compress_type = zipfile.ZIP_DEFLATED
                dst.writestr(copy, data)
                records.append(f"{name},{_record_hash(data)},{len(data)}")
            records.append(f"{new_info}RECORD,,")
            record = _record_info(new_info + "RECORD")
            dst.writestr(record, "\n".join(records) + "\n")
    return target


def _record_info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info
