"""`make demo` (examples/amp_demo.py), run as a user runs it: a few steps on the CPU, then the
tables it prints and the PNG it writes are read back and checked against each other and
against what mixed precision must do (half the weight bytes under O2, fewer activation bytes
under O1/O2 when activations dominate)."""

from __future__ import annotations

import math
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "amp_demo.py"
STEPS = 4
RUNS = ["fp32", "O1 bf16", "O2 bf16"]
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    png = tmp_path_factory.mktemp("demo") / "out" / "amp_demo.png"
    # A narrow MLP on a wide batch: activations dominate its memory (as in real training),
    # and the run stays a few seconds on a 2-core CI machine.
    r = subprocess.run(
        [
            sys.executable,
            str(DEMO),
            "--steps",
            str(STEPS),
            "--device",
            "cpu",
            "--batch",
            "1024",
            "--width",
            "64",
            "--depth",
            "3",
            "--out",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout, png


def _loss_tables(out: str) -> dict[str, list[list[float]]]:
    tables: dict[str, list[list[float]]] = {}
    lines = out.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(\w+): .* -- loss per step$", line)
        if m:
            assert lines[i + 1].split()[0] == "step"
            rows = [ln.split() for ln in lines[i + 2 : i + 2 + STEPS]]
            assert [int(r[0]) for r in rows] == list(range(1, STEPS + 1))
            tables[m.group(1)] = [[float(v) for v in r[1:]] for r in rows]
    return tables


def _bytes(text: str) -> float:
    value, unit = text.split()
    return float(value) * UNITS[unit]


def _run_table(out: str) -> dict[tuple[str, str], dict[str, str]]:
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("model ") and "peak" in ln)
    header = re.split(r"\s{2,}", lines[start].strip())
    assert header == ["model", "run", "weights", "weights size", "peak", "step ms", "final loss"]
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = dict(zip(header, re.split(r"\s{2,}", line.strip())))
        rows[(cells["model"], cells["run"])] = cells
    return rows


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    chunks, i = [], 8
    while i < len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        chunks.append((data[i + 4 : i + 8], data[i + 8 : i + 8 + n]))
        i += 12 + n
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    return chunks


def test_loss_tables_have_every_step_of_every_run(demo: tuple[str, Path]) -> None:
    out, _ = demo
    assert out.startswith("device: cpu ")
    assert "runs: fp32, O1 bf16, O2 bf16" in out
    tables = _loss_tables(out)
    assert sorted(tables) == ["mlp", "quickstart"]
    for model, rows in tables.items():
        assert all(len(r) == len(RUNS) and all(math.isfinite(v) for v in r) for r in rows)
        # Same seed, same data: every run starts from the same loss, and training lowers it.
        first = rows[0]
        assert max(first) - min(first) < 0.01 * abs(first[0]) + 1e-3, (model, first)
        for run in range(len(RUNS)):
            assert rows[-1][run] < rows[0][run], (model, RUNS[run])


def test_run_table_numbers_are_what_mixed_precision_must_give(demo: tuple[str, Path]) -> None:
    out, _ = demo
    rows = _run_table(out)
    assert sorted(rows) == sorted((m, r) for m in ("quickstart", "mlp") for r in RUNS)
    tables = _loss_tables(out)
    for (model, run), row in rows.items():
        assert float(row["step ms"]) > 0
        assert float(row["final loss"]) == pytest.approx(
            tables[model][-1][RUNS.index(run)], abs=1e-5
        )
        assert row["weights"] == ("bf16" if run == "O2 bf16" else "fp32")
    for model in ("quickstart", "mlp"):
        fp32 = _bytes(rows[(model, "fp32")]["weights size"])
        # O2: the model's weights are bf16 (the fp32 masters live in the optimizer).
        assert _bytes(rows[(model, "O2 bf16")]["weights size"]) == pytest.approx(fp32 / 2, rel=0.01)
        assert _bytes(rows[(model, "O1 bf16")]["weights size"]) == fp32
    quickstart_weights = _bytes(rows[("quickstart", "fp32")]["weights size"])
    assert quickstart_weights == 11 * 4  # nn.Linear(10, 1): 10 weights + 1 bias, fp32
    # The MLP's activations dominate its memory here: bf16 activations lower the peak under
    # O1 and O2, even though O2 keeps fp32 masters besides the bf16 weights.
    peak = {run: _bytes(rows[("mlp", run)]["peak"]) for run in RUNS}
    assert peak["O2 bf16"] < peak["fp32"] and peak["O1 bf16"] < peak["fp32"], peak
    assert all(p > 0 for p in peak.values())


def test_png_is_a_picture_of_those_numbers(demo: tuple[str, Path]) -> None:
    out, png = demo
    assert out.rstrip().endswith(f"wrote {png}")
    data = png.read_bytes()
    assert len(data) > 10_000
    chunks = _png_chunks(data)
    width, height = struct.unpack(">II", chunks[0][1][:8])
    assert (width, height) == (960, 544)  # 12 x 6.8 inches at 80 dpi: two rows of panels
    text = dict(c[1].split(b"\0", 1) for c in chunks if c[0] == b"tEXt")
    description = text[b"Description"].decode()
    rows = _run_table(out)
    for (model, run), row in rows.items():
        m = re.search(rf"{model} {run}: peak (\d+) B", description)
        assert m, (model, run, description)
        assert int(m.group(1)) == pytest.approx(_bytes(row["peak"]), rel=0.01)
    assert not list(png.parent.glob("*.part"))  # written whole, then moved into place
    # It decodes, and it is not blank: the curves and bars put many colours on it.
    import matplotlib.image  # noqa: PLC0415 - the demo extra

    pixels = matplotlib.image.imread(png)
    assert pixels.shape[:2] == (height, width)
    assert len({tuple(p) for p in pixels.reshape(-1, pixels.shape[2])[::97]}) > 20


def test_bad_arguments_exit_2() -> None:
    r = subprocess.run(
        [sys.executable, str(DEMO), "--steps", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert r.returncode == 2 and "--steps 0: expected 1 or more" in r.stderr
