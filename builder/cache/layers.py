"""The docker backend's torch layers (``ampforge/torch:<cell>-<key>``) as cache entries.

Their last use is the engine's own ``Metadata.LastTagTime``: a label cannot change once an
image is committed, so :func:`builder.backends.torchenv.docker_torch_image` tags the image
again on every hit, which the engine records (``Created`` before the first re-tag). An image
that a container uses (running or stopped: a build runs its cell in one) is kept; one that none
uses is untagged through the engine API, never forced, and the engine frees its layers once no
tag holds them.
"""

from __future__ import annotations

import calendar
import json
import time
from typing import Any

from builder.backends.torchenv import (
    CELL_LABEL,
    DOCKER_OPTIONAL,
    DOCKER_WHERE,
    PARTS_LABEL,
    TORCH_REPOSITORY,
    layer_lock,
    superseded,
)
from builder.cache import lock_entry, lock_path
from builder.cache.entries import Entry, held


def _epoch(stamp: str) -> float:
    """Seconds since the epoch of the engine's RFC 3339 time (0 for Go's zero time)."""
    if not stamp or stamp.startswith("0001-"):
        return 0.0
    head = stamp.split(".")[0].rstrip("Z")
    try:
        return float(calendar.timegm(time.strptime(head, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return 0.0


def torch_layers(engine: Any) -> list[Entry]:
    """One entry per torch layer image in *engine*, with who uses it."""
    from docker.errors import NotFound  # noqa: PLC0415 - the docker SDK, with the engine

    api = engine.api
    users: dict[str, list[str]] = {}
    for c in api.containers(all=True):
        users.setdefault(str(c.get("ImageID", "")), []).append(
            str((c.get("Names") or [c["Id"][:12]])[0]).lstrip("/")
        )
    out = []
    for img in api.images(filters={"label": CELL_LABEL}):
        named = [t for t in img.get("RepoTags") or () if t != "<none>:<none>"]
        tags = tuple(t for t in named if t.startswith(TORCH_REPOSITORY + ":"))
        if named and not tags:
            continue  # an image made FROM a torch layer inherits its labels: not a layer
        labels = img.get("Labels") or {}
        try:
            parts = dict(json.loads(labels.get(PARTS_LABEL, "")))
        except ValueError:
            parts = {}
        key = tags[0].rsplit("-", 1)[-1] if tags else ""
        why = (
            superseded(parts, key, DOCKER_WHERE, DOCKER_OPTIONAL)
            if tags
            else "untagged (no build finds it)"
        )
        if not why and engine.image_id(str(parts["cell_image"])) is None:
            why = f"its cell image {str(parts['cell_image'])[:19]} is gone from the engine"
        try:
            meta = api.inspect_image(img["Id"]).get("Metadata") or {}
        except NotFound:
            continue  # removed since the listing (a `cache prune` beside this one): gone
        # The image's Size counts its cell image's layers too, which removing it never frees.
        size = int(img.get("Size", 0)) - _size(api, str(parts.get("cell_image", "")))
        used = _epoch(str(meta.get("LastTagTime", ""))) or float(img.get("Created", 0))
        names = users.get(str(img["Id"]), [])
        in_use = f"used by container {', '.join(names)}" if names else ""
        for tag in tags:
            in_use = in_use or held(layer_lock(tag.split(":", 1)[1]))
        out.append(
            Entry(
                "torch-layer",
                tags[0] if tags else img["Id"][:19],
                max(size, 0),
                used,
                "superseded" if why else "current",
                why,
                image=str(img["Id"]),
                tags=tags,
                in_use=in_use,
            )
        )
    return out


def _size(api: Any, image: str) -> int:
    from docker.errors import APIError  # noqa: PLC0415 - the docker SDK, with the engine

    if not image:
        return 0
    try:
        return int(api.inspect_image(image).get("Size", 0))
    except APIError:
        return 0


def remove_layer(engine: Any, entry: Entry) -> str:
    """Untag *entry*'s image (never forced: the engine refuses while a container uses it)."""
    from docker.errors import APIError  # noqa: PLC0415 - the docker SDK, with the engine

    locks = []
    try:
        for tag in entry.tags:  # a build on this machine that holds it: kept (and said so)
            guard = layer_lock(tag.split(":", 1)[1])
            lock = lock_entry(guard, shared=False, wait=False)
            if lock is None:
                entry.in_use = f"in use by a running build (its lock {lock_path(guard)} is held)"
                return f"kept: {entry.in_use}"
            locks.append((guard, lock))
        try:
            for tag in entry.tags or (entry.image,):
                engine.api.remove_image(tag)
        except APIError as exc:
            entry.in_use = f"the engine refused: {exc.explanation or exc}"
            return f"kept: {entry.in_use}"
        for guard, _lock in locks:
            lock_path(guard).unlink(missing_ok=True)
        return "removed"
    finally:
        for _guard, lock in locks:
            lock.close()
