"""`python -m tilewise.train ARGS` = `tilewise train ARGS`, without loading the other commands' modules.

For machines that have torch but not every dependency of the full CLI (e.g. a training-only GPU image).
"""

from __future__ import annotations

import argparse
import sys

from tilewise.cli.train import register
from tilewise.errors import TilewiseError


def main(argv: list[str] | None = None) -> int:
    """Parse `tilewise train` arguments and run it; errors print as one message (exit code 2)."""
    parser = argparse.ArgumentParser(prog="python -m tilewise.train")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    args = parser.parse_args(["train", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except TilewiseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
