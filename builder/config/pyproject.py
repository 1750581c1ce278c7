"""A project's ``pyproject.toml``, read for every table the builder takes from it:
``[tool.cibuildwheel]`` (builder.config.projecttest, buildoptions), ``[tool.ampforge]`` and
``[project]`` (builder.plan.project), ``[build-system]`` (builder.offline.preflight).

Any file is either a mapping or a ConfigError (exit 2) naming it, and the line where it can be
known: not UTF-8, not TOML, nested deeper than :data:`MAX_NESTING` (tomllib recurses, and would
stop with a RecursionError), an integer past Python's 4300-digit limit (tomllib's ValueError),
a folder where the file should be. :func:`table` and :func:`string_list` then name the key of a
value of the wrong type (``tool = 1`` is not a table that could hold ``cibuildwheel``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from builder.config.yamlfile import MAX_NESTING, brief, clip, path_problem
from builder.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the builder runs on 3.11 here; tomli is what 3.9/3.10 have
    import tomli as tomllib

_EXPECTED = "expected a UTF-8 TOML file (pyproject.toml)"
_TOML_LINE = re.compile(r"\(at line (\d+), column \d+\)")
_LONG_INT = re.compile(r"[0-9][0-9_]{4300,}")


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def _too_deep(text: str) -> Optional[int]:
    """The line where arrays and inline tables nest more than MAX_NESTING deep (strings and
    comments skipped), None when they never do."""
    depth, line, i, n = 0, 1, 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c in "\"'":
            quote = c * 3 if text.startswith(c * 3, i) else c
            j = i + len(quote)
            while j < n and not text.startswith(quote, j):
                if text[j] == "\\" and c == '"':
                    j += 1
                elif text[j] == "\n" and len(quote) == 1:
                    break  # an unclosed string: tomllib says so
                j += 1
            line += text.count("\n", i, j)
            i = j + len(quote)
            continue
        elif c in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return line
        elif c in "]}":
            depth = max(depth - 1, 0)
        i += 1
    return None


def load_pyproject(path: Path, shown: str) -> Optional[dict[str, Any]]:
    """The parsed *path* (*shown*: its name in messages), None when there is none."""
    problem = path_problem(path, "")
    if problem == "":
        return None  # no pyproject.toml: nothing declared
    if problem is not None:
        raise ConfigError(f"{problem}; {_EXPECTED}", file=shown)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read it ({exc.strerror or exc}); {_EXPECTED}", file=shown
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"byte {raw[exc.start]:#04x} is not UTF-8 ({exc.reason}); {_EXPECTED}",
            file=shown,
            line=raw.count(b"\n", 0, exc.start) + 1,
        ) from None
    deep = _too_deep(text)
    if deep is not None:
        raise ConfigError(
            f"arrays and inline tables nested more than {MAX_NESTING} levels "
            f"deep; {_EXPECTED} of a project's few levels",
            file=shown,
            line=deep,
        )
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = _TOML_LINE.search(str(exc))
        # "(at line 3, column 17)", or "(at end of document)": the last line
        line: Optional[int] = int(found.group(1)) if found else len(text.splitlines()) or 1
        raise ConfigError(
            f"invalid TOML: {clip(exc, 300)}; {_EXPECTED}", file=shown, line=line
        ) from None
    except ValueError:  # tomllib reads integers with int(): at most 4300 digits
        long = _LONG_INT.search(text)
        line = text.count("\n", 0, long.start()) + 1 if long else None
        raise ConfigError(
            "an integer of more than 4300 digits, more than Python reads; "
            "expected a number of at most 4300 digits (or a quoted string)",
            file=shown,
            line=line,
        ) from None
    except RecursionError:  # pragma: no cover - _too_deep() refuses such nesting first
        raise ConfigError(f"nested too deeply; {_EXPECTED}", file=shown) from None


def table(data: Mapping[str, Any], dotted: str, shown: str) -> dict[str, Any]:
    """The table at *dotted* (``"tool.cibuildwheel"``), ``{}`` when it is absent; a value that
    is not a table on the way is a ConfigError naming its key."""
    node: Any = data
    walked: list[str] = []
    for part in dotted.split("."):
        walked.append(part)
        node = node.get(part, {})
        if not isinstance(node, dict):
            key = ".".join(walked)
            raise ConfigError(
                f"is {_kind(node)} ({brief(node)}); expected a table [{key}]", file=shown, key=key
            )
    return node


def string_list(data: Mapping[str, Any], dotted: str, shown: str) -> list[str]:
    """The array of strings at *dotted* (``"project.dependencies"``), ``[]`` when absent."""
    head, _, last = dotted.rpartition(".")
    value = (table(data, head, shown) if head else data).get(last, [])
    if not isinstance(value, list):
        raise ConfigError(
            f"is {_kind(value)} ({brief(value)}); expected an array of "
            'requirement strings such as ["torch>=2.8"]',
            file=shown,
            key=dotted,
        )
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ConfigError(
                f"is {_kind(item)} ({brief(item)}); expected a requirement "
                'string such as "torch>=2.8"',
                file=shown,
                key=f"{dotted}[{i}]",
            )
    return value
