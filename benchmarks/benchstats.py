"""Statistics shared by the benchmarks (optimizer_step.py, bench_ascend.py): each figure's
spread over rounds, the load other processes put on the machine while it was measured, and
whether the figure can be trusted.

A figure is the median over rounds (a ratio: the median of per-round ratios, so that a drift
of the machine between rounds hits both sides alike). Its spread is the interquartile range
over the median (IQR / median): robust to the odd slow round, which the median already
ignores, yet large when the rounds disagree as a whole. A figure is *unreliable* when

* its spread exceeds ``MAX_SPREAD`` (the rounds disagree: the machine changed state, or
  something ran beside it), or
* other processes took more than ``MAX_OTHERS`` of the machine's CPU time while it was
  measured (``LoadMonitor``: /proc/stat's busy time less this process's own), or, where
  /proc/stat is unavailable, the 1-minute load average at the start exceeded half the CPUs
  (the benchmark's own threads are not running yet then).

The benchmarks print an unreliable figure in parentheses, with the reason, and do not check
a target on it: it is reported as "unreliable", neither met nor missed.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Optional

# Thresholds: chosen from runs on the 2-CPU dev machine, where an undisturbed run's figures
# spread 1-6 % and a run beside a compile 15-60 %.
MAX_SPREAD = 0.10
MAX_OTHERS = 0.25


@dataclass(frozen=True)
class Spread:
    """A figure over rounds: the median, the quartiles, the extremes, the round count."""

    median: float
    q1: float
    q3: float
    lo: float
    hi: float
    n: int

    @property
    def rel(self) -> float:
        """The interquartile range over the median (0 for one round; inf for a zero median
        with a nonzero range)."""
        width = self.q3 - self.q1
        if width == 0:
            return 0.0
        return width / abs(self.median) if self.median else math.inf

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["rel"] = self.rel
        return out


def _quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, statistics' 'inclusive')."""
    pos = q * (len(sorted_xs) - 1)
    i = int(math.floor(pos))
    j = min(i + 1, len(sorted_xs) - 1)
    return sorted_xs[i] + (sorted_xs[j] - sorted_xs[i]) * (pos - i)


def spread(samples: Sequence[float]) -> Spread:
    """The spread of one figure's rounds."""
    if not samples:
        raise ValueError("spread of no samples")
    xs = sorted(samples)
    return Spread(
        statistics.median(xs), _quantile(xs, 0.25), _quantile(xs, 0.75), xs[0], xs[-1], len(xs)
    )


def ratio_spread(num: Sequence[float], den: Sequence[float]) -> Spread:
    """The spread of the per-round ratios num[i] / den[i] (rounds paired as measured)."""
    if len(num) != len(den):
        raise ValueError(f"unpaired rounds: {len(num)} against {len(den)}")
    return spread([a / b for a, b in zip(num, den)])


def _cpu_jiffies() -> Optional[tuple[float, float]]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [float(x) for x in fields[1:]]
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0.0)  # idle + iowait
    # guest time is counted in user already (fields 9, 10)
    total = sum(ticks[:8])
    return (total - idle) / hz, total / hz


class LoadMonitor:
    """The share of the machine's CPU time other processes used between start() and stop():
    (machine busy time - this process's CPU time) / (wall time x CPUs)."""

    def __init__(self) -> None:
        self.cpus = os.cpu_count() or 1
        self._t0 = self._p0 = 0.0
        self._j0: Optional[tuple[float, float]] = None
        self.others: Optional[float] = None
        self.loadavg_start: Optional[float] = None

    def start(self) -> LoadMonitor:
        self.loadavg_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        self._j0 = _cpu_jiffies()
        self._t0, self._p0 = time.perf_counter(), time.process_time()
        return self

    def stop(self) -> Optional[float]:
        wall = time.perf_counter() - self._t0
        own = time.process_time() - self._p0
        j1 = _cpu_jiffies()
        if self._j0 is None or j1 is None or wall <= 0:
            self.others = None
        else:
            busy = j1[0] - self._j0[0]
            # Clock ticks are coarse (10 ms): a short window may read slightly below 0 or,
            # on a busy machine, above the whole machine's time; either is rounding.
            self.others = min(1.0, max(0.0, busy - own) / (wall * self.cpus))
        return self.others

    def unreliable(self) -> Optional[str]:
        """Why the machine's load makes this window's figures untrustworthy, or None."""
        if self.others is not None:
            if self.others > MAX_OTHERS:
                return f"other processes used {self.others:.0%} of the CPUs"
            return None
        if self.loadavg_start is not None and self.loadavg_start > self.cpus / 2:
            return f"load average {self.loadavg_start:.2f} on {self.cpus} CPUs"
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "others_cpu_share": self.others,
            "loadavg_start": self.loadavg_start,
            "cpus": self.cpus,
        }


def verdict(s: Spread, load: Optional[str] = None, max_spread: float = MAX_SPREAD) -> Optional[str]:
    """Why figure `s` is unreliable (its spread, else the load's reason), or None."""
    if s.rel > max_spread:
        return f"spread {s.rel:.0%} over {s.n} rounds"
    return load


def fmt(value: float, rel: Optional[float], spec: str, reason: Optional[str]) -> str:
    """`value` formatted with `spec`, its spread `rel` appended (+-N%), in parentheses when
    `reason` says it is unreliable: '40.90 +-2%' or '(40.90 +-14%)'."""
    text = format(value, spec)
    if rel is not None:
        text += f" +-{min(rel, 9.99):.0%}"
    return f"({text})" if reason else text


def fmt_figure(fig: Optional[dict[str, Any]], spec: str, width: int = 0) -> str:
    """A figure() dict as fmt() writes it, right-aligned to `width`; '-' when absent."""
    if fig is None:
        return f"{'-':>{width}}"
    return f"{fmt(fig['value'], fig['rel'], spec, fig['unreliable']):>{width}}"


def figure(
    s: Spread, load: Optional[str], scale: float = 1.0, max_spread: float = MAX_SPREAD
) -> dict[str, Any]:
    """A figure for --json: its value (the median times `scale`), its spread, and the reason
    it is unreliable (null when it is not)."""
    out = s.to_json()
    out["value"] = s.median * scale
    out["unreliable"] = verdict(s, load, max_spread)
    return out


def check_target(name: str, figs: Sequence[dict[str, Any]], ok: bool, want: str, shown: str) -> str:
    """One target's line: met / MISSED when every figure() it reads is reliable, else
    UNRELIABLE with the first reason (the target is then not checked)."""
    why = next((f["unreliable"] for f in figs if f["unreliable"]), None)
    state = f"UNRELIABLE ({why}): not checked" if why else ("met" if ok else "MISSED")
    return f"  {name}: {shown} (target {want}): {state}"


def print_legend(unreliable: Sequence[str], samples: str) -> None:
    """The key to the tables' figures (*samples*: what a spread is over, e.g. "rounds"), then
    each unreliable figure with its reason."""
    print(
        f"\n(figure +-N%): the interquartile range of its {samples} over the median; in "
        f"parentheses: unreliable (spread > {MAX_SPREAD:.0%}, or other processes used "
        f"> {MAX_OTHERS:.0%} of the CPUs: 'others'), not a result"
    )
    if unreliable:
        print("unreliable figures:")
        print("\n".join(unreliable))


def write_json(doc: Any, dest: str) -> None:
    """``--json DEST``: *doc* as indented JSON to the file *dest*, or to stdout for '-'."""
    text = json.dumps(doc, indent=2)
    if dest == "-":
        print(text)
    else:
        with open(dest, "w", encoding="utf-8") as f:
            f.write(text + "\n")
