"""Published artefacts get the ordinary file mode, not mkstemp's private 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from builder.release.manifest import ManifestEntry, publish_wheel, record_wheel


def test_published_wheel_and_manifest_are_readable_by_others(tmp_path: Path) -> None:
    src = tmp_path / "pkg-1.0-py3-none-any.whl"
    src.write_bytes(b"not really a zip, publish_wheel only copies bytes")
    dist = tmp_path / "dist"
    old = os.umask(0o022)
    try:
        final = publish_wheel(src, dist)
        entry = ManifestEntry.for_wheel(
            final,
            cell="cp311-test",
            torch="2.13.0",
            python="3.11",
            base_image="b",
            compiler="c",
            builder_version="0",
            started_at="t0",
            finished_at="t1",
        )
        record_wheel(dist, entry)
    finally:
        os.umask(old)
    assert final.read_bytes() == src.read_bytes()
    for path in (final, dist / "manifest.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
