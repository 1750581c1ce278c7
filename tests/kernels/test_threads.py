"""amp._C's ops called from several Python threads at once.

The stable binding holds the GIL for the length of an op and lets it go only while the op's
parallel loop runs (kernels/bindings_stable.cpp: a tensor whose C++ references drop to one
takes the GIL, so the op drops its arguments with the GIL held). These tests prove that this
neither deadlocks nor mixes results: small calls (serial, GIL held throughout), large ones
(parallel loop, GIL let go and taken back), errors raised from inside an op (the GIL given
back on the way out) and a pure-Python thread beside them, each thread checked against the
single-threaded result. They run on either binding.
"""

from __future__ import annotations

import threading

import amp._C
import pytest
import torch

#: Elements per tensor: below and above the size at which a call runs its parallel loop.
SMALL, LARGE = 1_000, 300_000
ROUNDS = 40


def _inputs(numel: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=gen) for _ in range(4)]


def _scaled(xs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float, bool]:
    outs = [torch.empty_like(x) for x in xs]
    norm, bad = amp._C.scale_l2norm(xs, outs, 0.5)
    return outs, norm, bad


def test_ops_from_many_threads_give_the_single_threaded_results() -> None:
    cases = [_inputs(SMALL if i % 2 else LARGE, seed=i) for i in range(4)]
    expected = [_scaled(xs) for xs in cases]
    failures: list[str] = []
    spins = [0]
    done = threading.Event()

    def worker(i: int) -> None:
        xs = cases[i]
        try:
            for r in range(ROUNDS):
                outs, norm, bad = _scaled(xs)
                want_outs, want_norm, want_bad = expected[i]
                if norm != want_norm or bad != want_bad:
                    got, want = (norm, bad), (want_norm, want_bad)
                    failures.append(f"thread {i} round {r}: {got} != {want}")
                if not all(torch.equal(a, b) for a, b in zip(outs, want_outs)):
                    failures.append(f"thread {i} round {r}: outputs differ")
                with pytest.raises((ValueError, TypeError)):
                    amp._C.scale_l2norm(xs, xs[:1], 0.5)  # lists of different lengths
        except Exception as exc:  # noqa: BLE001 -- reported by the main thread below
            failures.append(f"thread {i}: {exc!r}")

    def spinner() -> None:  # pure Python: needs the GIL to make any progress
        while not done.is_set():
            spins[0] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(cases))]
    spin = threading.Thread(target=spinner)
    spin.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    done.set()
    spin.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "an op never returned: a GIL deadlock"
    assert not failures, failures[:5]
    assert spins[0] > 0


def test_the_main_thread_gets_the_same_result_after_other_threads_called_ops() -> None:
    """A call from the main thread before and after another thread's op returns the same
    result: an op leaves no GIL state behind in either thread."""
    xs = _inputs(LARGE, seed=7)
    first = _scaled(xs)
    t = threading.Thread(target=lambda: _scaled(_inputs(SMALL, seed=8)))
    t.start()
    t.join(timeout=60)
    again = _scaled(xs)
    assert first[1:] == again[1:]
    assert all(torch.equal(a, b) for a, b in zip(first[0], again[0]))
