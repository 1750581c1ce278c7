"""Subcommands of ``python -m builder``: one module each (see builder/cli.py)."""
