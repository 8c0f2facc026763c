"""What every command shares: the `--json FILE` convention, argument types that refuse bad values with the
fix, help that shows defaults, and the console that keeps stdout clean when JSON goes there.

The convention: `--json FILE` writes the command's result as JSON to FILE; `--json -` writes it to stdout and
nothing else (human output moves to stderr). FILE is checked before any work: a folder, a missing parent or an
existing SQLite database (a results store) is refused, so a long run never ends in a write error or
overwrites a store.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from tilewise import files
from tilewise.errors import ConfigError

SQLITE_MAGIC = b"SQLite format 3\x00"
STDOUT = "-"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps examples in epilogs as written and adds "(default: X)" to options whose help does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or not action.option_strings):
            return text
        return f"{text} (default: {action.default})"


def is_sqlite(path: str | os.PathLike[str]) -> bool:
    """True when `path` is an existing SQLite database (for example a results store)."""
    try:
        with open(path, "rb") as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def output_file(text: str, what: str = "--json") -> str:
    """Check an output path before any work: `-` (stdout), or a file whose folder exists and is not a store."""
    if text == STDOUT:
        return text
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{what} needs a file name (or - for stdout)")
    p = Path(text)
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{what} {text!r} is a folder; give a file name, e.g. {p / 'result.json'}")
    if not p.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{what} {text!r}: the folder {str(p.parent)!r} does not exist; create it "
                                         "first or write somewhere else")
    if is_sqlite(p):
        raise argparse.ArgumentTypeError(f"{what} {text!r} is a SQLite database (a results store?); it is never "
                                         "overwritten: choose another file")
    return text


def add_json(p: argparse.ArgumentParser, what: str = "the result") -> None:
    """The one `--json FILE` option (`-` for stdout)."""
    p.add_argument("--json", metavar="FILE", type=output_file, default=None,
                   help=f"write {what} as JSON to FILE ('-' for stdout; the rest of the output then goes to stderr)")


def emit_json(target: str | None, obj: Any, note: Any = None) -> None:
    """Write `obj` as JSON to `target` (`-`: stdout) atomically; `note(text)` reports the file written."""
    if target is None:
        return
    text = json.dumps(obj, indent=1, default=_plain)
    if target == STDOUT:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return
    write_atomic(target, text)
    if note is not None:
        note(f"wrote {target}")


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write text through a temporary file in the same folder, so a crash never leaves half a file behind."""
    p = Path(path)
    if is_sqlite(p):
        raise ConfigError(f"{p} is a SQLite database (a results store?); it is never overwritten",
                          "choose another output file")
    files.write_atomic(p, text)


def _plain(x: Any) -> Any:
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"{type(x).__name__} is not JSON serializable")


def console(args: argparse.Namespace | None = None, **kw: Any) -> Any:
    """A rich Console for human output: stderr when `--json -` owns stdout."""
    from rich.console import Console

    to_stderr = args is not None and getattr(args, "json", None) == STDOUT
    return Console(stderr=to_stderr, **kw)


def int_at_least(low: int, high: int | None = None) -> Any:
    """An argparse type: an integer in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f"of at least {low}"
            raise argparse.ArgumentTypeError(f"expected a whole number {span}, got {value}")
        return value

    parse.__name__ = "int"
    return parse


def float_in(low: float, high: float | None = None, *, low_open: bool = False) -> Any:
    """An argparse type: a finite number in [low, high] (or (low, high] with `low_open`)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        bad = value != value or value in (float("inf"), float("-inf")) or value < low or (low_open and value == low)
        if bad or (high is not None and value > high):
            above = f"above {low:g}" if low_open else f"at least {low:g}"
            span = f"{above}{f' and at most {high:g}' if high is not None else ''}"
            raise argparse.ArgumentTypeError(f"expected a number {span}, got {text}")
        return value

    parse.__name__ = "float"
    return parse


# seeds feed numpy's generators, which take 0 .. 2**63 - 1 here (one int64)
seed = int_at_least(0, 2**63 - 1)
positive = int_at_least(1)
non_negative = int_at_least(0)
