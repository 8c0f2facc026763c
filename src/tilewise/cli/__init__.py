"""The one entry point: `tilewise play | bench | tune | sweep | store | report | convert | train | game | ladder |
devices`.

One module per command group (`cli/<group>.py`, each with `register(subparsers)`): they parse arguments, call the
packages and print; the work lives in the packages. This file wires them together, prints a `TilewiseError` as one
clear message (problem and fix, exit 2) and keeps tracebacks behind `--debug`. Heavy imports (numpy kernels, wgpu,
torch) happen inside the handlers.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from tilewise import __version__
from tilewise.cli import devices, game, ladder, model, store, sweep, train, tune
from tilewise.cli.common import HelpFormatter
from tilewise.errors import ConfigError, TilewiseError

# command groups, in help order
GROUPS = (game, model, tune, sweep, store, train, ladder, devices)
_INVALID_CHOICE = re.compile(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)")
_BAD_VALUE = re.compile(r"argument (\S+): (.*)", re.S)


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors raised as one clear `ConfigError` (problem and fix) like every other bad input,
    and help that shows every default."""

    def __init__(self, *args: object, **kw: object) -> None:
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kw)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        bad = _INVALID_CHOICE.fullmatch(message)
        if bad:
            what = bad.group(1).lower().replace("_", " ")
            raise ConfigError(f"unknown {what} {bad.group(2)!r} for `{self.prog}`",
                              f"use one of: {bad.group(3).replace(chr(39), '')}")
        bad = _BAD_VALUE.fullmatch(message)
        if bad:
            value = bad.group(2).replace("invalid int value", "expected a whole number, got")
            value = value.replace("invalid float value", "expected a number, got")
            raise ConfigError(f"{self.prog} {bad.group(1).split('/')[0]}: {value}", f"see `{self.prog} --help`")
        raise ConfigError(f"{self.prog}: {message}", f"see `{self.prog} --help`")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tilewise",
        description="Tune tiled GPU kernels honestly and run an NF4 LFM2 classifier on them.",
    )
    parser.add_argument("--version", action="version", version=f"tilewise {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for group in GROUPS:
        group.register(sub)
    return parser


def _note(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
          line: str | None = None) -> None:
    """Warnings reach a user as one `note:` line (where the warning was raised only with --debug)."""
    print(f"note: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None, *, exiting: bool = False) -> int:
    """Run one command; `exiting`: the process ends after it (the `tilewise` command)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = build_parser()
        if not [a for a in argv if a != "--debug"]:
            parser.print_help()
            return 0
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except TilewiseError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if exiting:  # a Ctrl-C pressed again while the process exits would turn exit 130 into a traceback
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def entry() -> int:
    """The `tilewise` command: `main`, with warnings shown as `note:` lines (tests call `main` and see warnings as
    Python raised them)."""
    if "--debug" not in sys.argv:
        warnings.showwarning = _note
    return main(exiting=True)


if __name__ == "__main__":
    raise SystemExit(entry())
