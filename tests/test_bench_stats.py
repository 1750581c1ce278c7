"""benchmarks/benchstats.py (the spread and reliability of benchmark figures) and the
benchmarks' --json output built on it. Nothing here times anything against a bound: the
statistics are fed known samples, and the benchmark runs are checked for their structure."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import benchstats as stats  # noqa: E402


def test_spread_of_known_samples() -> None:
    s = stats.spread([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median, s.q1, s.q3, s.lo, s.hi, s.n) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    assert s.rel == pytest.approx(2.0 / 3.0)


def test_spread_interpolates_quartiles_like_numpy() -> None:
    s = stats.spread([1.0, 2.0, 3.0, 4.0])
    assert (s.q1, s.median, s.q3) == (1.75, 2.5, 3.25)


def test_one_round_and_constant_rounds_have_no_spread() -> None:
    assert stats.spread([7.0]).rel == 0.0
    assert stats.spread([2.0] * 9).rel == 0.0
    assert stats.spread([-1.0, 0.0, 0.0, 1.0]).rel == math.inf  # a zero median, a range


def test_no_samples_is_an_error() -> None:
    with pytest.raises(ValueError, match="no samples"):
        stats.spread([])


def test_ratio_spread_pairs_rounds() -> None:
    # round by round the ratio is 2 although each side drifts by 4x
    s = stats.ratio_spread([2.0, 8.0, 4.0], [1.0, 4.0, 2.0])
    assert s.median == 2.0 and s.rel == 0.0
    with pytest.raises(ValueError, match="unpaired rounds: 2 against 1"):
        stats.ratio_spread([1.0, 2.0], [1.0])


def test_verdict_spread_then_load() -> None:
    tight = stats.spread([1.0, 1.01, 0.99, 1.0])
    wide = stats.spread([1.0, 1.5, 0.6, 1.2])
    assert stats.verdict(tight) is None
    assert stats.verdict(tight, "busy") == "busy"
    why = stats.verdict(wide, "busy")
    assert why is not None and why.startswith("spread ") and "over 4 rounds" in why


def test_load_monitor_measures_a_share() -> None:
    mon = stats.LoadMonitor().start()
    sum(i * i for i in range(200_000))  # some CPU time of our own, not counted as others'
    share = mon.stop()
    if Path("/proc/stat").exists():
        assert share is not None and 0.0 <= share <= 1.0
    json.dumps(mon.to_json())


def test_load_monitor_flags_other_processes() -> None:
    mon = stats.LoadMonitor()
    mon.others = stats.MAX_OTHERS + 0.1
    assert "other processes used" in (mon.unreliable() or "")
    mon.others = stats.MAX_OTHERS / 2
    assert mon.unreliable() is None
    mon.others, mon.loadavg_start = None, float(mon.cpus)  # no /proc/stat: the load average
    assert "load average" in (mon.unreliable() or "")


def test_fmt_marks_unreliable_figures() -> None:
    assert stats.fmt(40.9, 0.02, ".2f", None) == "40.90 +-2%"
    assert stats.fmt(40.9, 0.14, ".2f", "spread") == "(40.90 +-14%)"
    fig = stats.figure(stats.spread([0.010, 0.011, 0.012]), None, 1e3)
    assert fig["value"] == pytest.approx(11.0) and fig["unreliable"] is None
    assert stats.fmt_figure(fig, ".1f", 12) == f"{'11.0 +-9%':>12}"
    assert stats.fmt_figure(None, ".1f", 3) == "  -"
    json.dumps(fig)


def test_check_target_is_not_checked_on_unreliable_figures() -> None:
    good = stats.figure(stats.spread([2.0, 2.0, 2.0]), None)
    bad = stats.figure(stats.spread([1.0, 2.0, 3.0]), None)
    assert stats.check_target("x", [good], True, ">= 1x", "2x").endswith(": met")
    assert stats.check_target("x", [good], False, ">= 3x", "2x").endswith(": MISSED")
    line = stats.check_target("x", [good, bad], False, ">= 3x", "2x")
    assert "UNRELIABLE (spread 50% over 3 rounds): not checked" in line
    assert "MISSED" not in line


def _run(script: str, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args, "--json", "-"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=600,
    ).stdout
    return json.loads(out[out.index("\n{") + 1 :])


def test_optimizer_step_json_has_spreads() -> None:
    doc = _run(
        "optimizer_step.py", "--sizes", "2e4", "--rounds", "3", "--cases", "a", "--others", ""
    )
    (res,) = doc["results"]
    for key in ("torch_ms", "exact_ms", "defer_ms", "probe_ms", "defer_speedup", "exact_pct_probe"):
        fig = res["figures"][key]
        assert fig["n"] == 3 and fig["lo"] <= fig["median"] <= fig["hi"]
        assert "unreliable" in fig
    assert res["figures"]["defer_ms"]["value"] == pytest.approx(res["defer_ms"])
    assert "others_cpu_share" in res["load"]


def test_bench_ascend_speedup_is_the_median_of_per_round_ratios_to_torchs_best() -> None:
    import bench_ascend  # noqa: PLC0415  (imports torch and amp: only this test needs them)

    totals = {
        "torch SGD (foreach)": [2.0, 4.0, 6.0],
        "torch SGD + combine_grad": [3.0, 3.0, 3.0],
        "amp FusedSGD": [1.0, 1.0, 2.0],
        "torch Adam (foreach)": [1.0, 1.0, 1.0],  # another optimizer: not SGD's baseline
    }
    out = bench_ascend.speedups(totals, None)
    assert set(out) == {"amp FusedSGD"}  # torch's rows are the baseline, not results
    fig = out["amp FusedSGD"]
    # per round: the fastest torch SGD row (2, 3, 3) over amp's (1, 1, 2) = 2, 3, 1.5
    assert (fig["value"], fig["lo"], fig["hi"], fig["n"]) == (2.0, 1.5, 3.0, 3)
    assert fig["unreliable"] == "spread 38% over 3 rounds"
    assert bench_ascend.speedups({"amp FusedAdam": [1.0]}, None) == {}  # no baseline: none


def test_bench_ascend_json_has_counts_and_spreads() -> None:
    doc = _run("bench_ascend.py", "--counts", "2", "--size", "16", "--repeat", "3", "--no-big")
    counts = {row["optimizer"]: row for row in doc["counts"]}
    # deterministic counts (tests/npu asserts the budgets; here only that they are reported)
    assert counts["NpuFusedAdam (combined)"]["syncs"] == 1
    assert counts["NpuFusedAdam (combined)"]["total"] == sum(
        counts["NpuFusedAdam (combined)"][p] for p in ("unscale+check", "step", "zero_grad")
    )
    times = {row["optimizer"]: row for row in doc["times"]}
    assert set(times) == set(counts)
    for row in times.values():
        assert row["total"]["n"] == 3 and row["total"]["value"] > 0
        assert row["total"]["unreliable"] is None or isinstance(row["total"]["unreliable"], str)
    # every amp and NpuFused row against torch's best of its optimizer, over the same rounds
    speedups = {row["optimizer"]: row for row in doc["speedups"]}
    assert set(speedups) == {label for label in counts if not label.startswith("torch")}
    for row in speedups.values():
        assert row["n"] == 3 and row["lo"] <= row["median"] <= row["hi"] and row["value"] > 0
    assert doc["targets"] == []  # the target is checked at 1000 parameters only
