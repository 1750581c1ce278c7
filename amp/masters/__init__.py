"""The optimizer side of amp's step:

* ``stash``: what amp keeps on each optimizer -- the ``Stage`` of its step (one per optimizer
  per step) and the fp32 master weights;
* ``backward``: the protocol ``scale_loss`` drives around the backward pass;
* ``unscale``: the unscale passes (per tensor list, one pass, combined, deferred) and their one
  result type, ``Unscaled``;
* ``patching``: the optimizer methods ``amp.initialize`` patches;
* ``optimizer_like``: what amp accepts as an optimizer, and its seam with the fused optimizers
  (Protocols).

Nothing is imported here, so that amp.optimizers can read ``unscale`` and ``optimizer_like``
without loading amp's step.
"""
