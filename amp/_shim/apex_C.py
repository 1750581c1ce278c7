"""apex's top-level ``apex_C`` module (a C++ extension of NVIDIA apex and Apex for Ascend:
``apex_C.flatten(tensors)``, ``apex_C.unflatten(flat, tensors)``), served by ampforge from
``amp.combine_tensors``.

Like ``apex``, it sits in ``amp/_shim`` (on ``sys.path`` after the site directory): an
installed apex keeps its own ``apex_C``."""

from amp.combine_tensors import flatten, unflatten

__all__ = ["flatten", "unflatten"]
