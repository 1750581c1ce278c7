"""apex.parallel's optimizer wrapper for large-batch training: ``amp.parallel.LARC``.

(Data parallelism itself is torch's ``DistributedDataParallel``; wrap the model in it after
``amp.initialize``.)"""

from .LARC import LARC

__all__ = ["LARC"]
