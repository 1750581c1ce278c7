"""Is this file a whole wheel? A structural check, cheap enough to run on every input wheel.

A truncated download, a copy cut short by a full disk, a file spliced by a proxy: pip meets
them deep inside an install as ``BadZipFile`` (or installs a torch with files missing). Here,
before anything uses a wheelhouse or a bundle records one, each wheel's zip end record and
central directory are read and every member's local header is looked for where the directory
says it is, and within the file -- reads of a few bytes per member, no decompression (torch's
~10,000 members take milliseconds). Bytes altered in place without changing the structure are
what the sha256s are for (bundle.json, the builder's lock, the index's hashes).
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

from builder.wheel.untrusted import member_problems

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., name length, extra length
_LOCAL_SIGNATURE = b"PK\x03\x04"


def wheel_problem(path: Path) -> Optional[str]:
    """Why *path* is not a whole wheel, or None when its structure is intact."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as zf:
            unsafe = member_problems(zf)
            if unsafe:  # builder.wheel.untrusted: '..', absolute names, symlinks, zip bombs
                return "; ".join(unsafe[:3]) + (
                    f"; and {len(unsafe) - 3} more" if len(unsafe) > 3 else ""
                )
            members = zf.infolist()
            with path.open("rb") as fh:
                for m in members:
                    fh.seek(m.header_offset)
                    raw = fh.read(_LOCAL_HEADER.size)
                    if len(raw) < _LOCAL_HEADER.size:
                        return f"member {m.filename} lies past the end of the file"
                    signature, name_len, extra_len = _LOCAL_HEADER.unpack(raw)
                    end = m.header_offset + _LOCAL_HEADER.size + name_len + extra_len
                    if signature != _LOCAL_SIGNATURE or end + m.compress_size > size:
                        return f"member {m.filename} is cut off or overwritten"
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        return f"not a readable zip ({exc})"
    return None


def damaged_wheels(paths: Iterable[Path]) -> list[str]:
    """One line per damaged wheel among *paths*, naming it, its size and what is wrong."""
    out = []
    for path in paths:
        problem = wheel_problem(path)
        if problem is not None:
            out.append(f"{path} ({path.stat().st_size} bytes): {problem}")
    return out
