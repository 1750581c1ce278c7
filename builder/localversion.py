"""Give a built wheel the torch it was built against as a PEP 440 local version label.

``--project`` builds any PEP 517 project, and most projects know nothing of our
``+torch2.13`` convention (DESIGN.md, wheel names). Rather than asking each project to read an
environment variable, the pipeline rewrites the finished wheel: the ``.dist-info`` folder's
name, ``Version:`` in ``METADATA``, the file name, and a fresh ``RECORD`` (hashes per PEP 376 /
the wheel spec). A version that already has a local label gets ours appended with a dot
(``1.0+abc`` -> ``1.0+abc.torch2.13``); one that already ends in the label is left alone.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from pathlib import Path

from builder.errors import StepFailed
from builder.repair import split_wheel_name

_LABEL = re.compile(r"^[A-Za-z0-9]+(\.[A-Za-z0-9]+)*$")


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


def add_local_version(wheel: Path, label: str, out_dir: Path) -> Path:
    """Write a copy of *wheel* whose version carries ``+label`` into *out_dir*; return it.

    Returns *wheel* unchanged (not copied) when its version already carries the label.
    """
    dist, version, py, abi, plats = split_wheel_name(wheel.name)
    new_version = with_local(version, label)
    if new_version == version:
        return wheel
    old_info, new_info = f"{dist}-{version}.dist-info/", f"{dist}-{new_version}.dist-info/"
    # PEP 427 keeps '+' in file names ('1.0+torch2.13'); only '-' would need escaping.
    target = out_dir / f"{dist}-{new_version}-{py}-{abi}-{'.'.join(plats)}.whl"
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
                    name = new_info + name[len(old_info):]
                    if name == new_info + "METADATA":
                        text = data.decode("utf-8")
                        text, n = re.subn(r"(?m)^Version: .*$", f"Version: {new_version}", text,
                                          count=1)
                        if n != 1:
                            raise StepFailed(f"{wheel.name}: METADATA has no Version line")
                        data = text.encode("utf-8")
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
