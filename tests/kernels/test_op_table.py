"""Each of amp._C's functions is declared once, in kernels/op_table.h: both bindings expose its
schema (``amp._C._schemas``), and the function built here -- pybind11's, or the one
amp.kernels.stable_binding made from the registered schema -- takes exactly the schema's
arguments, by name and with its defaults. Runs on whichever binding was built (the stable one on
torch >= 2.10; the pybind11 one in the older-torch lanes, `make test-torch`)."""

from __future__ import annotations

import inspect
import re
from typing import Any

import amp._C
import pytest
import torch

SCHEMA = re.compile(r"^(?P<name>\w+)\((?P<args>[^)]*)\) -> .+$")


def _value(kind: str, text: str) -> Any:
    return {"int": int, "float": float, "bool": lambda t: {"True": True, "False": False}[t]}[kind](
        text
    )


def schema_params(schema: str) -> tuple[str, list[tuple[str, Any]]]:
    """(name, [(argument, default or inspect.Parameter.empty)]) of an op_table.h schema."""
    m = SCHEMA.match(schema)
    assert m, f"not a schema of op_table.h's form: {schema!r}"
    params = []
    for item in filter(None, (a.strip() for a in m.group("args").split(","))):
        kind, _, rest = item.partition(" ")
        name, eq, default = rest.partition("=")
        params.append((name, _value(kind, default) if eq else inspect.Parameter.empty))
    return m.group("name"), params


def _split_top_level(text: str) -> list[str]:
    """Comma-separated items of a pybind11 signature, commas inside brackets kept."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [i.strip() for i in items if i.strip()]


def function_params(fn: Any) -> list[tuple[str, Any]]:
    """The parameters of amp._C's *fn*: from inspect (the stable module's Python functions) or
    from the signature line pybind11 writes first in the docstring."""
    try:
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]
    except ValueError:  # a builtin: pybind11's "name(a: T, b: T = 1) -> R"
        line = fn.__doc__.splitlines()[0]
        inner = line[line.index("(") + 1 : line.rindex(") ->")]
        out = []
        for item in _split_top_level(inner):
            name, _, rest = item.partition(":")
            _, eq, default = rest.rpartition(" = ")
            # The default is its repr (-1, 1.0, False).
            out.append((name.strip(), eval(default) if eq else inspect.Parameter.empty))
        return out


TABLE = dict(sorted(amp._C._schemas.items()))


def test_the_table_holds_every_function_of_the_module_once() -> None:
    assert set(TABLE) == {
        "isa",
        "set_isa",
        "supported_isas",
        "_parallel_threads_seen",
        "_cache_bytes",
        "scale",
        "axpby",
        "l2norm",
        "adam",
        "sgd",
        "lamb",
        "scale_l2norm",
        "adagrad",
        "novograd",
        "_limit_probe",
    }
    for name, schema in TABLE.items():
        assert schema_params(schema)[0] == name, schema
        assert callable(getattr(amp._C, name)) and getattr(amp._C, name).__doc__


@pytest.mark.parametrize("name", list(TABLE))
def test_the_function_takes_its_schemas_arguments_and_defaults(name: str) -> None:
    _, params = schema_params(TABLE[name])
    assert function_params(getattr(amp._C, name)) == params


def test_the_stable_ops_are_registered_with_the_tables_schemas() -> None:
    if amp._C.__torch_abi__ != "stable":
        pytest.skip("this build of amp._C is the pybind11 one: it registers no torch ops")
    for name, schema in TABLE.items():
        registered = getattr(torch.ops.amp_C, name).default._schema
        assert [(a.name, a.default_value) for a in registered.arguments] == [
            (n, None if d is inspect.Parameter.empty else d) for n, d in schema_params(schema)[1]
        ], name


def test_defaults_and_keywords_reach_the_kernels() -> None:
    xs = [torch.full((4,), 2.0), torch.full((3,), 1.0)]
    norm, per, bad = amp._C.l2norm(xs)
    assert (norm, per, bad) == (pytest.approx(19**0.5), None, False)
    norm, per, bad = amp._C.l2norm(tensors=xs, per_tensor=True, scale=2.0)
    assert norm == pytest.approx(2 * 19**0.5)
    assert per.tolist() == pytest.approx([8.0, 2 * 3**0.5]) and per.dtype == torch.float64
    out = [torch.empty(4), torch.empty(3)]
    xs[1][0] = float("inf")
    assert amp._C.axpby(xs, xs, out, 1.0, 1.0) is True  # arg_to_check=-1: both inputs checked
    assert amp._C.axpby(xs, xs, out, a=1.0, b=1.0, arg_to_check=0) is True
    with pytest.raises(TypeError):
        amp._C.scale(xs, out, 1.0, bogus=1)
