"""`tilewise devices [--json]`: every usable device, and the one `auto` picks."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("devices", help="list usable devices (cpu, WebGPU adapters, CUDA GPUs) and what auto picks")
    p.add_argument("--json", action="store_true", help="print a JSON list of device objects")
    p.set_defaults(func=_cmd_devices)


def _cmd_devices(args: argparse.Namespace) -> int:
    from tilewise.devices import list_devices, resolve
    from tilewise.errors import TilewiseError

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
