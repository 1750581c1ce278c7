"""Where the suite's CPU goes, per test: ``AMPFORGE_CPU_PROFILE=DIR make test`` writes one JSON
line per test to ``DIR/torch<version>-<xdist worker>.jsonl``; ``python benchmarks/ci_cpu.py DIR``
sums them. The torch version is in the name and in each line: CI's older-torch lanes run their
own pytest sessions beside the main suite's, inherit the variable, and have workers of the same
names (``gw0``); each session's lines stay apart (``ci_cpu.py --torch``, ``--by torch``).

Wall time misleads on a loaded machine (a test waiting for a core looks slow), so each line
holds CPU-seconds: the test process's own, its waited-for children's (every build the builder
runs as a subprocess), and, for the docker stream's tests, what the engine's containers used
(the ``cpuacct`` cgroup the engine puts them in, cgroup v1 or v2; 0 where neither is readable).
The engine's daemon itself (image loads, commits) is not counted. Module- and session-scoped
fixtures count towards the test that first needs them.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

#: The session's torch: which of CI's concurrent pytest sessions a line belongs to.
TORCH = torch.__version__

#: The engine's containers' CPU in nanoseconds (cgroup v1) or microseconds (v2, "usage_usec").
_CGROUP_V1 = Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage")
_CGROUP_V2 = Path("/sys/fs/cgroup/system.slice/docker.service/cpu.stat")


def _engine_cpu() -> float:
    try:
        return int(_CGROUP_V1.read_text()) / 1e9
    except (OSError, ValueError):
        pass
    try:
        for line in _CGROUP_V2.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        pass
    return 0.0


def _own_and_children() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@contextmanager
def measured(out_dir: str, nodeid: str, group: str, engine_stream: bool) -> Iterator[None]:
    """Record one test's wall time and CPU-seconds as a line of ``out_dir``'s worker file."""
    wall0, (own0, kids0), engine0 = time.time(), _own_and_children(), _engine_cpu()
    try:
        yield
    finally:
        wall1, (own1, kids1), engine1 = time.time(), _own_and_children(), _engine_cpu()
        record = {
            "id": nodeid,
            "group": group,
            "wall": round(wall1 - wall0, 3),
            "own": round(own1 - own0, 3),
            "children": round(kids1 - kids0, 3),
            # only the docker stream's tests run containers; the other worker's tests
            # would see that stream's containers in the cgroup too
            "engine": round(engine1 - engine0, 3) if engine_stream else 0.0,
            "torch": TORCH,
        }
        folder = Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with (folder / f"torch{TORCH}-{worker}.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
