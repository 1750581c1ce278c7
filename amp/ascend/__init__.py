"""What Apex for Ascend adds to apex's amp, on any device:

* ``combined``: combined gradients (``combine_grad``), one buffer per dtype per optimizer, and
  the combined parameters the ``NpuFused*`` optimizers step;
* ``methods``: the ``get_*_combined_*`` and ``clip_*_grad_norm_fused`` methods every optimizer
  gets from ``amp.initialize``;
* ``ddp``: ``combine_ddp``, the combined gradients all-reduced in buckets instead of DDP;
* ``saturation``: the NPU's saturation mode, the one place amp asks torch_npu for its overflow
  flag.

(``amp.combine_tensors``, Ascend's ``apex.contrib.combine_tensors``, stays at the top under its
public name.) Nothing is imported here, so that importing one module loads only what it needs.
"""
