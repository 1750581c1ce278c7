"""The containerized manylinux build system for ampforge (run as ``python -m builder``).

Data flows one way: config -> cells -> rendered recipe -> engine -> artifacts -> repair ->
verification -> manifest. Never shipped inside the ``amp`` wheel.
"""

__version__ = "0.1.0"
