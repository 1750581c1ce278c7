"""What the builder's caches hold, and pruning them (``python -m builder cache list|prune``).

Each entry under the cache root (:func:`builder.cache.cache_root`) is one row: its kind, size,
last use (its ``last-used`` stamp, touched by every build that holds it; else its own mtime)
and its state:

* ``current`` -- this builder may still hit it;
* ``superseded`` -- it never can: its key embeds an install step, build requirements or key
  scheme this builder no longer produces, or its interpreter is gone; a half-made or
  half-removed folder left by a builder that stopped is one too;
* ``unknown`` -- keyed by what an index serves (sysroots, target sites and wheels, apt lists):
  only its age can tell.

``prune`` removes the superseded entries and those unused for longer than ``--older-than``
(default 30 days); ``--all`` every entry. An entry is removed only under its exclusive lock,
taken without waiting (:func:`builder.cache.lock_entry`): one a running build holds is kept,
and said so. Removal renames the entry aside first, so no build ever finds half of one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from builder.cache import LAST_USED, discard_entry, lock_entry, lock_path
from builder.cache.entries import Entry, held
from builder.diskspace import human

DAY = 86400.0
#: ``prune``'s default: an entry no build used for this long goes.
DEFAULT_OLDER_THAN = 30 * DAY
#: A builder's temporary folder (``.<entry>.<random>``) this old is a leftover, not a fill in
#: progress (builders before the per-entry locks took none).
LEFTOVER_AGE = 1 * DAY
#: Kinds whose entries are keyed by what an index or mirror serves (only age can tell).
INDEX_KEYED = {
    "sysroots": "sysroot",
    "sites": "target-site",
    "wheels": "target-wheel",
    "apt": "apt-lists",
}
#: Kinds removed only when asked: ccache bounds itself (its max_size, 5 GB by default).
CCACHE = "ccache"
DIGESTS = "digests"
#: Kinds whose entries no build locks (memo files written atomically, ccache's own locking, the
#: folders of other tools).
UNLOCKED = (DIGESTS, CCACHE, "other")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": DAY, "w": 7 * DAY}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")


def parse_duration(text: str) -> float:
    """``7d``, ``12h``, ``90m``, ``2w``, ``30s`` in seconds; ValueError naming *text*."""
    m = _DURATION.match(text.strip())
    if m is None:
        raise ValueError(
            f"{text!r} is not a duration (a number and a unit: s, m, h, d or w, e.g. 7d or 12h)"
        )
    return float(m.group(1)) * _UNITS[m.group(2)]


@dataclass
class Inventory:
    root: Path
    entries: list[Entry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. no engine: torch layers not listed

    @property
    def total(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def freed(self) -> int:
        return sum(e.size for e in self.entries if e.prune and not e.in_use)


# -- sizes and times ------------------------------------------------------------------------


def tree_size(path: Path) -> int:
    """Bytes on disk under *path* (hard links once)."""
    try:
        st = path.lstat()
    except OSError:
        return 0
    if not path.is_dir() or path.is_symlink():
        return st.st_blocks * 512
    seen: set[tuple[int, int]] = set()
    total = st.st_blocks * 512
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                s = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if s.st_nlink > 1 and not os.path.isdir(os.path.join(folder, name)):
                if (s.st_dev, s.st_ino) in seen:
                    continue
                seen.add((s.st_dev, s.st_ino))
            total += s.st_blocks * 512
    return total


def last_used(path: Path) -> float:
    """The entry's ``last-used`` stamp, else its own mtime (made before stamps existed)."""
    for probe in (path / LAST_USED, path):
        try:
            return probe.stat().st_mtime
        except OSError:
            continue
    return 0.0


# -- the folders ----------------------------------------------------------------------------


def _children(folder: Path) -> Iterator[Path]:
    if not folder.is_dir():
        return
    for child in sorted(folder.iterdir()):
        if not child.name.endswith((".lock", ".fill-lock")):
            yield child


def _leftover(kind: str, tmp: Path) -> Entry:
    # ensure_entry's ".<final>.<random>" and discard_entry's ".<final>.discarded.<random>"
    # (mkdtemp's random part has no dot; a final name may: torch-2.9.1-...).
    name = tmp.name[1:]
    final = tmp.with_name(
        name.split(".discarded.")[0] if ".discarded." in name else name.rsplit(".", 1)[0]
    )
    return Entry(
        kind,
        tmp.name,
        tree_size(tmp),
        last_used(tmp),
        "superseded",
        "a half-made or half-removed entry left by a builder that stopped",
        path=tmp,
        lock_for=final,
    )


def _folder_entries(root: Path) -> Iterator[Entry]:
    from builder.backends.torchenv import (  # noqa: PLC0415 - import cycle
        LAYER_LOCKS,
        host_env_superseded,
    )

    for kind_dir in _children(root):
        kind = kind_dir.name
        if kind in (CCACHE, DIGESTS) or not kind_dir.is_dir():
            if kind == DIGESTS:
                yield _digests(kind_dir)
            elif kind == CCACHE:
                yield Entry(
                    CCACHE,
                    kind_dir.name,
                    tree_size(kind_dir),
                    last_used(kind_dir),
                    "current",
                    "bounded by ccache's own max_size; removed by prune --ccache only",
                    path=kind_dir,
                )
            else:
                yield _other(kind_dir)
            continue
        if kind == LAYER_LOCKS:
            continue  # the torch layers' locks: the layers are the engine's (cachelayers)
        known = kind in INDEX_KEYED or kind in ("torch-envs", "pip")
        if not known:
            yield _other(kind_dir)
            continue
        for child in _children(kind_dir):
            if child.name.startswith("."):
                if time.time() - last_used(child) > LEFTOVER_AGE:
                    yield _leftover(kind, child)
                continue
            if kind == "torch-envs":
                if not child.is_dir():
                    continue  # the last key per cell (py3.11-torch2.13.0.json): bytes
                why = host_env_superseded(child)
                yield Entry(
                    "torch-env",
                    child.name,
                    tree_size(child),
                    last_used(child),
                    "superseded" if why else "current",
                    why,
                    path=child,
                )
            elif kind == "pip":
                yield _pip_zip(child)
            else:
                yield Entry(
                    INDEX_KEYED[kind],
                    child.name,
                    tree_size(child),
                    last_used(child),
                    "unknown",
                    "keyed by what the index serves: aged out only",
                    path=child,
                )


def _pip_zip(path: Path) -> Entry:
    import pip  # noqa: PLC0415 - the builder's own (builder.backends.downloadsize.pip_zip)

    mine = f"pip-{pip.__version__}.zip"
    why = "" if path.name == mine else f"made for another pip (this builder's is {mine})"
    return Entry(
        "pip",
        path.name,
        tree_size(path),
        last_used(path),
        "superseded" if why else "current",
        why,
        path=path,
    )


def _digests(folder: Path) -> Entry:
    memos = [p for p in folder.iterdir() if p.is_file()]
    newest = max((p.stat().st_mtime for p in memos), default=last_used(folder))
    return Entry(
        DIGESTS,
        f"{len(memos)} file digests",
        sum(tree_size(p) for p in memos),
        newest,
        "current",
        "sha256 memos of wheelhouse files: each aged by its last use",
        path=folder,
    )


def _other(path: Path) -> Entry:
    return Entry(
        "other",
        path.name,
        tree_size(path),
        last_used(path),
        "unknown",
        "not made by the builder (e.g. a test suite's): removed by prune --all only",
        path=path,
    )


def inventory(root: Path, engine: Any = None, engine_error: str = "") -> Inventory:
    """Every entry under *root*, and the engine's torch layers (when *engine* answers)."""
    from builder.cache.layers import torch_layers  # noqa: PLC0415

    inv = Inventory(root, list(_folder_entries(root)))
    for e in inv.entries:
        if e.path is not None and e.kind not in UNLOCKED:
            e.in_use = held(e.lock_for or e.path)
    if engine is not None:
        inv.entries += torch_layers(engine)
    else:
        inv.notes.append(f"torch layers: not listed ({engine_error or 'no container engine'})")
    return inv


# -- deciding and removing ------------------------------------------------------------------


def decide(
    inv: Inventory, older_than: float, everything: bool, ccache: bool, now: Optional[float] = None
) -> None:
    """Set each entry's ``prune`` reason ('' for one that stays)."""
    now = time.time() if now is None else now
    for e in inv.entries:
        if e.kind == CCACHE:
            e.prune = "--ccache" if ccache else ""
        elif everything:
            e.prune = "--all"
        elif e.kind == "other":
            e.prune = ""
        elif e.kind == DIGESTS:
            e.prune = (
                "memos unused for longer than the limit" if _old_memos(e, now - older_than) else ""
            )
        elif e.state == "superseded":
            e.prune = f"superseded: {e.why}"
        elif now - e.last_used > older_than:
            e.prune = f"unused for {_age(now - e.last_used)}"
        else:
            e.prune = ""


def _old_memos(e: Entry, cutoff: float) -> list[Path]:
    assert e.path is not None
    return [p for p in e.path.iterdir() if p.is_file() and p.stat().st_mtime < cutoff]


def prune(inv: Inventory, engine: Any, older_than: float, everything: bool, dry_run: bool) -> None:
    """Remove what :func:`decide` marked; each entry's ``result`` says what happened."""
    from builder.cache.layers import remove_layer  # noqa: PLC0415

    cutoff = time.time() - older_than
    for e in inv.entries:
        if not e.prune:
            continue
        if e.in_use:
            e.result = f"kept: {e.in_use}"
        elif dry_run:
            e.result = "would remove"
        elif e.image:
            e.result = remove_layer(engine, e)
        elif e.kind == DIGESTS and not everything:
            old = _old_memos(e, cutoff)
            for memo in old:
                memo.unlink(missing_ok=True)  # one file: atomic
            e.size = sum(tree_size(p) for p in old)
            e.result = f"removed {len(old)} memos"
        else:
            try:
                e.result = _remove_path(e)
            except OSError as exc:  # the others are still pruned; the command exits 1
                e.result = f"failed: {exc}"


def _remove_path(e: Entry) -> str:
    assert e.path is not None
    guard = e.lock_for or e.path
    lock = None if e.kind in UNLOCKED else lock_entry(guard, shared=False, wait=False)
    if lock is None and e.kind not in UNLOCKED:
        e.in_use = f"in use by a running build (its lock {lock_path(guard)} is held)"
        return f"kept: {e.in_use}"
    try:
        if e.path.is_dir() and not e.path.is_symlink():
            if e.lock_for is not None:
                shutil.rmtree(e.path, ignore_errors=True)  # already aside: nobody trusts it
            else:
                discard_entry(e.path)
        else:
            e.path.unlink(missing_ok=True)
        if lock is not None and not (e.lock_for or e.path).exists():
            lock_path(guard).unlink(missing_ok=True)  # waiters re-open it (lock_entry)
    finally:
        if lock is not None:
            lock.close()
    return "removed"


# -- showing it -----------------------------------------------------------------------------


def _age(seconds: float) -> str:
    return f"{seconds / DAY:.0f} days" if seconds >= DAY else f"{seconds / 3600:.0f} hours"


def table(inv: Inventory, show_result: bool = False) -> list[str]:
    rows = [("KIND", "NAME", "SIZE", "LAST USED", "STATE")]
    for e in inv.entries:
        state = e.state + (f" ({e.why})" if e.state != "current" and e.why else "")
        if e.in_use:
            state += f"; {e.in_use}"
        if show_result and e.result:
            state = f"{e.result} -- {state}"
        rows.append(
            (
                e.kind,
                e.name,
                human(e.size),
                time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used)),
                state,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]


def document(inv: Inventory, older_than: float) -> str:
    return json.dumps(
        {
            "root": str(inv.root),
            "older_than_s": older_than,
            "entries": [e.document() for e in inv.entries],
            "total_bytes": inv.total,
            "prune_bytes": inv.freed,
            "notes": inv.notes,
        },
        indent=1,
    )


def summary(inv: Inventory, older_than: float) -> str:
    marked = [e for e in inv.entries if e.prune and not e.in_use]
    where = str(inv.root) + (
        " and the engine's torch layers" if any(e.image for e in inv.entries) else ""
    )
    return (
        f"caches ({where}): {human(inv.total)} in {entries(len(inv.entries))}; `cache "
        f"prune` (superseded, or unused for {_age(older_than)}) would free "
        f"{human(inv.freed)} ({entries(len(marked))})"
    )


def entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"
