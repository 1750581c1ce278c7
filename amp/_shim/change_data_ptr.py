"""Apex for Ascend's top-level ``change_data_ptr`` module (a C++ extension of its wheel, which
its ``combine_tensors`` and custom optimizers import as ``from change_data_ptr import
change_data_ptr``), served by ampforge: ``amp.combine_tensors.change_data_ptr``.

Like ``apex``, it sits in ``amp/_shim`` (on ``sys.path`` after the site directory): an
installed Apex for Ascend keeps its own ``change_data_ptr``."""

from amp.combine_tensors import change_data_ptr

__all__ = ["change_data_ptr"]
