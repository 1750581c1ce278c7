"""``python -m builder.cross``: one ARM cell through the cross path, by hand.

    python -m builder.cross [--project .] [--out dist-arm] [--python 3.11] [--torch 2.9.1]
                            [--local-version torch2.9] [--no-verify]

The pipeline calls :func:`builder.cross.build_cross_cell` directly; this is for trying it out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from builder.cross.cell import build_cross_cell, cross_available
from builder.errors import BuilderError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m builder.cross", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--project", type=Path, default=Path("."))
    parser.add_argument("--out", type=Path, default=Path("dist-arm"))
    parser.add_argument("--python", default=f"{sys.version_info[0]}.{sys.version_info[1]}")
    parser.add_argument("--torch", default="2.9.1")
    parser.add_argument("--local-version", default=None)
    parser.add_argument("--no-verify", action="store_true")
    args = parser.parse_args(argv)
    ok, why = cross_available("aarch64", args.python)
    print(f"cross path: {'available' if ok else 'unavailable'}: {why}", file=sys.stderr)
    if not ok:
        return 1
    try:
        result = build_cross_cell(args.project, args.out, args.python, args.torch,
                                  verify=not args.no_verify, local_version=args.local_version)
    except BuilderError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.return_code
    print(json.dumps({"wheel": str(result.wheel), "tag": result.tag, "compiler": result.compiler,
                      "torch": result.target_torch, "seconds": result.seconds,
                      "verification": result.verification, "log": str(result.log)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
