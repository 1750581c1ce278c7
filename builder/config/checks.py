"""Checks of a configuration document: structure (JSON schema) and values, with messages that
name the file, the line, the key and what was expected (exit 2)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, cast

import jsonschema

from builder.arch import ARCHES
from builder.config import values
from builder.config.model import DEFAULTS_FILE, display_path
from builder.config.schema import CONFIG_SCHEMA, JOBS_MAX
from builder.config.yamlfile import (
    PathKey,
    YamlDocument,
    brief,
    format_path,
    load_yaml,
    parse_yaml,
)
from builder.errors import ConfigError

# ------------------------------------------------------------------ schema errors

_TYPE_WORDS = {
    "string": "a string",
    "array": "a list",
    "object": "a mapping",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


def _schema_message(err: jsonschema.ValidationError) -> tuple[PathKey, str]:
    """Translate one jsonschema error into (path of the offending key, message)."""
    path: PathKey = tuple(err.absolute_path)
    v = err.validator
    # A validator's error always has its instance, its (sub)schema and the keyword's value; the
    # stubs allow them unset (and the schema a bool) for an error made by hand.
    inst: Any = err.instance
    schema = cast("Mapping[str, Any]", err.schema)
    expected: Any = err.validator_value
    if v == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(str(k) for k in inst if k not in schema.get("properties", {}))
        key = extra[0]
        return path + (key,), f"unknown key {brief(key)}; expected one of: {', '.join(allowed)}"
    if v == "required":
        missing = [k for k in expected if k not in inst]
        need = ", ".join(expected)
        return path, f"missing required key {missing[0]!r}; expected all of: {need}"
    if v == "type":
        want = expected
        want_list: list[str] = want if isinstance(want, list) else [want]
        words = " or ".join(_TYPE_WORDS.get(w, w) for w in want_list)
        msg = f"expected {words}, got {_kind(inst)} {brief(inst)}"
        if "string" in want_list and isinstance(inst, (int, float)) and not isinstance(inst, bool):
            msg += " (quote versions: YAML reads 3.10 as the number 3.1)"
        return path, msg
    if v == "enum":
        choices = ", ".join(str(c) for c in expected)
        return path, f"expected one of {choices}, got {brief(inst)}"
    if v == "uniqueItems":
        return path, "has duplicate items; expected each value once"
    if v == "minProperties":
        return path, "an empty rule; expected at least one of arch, python, torch"
    if v == "anyOf":
        last = path[-1] if path else ""
        if last == "jobs":
            msg = f"{_JOBS_EXPECTED}, got {_kind(inst)} {brief(inst)}"
            if isinstance(inst, int) and not isinstance(inst, bool) and inst > JOBS_MAX:
                msg += f", more than the {JOBS_MAX} compile jobs a cell takes"
            return path, msg
        if isinstance(inst, dict) and last in _STRING_OR_TABLE:
            return path, (
                f"expected a string, null or a mapping of names to values, got "
                f"{_kind(inst)} {brief(inst)}"
            )
        return path, (
            f"expected a string or a non-empty list of strings, got {_kind(inst)} {brief(inst)}"
        )
    if v == "minimum":
        return path, f"expected at least {err.validator_value}, got {brief(inst)}"
    if v == "maximum":
        return path, f"expected at most {err.validator_value}, got {brief(inst)}"
    if v == "exclusiveMinimum":
        return path, f"expected more than {err.validator_value}, got {brief(inst)}"
    return path, f"{err.message}; expected what builder/config/schema.py allows"


def _check_schema(doc: YamlDocument, require_matrix: bool) -> None:
    data = doc.data
    if data is None:
        raise ConfigError(
            "the file is empty; expected a mapping with at least 'matrix'", file=doc.file
        )
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping at the top level, got {_kind(data)}",
            file=doc.file,
            line=doc.line(()),
        )
    schema = CONFIG_SCHEMA if require_matrix else {**CONFIG_SCHEMA, "required": []}
    errors = []
    for err in jsonschema.Draft202012Validator(schema).iter_errors(data):
        path, msg = _schema_message(err)
        errors.append((doc.line(path) or 0, format_path(path), msg))
    if errors:
        errors.sort()
        line, key, msg = errors[0]
        more = ""
        if len(errors) > 1:
            rest = "; ".join(f"line {ln}: {k}: {m}" for ln, k, m in errors[1:4])
            more = f" (and {len(errors) - 1} more: {rest})"
        raise ConfigError(msg + more, file=doc.file, line=line or None, key=key or None)


# ------------------------------------------------------------------ value checks

_JOBS_EXPECTED = "expected a positive integer or null"
#: Keys whose value may also be a mapping (the anyOf message says so).
_STRING_OR_TABLE = ("environment", "config-settings")
#: Keys naming a file or folder (a NUL byte cannot be in a path).
_PATH_KEYS = (("support",), ("ca_bundle",), ("offline", "wheelhouse"), ("offline", "bundle"))


def _strict_arch(value: str) -> str:
    if value not in ARCHES:
        raise ValueError(f"unknown arch {brief(value)}; expected one of {', '.join(ARCHES)}")
    return value


_AXIS_PARSERS: dict[str, Callable[[str], str]] = {
    "arch": _strict_arch,
    "python": values.python_version,
    "torch": values.torch_version,
    "cuda": values.cuda_version,
}
_AXIS_WORDS = {
    "arch": "arch",
    "python": "Python version",
    "torch": "torch version",
    "cuda": "CUDA version or cpu",
}
#: Matrix axes a config file may leave out, and what they then are.
_OPTIONAL_AXES = {"cuda": ["cpu"]}


def _check_values(doc: YamlDocument) -> None:
    """Value-level checks of a schema-valid document (file or defaults)."""
    data: dict[str, Any] = doc.data

    def check(path: PathKey, parse: Callable[[str], Any], value: str) -> None:
        try:
            parse(value)
        except ValueError as exc:
            raise ConfigError(
                str(exc), file=doc.file, line=doc.line(path), key=format_path(path)
            ) from None

    matrix = data.get("matrix")
    if matrix is not None:
        for axis, parse in _AXIS_PARSERS.items():
            items = matrix.get(axis, _OPTIONAL_AXES.get(axis))
            if not items:
                p = ("matrix", axis)
                raise ConfigError(
                    f"empty list; expected at least one {_AXIS_WORDS[axis]} "
                    "(an empty axis means an empty matrix)",
                    file=doc.file,
                    line=doc.line(p),
                    key=format_path(p),
                )
            for i, item in enumerate(items):
                check(("matrix", axis, i), parse, item)
        for kind in ("include", "exclude"):
            for i, rule in enumerate(matrix.get(kind, [])):
                for axis, value in rule.items():
                    if axis not in _AXIS_PARSERS:
                        continue  # cuda_arch_list: checked against the cell's toolkit on load
                    items = [value] if isinstance(value, str) else value
                    for item in items:
                        check(("matrix", kind, i, axis), _AXIS_PARSERS[axis], item)
    for name, image in (data.get("images") or {}).items():
        machine = ARCHES[name].machine
        if "base" in image:
            check(("images", name, "base"), values.image_pin, image["base"])
        if "plat" in image:
            check(
                ("images", name, "plat"),
                functools.partial(values.plat, machine=machine),
                image["plat"],
            )
        if "python_path" in image:
            check(("images", name, "python_path"), values.python_path, image["python_path"])
    build = data.get("build") or {}
    jobs = build.get("jobs")
    if isinstance(jobs, float):  # the schema's integer takes 2.0 (and 1e300); MAX_JOBS would not
        raise ConfigError(
            f"{_JOBS_EXPECTED}, got number {brief(jobs)}",
            file=doc.file,
            line=doc.line(("build", "jobs")),
            key="build.jobs",
        )
    timeout = (data.get("pip") or {}).get("timeout")
    if isinstance(timeout, float) and math.isnan(timeout):  # NaN passes every comparison
        raise ConfigError(
            "expected a timeout in seconds above 0 and at most 3600, got .nan",
            file=doc.file,
            line=doc.line(("pip", "timeout")),
            key="pip.timeout",
        )
    for path in _PATH_KEYS:
        node: Any = data
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str):
            check(path, values.file_path, node)
    for i, flag in enumerate(build.get("extra_cflags", [])):
        check(("build", "extra_cflags", i), values.cflag, flag)
    for i, lib in enumerate(build.get("auditwheel_exclude", [])):
        check(("build", "auditwheel_exclude", i), values.lib_pattern, lib)
    pip = data.get("pip") or {}
    if pip.get("index_url") is not None:
        check(("pip", "index_url"), values.index_url, pip["index_url"])
    for i, url in enumerate(pip.get("extra_index_urls", [])):
        check(("pip", "extra_index_urls", i), values.index_url, url)
    repository_url = (data.get("publish") or {}).get("repository_url")
    if repository_url is not None:
        # Same rules as an index URL: plain http(s), no user:password in a config file.
        check(("publish", "repository_url"), values.index_url, repository_url)
    for key, value in (data.get("proxy") or {}).items():
        if value is not None:
            parse = values.no_proxy if key == "no_proxy" else values.proxy_url
            check(("proxy", key), parse, value)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists included) is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _as_tuple(value: str | list[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


def load_config_file(path: Path) -> tuple[YamlDocument, YamlDocument]:
    """Parse and check the defaults and the config file; returns both documents."""
    defaults = load_yaml(DEFAULTS_FILE, display_path(DEFAULTS_FILE))
    _check_schema(defaults, require_matrix=False)
    _check_values(defaults)
    doc = load_yaml(path, display_path(path))
    _check_schema(doc, require_matrix=True)
    _check_values(doc)
    return defaults, doc


def parse_config_text(
    text: str, name: str = "<config>", *, require_matrix: bool = True
) -> YamlDocument:
    """Parse and check a configuration given as text (used by tests and tools; the built-in
    defaults have no matrix)."""
    doc = parse_yaml(text, name)
    _check_schema(doc, require_matrix=require_matrix)
    _check_values(doc)
    return doc
