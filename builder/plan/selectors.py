"""Selectors: cibuildwheel's ``build = "cp39-* cp311-*"`` on cell identifiers.

A selector is one or more shell-style patterns separated by spaces, each with optional brace
expansion (``cp3{11,12}-*`` is ``cp311-* cp312-*``; braces nest). A cell is selected when it
matches *any* pattern of *any* selector, as in cibuildwheel; ``--arch``, ``--python`` and
``--torch`` narrow that further (a cell must satisfy them all).

``parse`` turns what the user typed into :class:`Selector` objects; ``matches`` is the only
place a cell identifier is compared with them (``builder.plan.cells.select`` calls both).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Selector:
    """One selector as the user typed it, and the patterns it stands for."""

    text: str
    patterns: tuple[str, ...]

    def matches(self, identifier: str) -> bool:
        return any(fnmatch.fnmatchcase(identifier, p) for p in self.patterns)


def expand_braces(pattern: str) -> list[str]:
    """``a{b,c}d`` -> ``[abd, acd]``, left to right as bash does (``cp3{1{1,2},9}`` ->
    ``cp311 cp312 cp39``). A brace with no comma (``{x}``) or an unbalanced one is kept
    literally, as in bash."""
    group = _first_group(pattern)
    if group is None:
        return [pattern]
    open_at, close_at, alternatives = group
    head, tail = pattern[:open_at], pattern[close_at + 1 :]
    out: list[str] = []
    for alternative in alternatives:
        for expanded in expand_braces(head + alternative + tail):
            if expanded not in out:
                out.append(expanded)
    return out


def _first_group(pattern: str) -> tuple[int, int, list[str]] | None:
    """The leftmost balanced ``{...}`` with a comma at its own level: (open, close, parts)."""
    for open_at, ch in enumerate(pattern):
        if ch != "{":
            continue
        depth, cuts = 0, [open_at]
        for i in range(open_at, len(pattern)):
            if pattern[i] == "{":
                depth += 1
            elif pattern[i] == "}":
                depth -= 1
                if depth == 0:
                    if len(cuts) > 1:
                        cuts.append(i)
                        parts = [pattern[a + 1 : b] for a, b in zip(cuts, cuts[1:])]
                        return open_at, i, parts
                    break
            elif pattern[i] == "," and depth == 1:
                cuts.append(i)
    return None


def parse(texts: Iterable[str]) -> tuple[Selector, ...]:
    """Each space-separated word of each text is one selector (its braces expanded)."""
    selectors = []
    for text in texts:
        for word in text.split():
            selectors.append(Selector(word, tuple(expand_braces(word))))
    return tuple(selectors)


def matches(selectors: Iterable[Selector], identifier: str) -> bool:
    """Any selector matches (no selector: everything matches)."""
    selectors = tuple(selectors)
    return not selectors or any(s.matches(identifier) for s in selectors)
