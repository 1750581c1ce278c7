"""The Python face of amp._C when it is built on torch's stable ABI (kernels/bindings_stable.cpp).

That module registers its ops with torch's dispatcher (``torch.ops.amp_C.*``, the schemas of
kernels/op_table.h) and, while it is imported, hands itself to :func:`install`, which makes the
pybind11 module's functions (kernels/bindings.cpp: the same names, keyword arguments, defaults
and results) from the registered schemas, so ``amp._C.multi_tensor_scale(...)``,
``amp.multi_tensor_applier`` and the rest of ``amp`` do not see which binding was built (apex's
``multi_tensor_*`` are amp.kernels.apex_ops', installed by both bindings). Nothing here names an
op's arguments: each function is generated from its schema (a plain ``def`` with the schema's
parameters calling the op positionally, the cost of a hand-written one). What differs is
translated here:

* a bad argument leaves the op as RuntimeError ``[ValueError] ...`` / ``[TypeError] ...`` and is
  raised again here as that type, as the pybind11 module raises it;
* ``l2norm``'s per-tensor norms are None unless asked for; ``supported_isas`` is a list
  (:data:`_RESULTS`: what the dispatcher cannot carry).

Only torch is imported: this runs inside ``import amp._C``.
"""

from __future__ import annotations

import keyword
import re
from types import ModuleType
from typing import Any, Callable, Optional

import torch

__all__ = ["install"]

_TAGGED = re.compile(r"\[(ValueError|TypeError)\] (.*)", re.DOTALL)
_ERRORS = {"ValueError": ValueError, "TypeError": TypeError}


def _typed(exc: RuntimeError) -> Optional[Exception]:
    """The ValueError / TypeError an op's tagged RuntimeError stands for, or None."""
    m = _TAGGED.search(str(exc))
    if m is None:
        return None
    # torch may append its own context after the kernel's message: keep the first line.
    return _ERRORS[m.group(1)](_device_names(m.group(2).splitlines()[0]))


def _device_names(message: str) -> str:
    """The stable ABI knows PrivateUse1 only by its generic name; a backend that renamed it
    (torch_npu: "npu") is named as its users know it, as the pybind11 binding names it."""
    name = torch._C._get_privateuse1_backend_name()
    return message if name == "privateuseone" else message.replace("privateuseone", name)


def _l2norm(result: Any, tensors: Any, scale: Any, per_tensor: Any) -> Any:
    norm, per, bad = result
    return norm, (per if per_tensor else None), bad


#: Results the dispatcher carries in another form than the pybind11 module returns them:
#: op name -> f(result, *the call's arguments).
_RESULTS: dict[str, Callable[..., Any]] = {
    "l2norm": _l2norm,
    "supported_isas": lambda names: names.split(","),
}


def _function(name: str, op: Any, doc: str) -> Callable[..., Any]:
    """A function with the parameters of *op*'s registered schema, calling it positionally."""
    params, names = [], []
    for arg in op._schema.arguments:
        if not arg.name.isidentifier() or keyword.iskeyword(arg.name):
            raise ImportError(f"amp._C: op {name}'s argument {arg.name!r} is not a Python name")
        names.append(arg.name)
        params.append(
            arg.name if arg.default_value is None else f"{arg.name}={arg.default_value!r}"
        )
    call = f"_op({', '.join(names)})"
    if name in _RESULTS:
        call = f"_result({call}, {', '.join(names)})"
    source = (
        f"def {name}({', '.join(params)}):\n"
        f"    try:\n"
        f"        return {call}\n"
        f"    except RuntimeError as exc:\n"
        f"        typed = _typed(exc)\n"
        f"        if typed is None:\n"
        f"            raise\n"
        f"        raise typed from None\n"
    )
    # The overload's own callable: OpOverload.__call__ is a Python frame that only forwards
    # to it (*args, **kwargs: a tuple and a dict per call, and the collector's attention).
    call_op = getattr(op, "_op", op)
    scope: dict[str, Any] = {"_op": call_op, "_typed": _typed, "_result": _RESULTS.get(name)}
    exec(compile(source, f"<amp._C {name}>", "exec"), scope)  # source: the schema's, above
    fn = scope[name]
    fn.__doc__ = doc
    return fn


def _build(module: ModuleType) -> dict[str, Callable[..., Any]]:
    docs: dict[str, str] = module._docs
    return {
        name: _function(name, getattr(torch.ops.amp_C, name).default, docs[name])
        for name in module._schemas
    }


def install(module: ModuleType, functions: Optional[dict[str, Callable[..., Any]]] = None) -> None:
    """Give the stable amp._C *module* the pybind11 module's functions."""
    for name, fn in (functions or _build(module)).items():
        fn.__module__ = module.__name__
        fn.__qualname__ = name
        setattr(module, name, fn)
