"""One cache entry as ``cache list`` shows it and ``cache prune`` decides on it (:class:`Entry`),
and who holds one now (:func:`held`): shared by the folders' inventory
(:mod:`builder.cache.prune`) and the engine's torch layers (:mod:`builder.cache.layers`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from builder.cache import lock_entry, lock_path


@dataclass
class Entry:
    kind: str
    name: str
    size: int  # bytes
    last_used: float  # epoch seconds
    state: str  # current | superseded | unknown
    why: str = ""
    path: Optional[Path] = None  # the folder or file (None: an engine image)
    image: str = ""  # engine image id (torch layers)
    tags: tuple[str, ...] = ()
    in_use: str = ""  # who holds it now ("" when nobody)
    lock_for: Optional[Path] = None  # the entry whose lock guards this one (leftovers)
    prune: str = ""  # why prune removes it ("" when it stays)
    result: str = ""  # what prune did

    def document(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "size": self.size,
            "last_used": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.last_used)),
            "state": self.state,
            "why": self.why,
            "path": str(self.path) if self.path else None,
            "image": self.image or None,
            "tags": list(self.tags),
            "in_use": self.in_use,
            "prune": self.prune,
            **({"result": self.result} if self.result else {}),
        }


def held(entry: Path) -> str:
    """Who holds *entry* now: '' when its lock is free (probed, released at once)."""
    if not lock_path(entry).exists():
        return ""  # a build creates the lock file before it holds the entry; listing makes none
    lock = lock_entry(entry, shared=False, wait=False)
    if lock is None:
        return f"in use by a running build (its lock {lock_path(entry)} is held)"
    lock.close()
    return ""
