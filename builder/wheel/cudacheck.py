"""A CUDA wheel's device code against its cell's arch list, without a GPU.

Every compiled file of the wheel (builder.wheel.modules: extension modules and other shared
objects) is read for its ``.nv_fatbin`` (builder.wheel.fatbin). A file with device code must
carry SASS for exactly the arch list's capabilities and PTX for exactly its ``+PTX`` ones; a
wheel with device code nowhere was built without CUDA (its setup.py found no nvcc, or a
FORCE_ONLY_CPU-style switch was on) and fails too. The failure names the file, what it holds,
what was asked and where the arch list came from.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from builder.errors import StepFailed
from builder.plan.cudacell import CudaRecord
from builder.wheel.fatbin import DeviceCode, FatbinError, device_code
from builder.wheel.modules import compiled_files, installed_path


def check_device_code(wheel: Path, record: CudaRecord) -> dict[str, Any]:
    """The per-file device code of *wheel* (for the manifest); StepFailed when it is not what
    *record* (a CUDA cell's) asked for."""
    assert record.arch_list is not None
    want = DeviceCode(
        sass=tuple(sorted(int(a) for a in record.arch_list.sass)),
        ptx=tuple(sorted(int(a) for a in record.arch_list.ptx)),
    )
    compiled = compiled_files(wheel)
    wanted_paths = {m.replace(".", "/") for m in compiled.modules} | set(compiled.libraries)
    found: dict[str, str] = {}
    problems: list[str] = []
    with zipfile.ZipFile(wheel) as zf:
        for member in sorted(zf.namelist()):
            path = installed_path(member)
            if path is None or not path.endswith(".so"):
                continue
            stem = path.rsplit("/", 1)[-1].split(".", 1)[0]
            folder = path.rsplit("/", 1)[0] if "/" in path else ""
            if path not in wanted_paths and f"{folder}/{stem}".lstrip("/") not in wanted_paths:
                continue  # grafted by auditwheel
            try:
                code = device_code(zf.read(member))
            except FatbinError as exc:
                raise StepFailed(
                    f"{wheel.name}: {path}: its {'.nv_fatbin'} section is not a "
                    f"fat binary this reader knows: {exc}"
                ) from None
            if code is None:
                continue  # host code only (a CPU op library beside the CUDA one)
            found[path] = code.describe()
            missing = [f"sm_{a}" for a in want.sass if a not in code.sass] + [
                f"compute_{a} (PTX)" for a in want.ptx if a not in code.ptx
            ]
            extra = [f"sm_{a}" for a in code.sass if a not in want.sass] + [
                f"compute_{a} (PTX)" for a in code.ptx if a not in want.ptx
            ]
            if missing or extra:
                problems.append(
                    f"{path} holds {code.describe()}"
                    + (f"; missing {', '.join(missing)}" if missing else "")
                    + (f"; not asked for {', '.join(extra)}" if extra else "")
                )
    asked = (
        f"TORCH_CUDA_ARCH_LIST={record.arch_list.text} ({record.arch_list_source}): "
        f"{want.describe()}"
    )
    if not found:
        raise StepFailed(
            f"{wheel.name}: no compiled file carries CUDA device code (no "
            f"{'.nv_fatbin'} section), but the cell is a CUDA {record.cuda} cell "
            f"asking for {asked}: the project built without CUDA (its setup.py "
            "found no nvcc, or a switch such as FORCE_ONLY_CPU was on)"
        )
    if problems:
        raise StepFailed(
            f"{wheel.name}: device code differs from the arch list {asked}: " + "; ".join(problems)
        )
    return {"version": record.cuda, "arch_list": record.arch_list.text, "device_code": found}
