"""Backends that run the in-cell steps: a Docker-API engine (``docker``) or this host (``host``).

Both hand out sessions following :class:`builder.engines.base.Session`.
"""
