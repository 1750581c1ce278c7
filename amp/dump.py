"""Per-module dumps of a training step to HDF5: Apex for Ascend's ``apex.dump``.

``HookerAndDumper`` hooks every direct child of a model and writes, for one step, each child's
forward inputs and outputs and its backward gradients to one HDF5 file, so that a run on one
device can be compared number by number with a run on another (the ``npu`` device against the
CPU, say)::

    dumper = HookerAndDumper(file_path="run-a_")
    dumper.register_hooks(model, epoch=0, step=3)   # -> run-a_0-epoch_3-step_dump.hdf5
    loss = model(x).sum(); loss.backward()
    dumper.remove_hooks()
    data = dumper.read_h5py_data()                  # {"0000_Linear/feat_input0": array, ...}

The file layout is Ascend's, which its users' comparison scripts read: one group per hook call,
``NNNN_<ModuleClass>`` (a counter shared by forward and backward calls, four digits); in a
forward group ``feat_input<i>`` per input and ``feat_output`` (``feat_output<i>`` when the
module returns a tuple); in a backward group ``grad_output<i>`` and ``grad_input<i>``. A missing
value (``None``, or an argument that is not a tensor) is an empty float dataset, as in Ascend.
Every dataset also carries its torch dtype as the attribute ``torch_dtype``: bfloat16, which
NumPy lacks, is stored as float32 (exactly: bfloat16 values are float32 values).

Differences from Ascend: the gradients are those of the whole module, as torch's
``register_full_backward_hook`` gives them (Ascend used the deprecated ``register_backward_hook``,
whose gradients are those of the module's last operation only); messages go to the ``amp``
logger, or to the screen with ``is_screen_display=True``, instead of always being printed.
Needs ``h5py`` (the ``dump`` extra: ``pip install "ampforge[dump]"``).

The gradients are taken by two identity autograd functions per hooked call (``_Tap``), one on
the module's inputs and one on its outputs, rather than by a full backward hook: the outputs of
a full backward hook are views, which torch refuses to let the next layer modify in place
(``ReLU(inplace=True)`` after ResNet's ``bn1``: "Output 0 of BackwardHookFunctionBackward is a
view and is being modified inplace"). The taps hand on copies instead, one more copy of each
hooked child's inputs and outputs while dumping.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn

logger = logging.getLogger("amp")

__all__ = ["HookerAndDumper"]


def _h5py() -> Any:
    try:
        import h5py  # noqa: PLC0415 (optional: only a file dump needs it)
    except ImportError as exc:
        raise ImportError(
            "apex.dump (amp.dump) writes HDF5 through h5py, which is not installed: "
            'pip install "ampforge[dump]" (or pip install h5py)'
        ) from exc
    return h5py


def _as_array(value: Any) -> tuple[Any, str]:
    """The NumPy array to store for *value*, and the torch dtype it came from."""
    tensor = value.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy(), str(value.dtype)


class _Tap(torch.autograd.Function):
    """Identity that hands the gradients arriving in backward to ``callback``. Its outputs
    are copies, not views, so the code after a hooked module may modify them in place."""

    @staticmethod
    def forward(ctx: Any, callback: Callable[[tuple], None], *tensors: torch.Tensor) -> Any:
        ctx.callback = callback
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        return tuple(t.clone() for t in tensors)

    @staticmethod
    def backward(ctx: Any, *grads: Optional[torch.Tensor]) -> Any:
        ctx.callback(grads)
        return (None, *grads)


@dataclass
class _Call:
    """One hooked call's backward: written once its input gradients (if any) have arrived."""

    module: nn.Module
    grad_input: list[Optional[torch.Tensor]]
    waits_for_inputs: bool
    grad_output: Optional[tuple] = None
    written: bool = field(default=False)


def _needs_grad(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad


class HookerAndDumper:
    """Dump a model's per-child forward inputs/outputs and gradients for one step to HDF5."""

    def __init__(self, file_path: str = "", is_screen_display: bool = False) -> None:
        self.file_path = file_path  # the prefix; register_hooks appends epoch and step
        self.is_screen_display = is_screen_display
        self.handles: list[Any] = []
        self.G_WRITE_POINT_COUNT = 0  # Ascend's name: the next group's number
        self.model: Optional[nn.Module] = None
        self._prefix = file_path

    # --- what the hooks write ------------------------------------------------------------
    def _say(self, message: str) -> None:
        if self.is_screen_display:
            print(message)
        else:
            logger.debug(message)

    def _write_group(self, module: nn.Module, entries: Sequence[tuple[str, Any]]) -> None:
        h5py = _h5py()
        name = f"{self.G_WRITE_POINT_COUNT:04d}_{module._get_name()}"
        self.G_WRITE_POINT_COUNT += 1
        with h5py.File(self.file_path, "a") as f:
            group = f.create_group(name)
            for dataset, value in entries:
                self._write_values(group, dataset, value)
        self._say(f"dump: {name}")

    def _write_values(self, group: Any, dataset: str, value: Any) -> None:
        # A tuple (or list) gets one dataset per element, numbered; a single value one dataset.
        if isinstance(value, (tuple, list)):
            for index, item in enumerate(value):
                self._write_one(group, f"{dataset}{index}", item)
        else:
            self._write_one(group, dataset, value)

    def _write_one(self, group: Any, name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            data, dtype = _as_array(value)
            ds = group.create_dataset(name, data=data)
        else:
            ds = group.create_dataset(name, shape=(0,), dtype="f")
            dtype = "None" if value is None else type(value).__name__
        ds.attrs["torch_dtype"] = dtype

    def forward_hook_fn(self, module: nn.Module, inputs: Any, output: Any) -> Any:
        self._write_group(module, [("feat_input", inputs), ("feat_output", output)])
        call: Optional[_Call] = getattr(module, "_amp_dump_call", None)
        module._amp_dump_call = None
        if call is None:
            return None
        outputs = output if isinstance(output, tuple) else (output,)
        tapped = [i for i, o in enumerate(outputs) if _needs_grad(o)]
        if not tapped:
            return None

        def on_grad_output(grads: tuple) -> None:
            full: list[Optional[torch.Tensor]] = [None] * len(outputs)
            for i, g in zip(tapped, grads):
                full[i] = g
            call.grad_output = tuple(full)
            if not call.waits_for_inputs:
                self._write_backward(call)

        copies = _Tap.apply(on_grad_output, *(outputs[i] for i in tapped))
        new = list(outputs)
        for i, copy in zip(tapped, copies):
            new[i] = copy
        return tuple(new) if isinstance(output, tuple) else new[0]

    def _forward_pre_hook(self, module: nn.Module, args: tuple) -> Optional[tuple]:
        """Tap the inputs that need a gradient, for this call's ``grad_input``."""
        if not torch.is_grad_enabled():
            module._amp_dump_call = None
            return None
        tapped = [i for i, a in enumerate(args) if _needs_grad(a)]
        call = _Call(module, [None] * len(args), waits_for_inputs=bool(tapped))
        module._amp_dump_call = call
        if not tapped:
            return None

        def on_grad_input(grads: tuple) -> None:
            for i, g in zip(tapped, grads):
                call.grad_input[i] = g
            self._write_backward(call)

        copies = _Tap.apply(on_grad_input, *(args[i] for i in tapped))
        new = list(args)
        for i, copy in zip(tapped, copies):
            new[i] = copy
        return tuple(new)

    def _write_backward(self, call: _Call) -> None:
        if call.written or call.grad_output is None:
            return
        call.written = True
        self.backward_hook_fn(call.module, tuple(call.grad_input), call.grad_output)

    def backward_hook_fn(self, module: nn.Module, grad_input: Any, grad_output: Any) -> None:
        # Ascend's order: the gradient arriving (grad_output) first, then the one leaving.
        self._write_group(module, [("grad_output", grad_output), ("grad_input", grad_input)])

    # --- Ascend's interface --------------------------------------------------------------
    def register_hooks(self, model: nn.Module, epoch: Any, step: Any) -> None:
        """Hook every direct child of *model*; the dump goes to
        ``<file_path><epoch>-epoch_<step>-step_dump.hdf5``, created empty now."""
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"register_hooks: model must be a torch.nn.Module; got {type(model).__name__}"
            )
        if self.handles:
            raise RuntimeError(
                "register_hooks: hooks are registered already; call remove_hooks() first"
            )
        h5py = _h5py()
        self.file_path = f"{self._prefix}{epoch}-epoch_{step}-step_dump.hdf5"
        with h5py.File(self.file_path, "w"):
            pass  # a fresh file per step, as Ascend (a rerun of a step replaces its dump)
        self.G_WRITE_POINT_COUNT = 0
        self.model = model
        for name, child in model.named_children():
            self.handles.append(child.register_forward_pre_hook(self._forward_pre_hook))
            self.handles.append(child.register_forward_hook(self.forward_hook_fn))
            self._say(f"dump: hooked {name} ({child._get_name()})")

    def remove_hooks(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        if self.model is not None:
            for child in self.model.children():
                child.__dict__.pop("_amp_dump_call", None)
        self._say(f"dump: written to {self.file_path}")

    def read_h5py_data(self) -> dict[str, Any]:
        """Every dataset of the dump, by its path (``"0000_Linear/feat_input0"``), as NumPy
        arrays; also lists them (name, dtype, shape) as Ascend prints them."""
        h5py = _h5py()
        out: dict[str, Any] = {}
        with h5py.File(self.file_path, "r") as f:

            def visit(name: str, obj: Any) -> None:
                if isinstance(obj, h5py.Dataset):
                    out[name] = obj[()]
                    self._say(f"{name} {obj.dtype} {obj.shape}")

            f.visititems(visit)
        return out
