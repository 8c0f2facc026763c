"""`tilewise devices [--wide] [--json FILE]`: every usable device, and the one `auto` picks."""

from __future__ import annotations

import argparse
from typing import Any

from tilewise.cli import common

# features worth a column, with the short names the table shows
FEATURES = {"timestamp-query": "timestamps", "shader-f16": "f16", "subgroup": "subgroups", "float64": "f64",
            "cooperative-matrix": "coop-matrix", "chromium-experimental-subgroup-matrix": "subgroup-matrix"}


def register(sub: Any) -> None:
    p = sub.add_parser("devices", help="list usable devices (cpu, WebGPU adapters, CUDA GPUs) and what auto picks",
                       epilog="examples:\n  tilewise devices\n  tilewise devices --json - | python -m json.tool")
    p.add_argument("--wide", action="store_true", help="add workgroup limits and drivers (wider than 80 columns)")
    common.add_json(p, "the device list")
    p.set_defaults(func=_cmd_devices)


def _cmd_devices(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from tilewise.devices import list_devices, resolve
    from tilewise.errors import TilewiseError

    infos, notes = list_devices()
    console = common.console(args, soft_wrap=args.wide)
    common.emit_json(args.json, [i.as_dict() for i in infos], console.print)
    if args.json == common.STDOUT:
        return 0
    table = Table(title="tilewise devices")
    cols = ["device", "name", "type", "api", "features"] + (["wg storage", "invocations", "driver"] if args.wide
                                                             else [])
    for col in cols:
        table.add_column(col, overflow="fold")
    for info in infos:
        dev_name = info.device_name
        feats = ", ".join(short for f, short in FEATURES.items() if f in info.features)
        row = [dev_name, info.name, info.adapter_type, info.api, feats or "-"]
        if args.wide:
            lim = info.limits
            gpu = info.backend != "cpu"
            row += [f"{lim.max_workgroup_storage_bytes // 1024} KiB" if gpu else "-",
                    str(lim.max_invocations_per_workgroup) if gpu else "-", info.driver]
        table.add_row(*row)
    console.print(table)
    console.print("fingerprints (keys of stored results and dispatch tables):", style="dim")
    for info in infos:
        console.print(escape(f"  {info.device_name}  {info.fingerprint}"), style="dim", soft_wrap=True)
    try:
        from tilewise.model.runtime import resolve_device

        console.print(escape("the classifier (play, bench, tilewise.load) on auto: " + resolve_device().line()))
        from tilewise.kernels.registry import backends

        console.print(escape("tilewise tune gemm on auto: " + resolve("auto", backends("gemm"), "tuning gemm").line()))
    except TilewiseError as exc:
        console.print("[yellow]note[/yellow] " + escape(f"auto finds no device: {exc.problem}"))
    for note in notes:
        console.print("[yellow]note[/yellow] " + escape(note))
    return 0
