"""PEP 735 dependency groups: ``[dependency-groups]`` of a project's ``pyproject.toml``.

cibuildwheel's ``test-groups`` names groups whose requirements are installed for the tests;
the builder resolves them here, on the host, into plain requirements (so every backend, the
containers' and the cross path's, installs them the same way as ``test-requires``). A group
is a list of requirement strings and ``{include-group = "NAME"}`` tables; names compare
normalized (PEP 503: ``Test_Deps`` is ``test-deps``); a cycle or an unknown name is an error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from builder.config.yamlfile import brief

KEY = "dependency-groups"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve_groups(doc: Mapping[str, Any], names: Sequence[str]) -> tuple[str, ...]:
    """The requirements of the groups *names* (includes expanded, in order, each once);
    raises ValueError naming the group and what was expected."""
    table = doc.get(KEY, {})
    if not isinstance(table, dict):
        raise ValueError(f"[{KEY}] is {brief(table)}; expected a table of group = [requirements]")
    groups = {normalize(k): (k, v) for k, v in table.items()}
    out: list[str] = []
    for name in names:
        for req in _expand(groups, name, ()):
            if req not in out:
                out.append(req)
    return tuple(out)


def _expand(groups: Mapping[str, tuple[str, Any]], name: str, seen: tuple[str, ...]) -> list[str]:
    key = normalize(name)
    if key in seen:
        raise ValueError(
            f"dependency group {name!r} includes itself ({' -> '.join(seen)} -> "
            f"{key}); expected groups without a cycle"
        )
    if key not in groups:
        have = ", ".join(sorted(k for k, _ in groups.values())) or "none"
        raise ValueError(
            f"no dependency group {name!r} in [{KEY}] (it has: {have}); expected "
            "a group the project's pyproject.toml declares"
        )
    written, items = groups[key]
    if not isinstance(items, list):
        raise ValueError(
            f"[{KEY}] {written} is {brief(items)}; expected a list of "
            'requirements and {include-group = "NAME"} tables'
        )
    out: list[str] = []
    for item in items:
        if isinstance(item, dict) and set(item) == {"include-group"}:
            out += _expand(groups, str(item["include-group"]), (*seen, key))
            continue
        if not isinstance(item, str):
            raise ValueError(
                f"[{KEY}] {written}: {brief(item)} is not a requirement; expected "
                "a string such as 'pytest>=8' or {include-group = \"NAME\"}"
            )
        try:
            Requirement(item)
        except InvalidRequirement as exc:
            raise ValueError(
                f"[{KEY}] {written}: {brief(item)} is not a requirement ({exc})"
                "; expected e.g. 'pytest>=8'"
            ) from None
        out.append(item.strip())
    return out
