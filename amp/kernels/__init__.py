"""amp's side of the compiled kernels (``amp._C``, loaded by ``amp._ext``):

* ``ops``: the multi-tensor ops amp and its optimizers call (scale, axpby, l2norm, the unscale
  pass that also measures the norm, and the Adam, SGD, LAMB, Adagrad and NovoGrad steps): the
  compiled kernels for CPU tensors, pure torch on every other device;
* ``apex_ops``: apex's ``amp_C.multi_tensor_*`` entry points over ``ops``, installed on
  ``amp._C`` by both bindings (apex's conventions, written once);
* ``stable_binding``: the Python face of ``amp._C`` when it is built on torch's stable ABI.

``amp._C`` and its loader ``amp._ext`` stay at the top: the extension's import name is fixed by
setup.py and the wheels, and the builder's checks import ``amp._ext``. Nothing is imported here:
the bindings import ``apex_ops`` and ``stable_binding`` while ``amp._C`` itself is importing.
"""
