"""The one entry point: `tilewise play | bench | tune | sweep | store | report | convert | train | game | devices`.

Each feature package owns its subcommands in a `cli.py` with `register(subparsers)`; this file only
wires them together, prints `TilewiseError`s as one clear message, and keeps tracebacks behind
`--debug`. Heavy imports (numpy kernels, wgpu, torch) happen inside the handlers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from tilewise import __version__
from tilewise.errors import TilewiseError

# modules that contribute subcommands, in help order
COMMAND_MODULES = (
    "tilewise.game.cli",
    "tilewise.model.cli",
    "tilewise.tune.cli",
    "tilewise.runtime_cli",
    "tilewise.train.cli",
    "tilewise.ladder_cli",
)


def _cmd_devices(args: argparse.Namespace) -> int:
    from tilewise.devices import list_devices

    infos, notes = list_devices()
    if args.json:
        print(json.dumps([i.as_dict() for i in infos], indent=2))
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="tilewise devices")
    for col in ("device", "name", "type", "api", "wg storage", "invocations", "features"):
        table.add_column(col, overflow="fold")
    for info in infos:
        dev_name = info.backend if info.backend == "cpu" else f"{info.backend}:{info.index}"
        lim = info.limits
        storage = "-" if info.backend == "cpu" else f"{lim.max_workgroup_storage_bytes // 1024} KiB"
        inv = "-" if info.backend == "cpu" else str(lim.max_invocations_per_workgroup)
        feats = ", ".join(f for f in info.features if f in ("timestamp-query", "shader-f16", "subgroup",
                                                             "float64", "cooperative-matrix"))
        table.add_row(dev_name, info.name, info.adapter_type, info.api, storage, inv, feats)
    console = Console()
    console.print(table)
    for info in infos:
        console.print(escape(f"{info.backend}:{info.index} driver {info.driver}; fingerprint {info.fingerprint}"),
                      style="dim")
    for note in notes:
        console.print("[yellow]note[/yellow] " + escape(note))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilewise",
        description="Tune tiled GPU kernels honestly and run an NF4 LFM2 classifier on them.",
    )
    parser.add_argument("--version", action="version", version=f"tilewise {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("devices", help="list usable devices (cpu, WebGPU adapters, CUDA GPUs)")
    p.add_argument("--json", action="store_true", help="print a JSON list of device objects")
    p.set_defaults(func=_cmd_devices)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that feature is not part of this build
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except TilewiseError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
