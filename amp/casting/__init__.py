"""Casting: what amp does to the model's side of mixed precision.

* ``model``: converting a model's weights (O0/O2/O3) and wrapping its ``forward`` (inputs, O1's
  ``torch.autocast``, outputs);
* ``registry``: apex's O1 user cast registry (``amp.register_*_function`` and the decorators);
* ``o1``: the O1 state below the registry (apex's ``_amp_state.handle``, the O1 forward running);
* ``legacy``: apex's old O1 API, ``amp.init()`` and ``amp.disable_casts()``.

Nothing is imported here: ``amp._amp_state`` reads ``o1`` and ``registry`` reads
``amp._amp_state``, so this package stays empty to keep that order free of circles.
"""
