"""The command line every per-kernel benchmark of the classifier shares: where to write, which preset's shapes at
how many rows, how many rounds of the race, which device; then the output folder, the device and the model config.

    args, out, dev, cfg = bench_args.parse(__doc__, "attention_dawn.json", "attention shape", "dawn", "dawn or dawn:N")
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any


def parse(doc: str | None, json_name: str, measured: str, device: str, device_help: str,
          rows_help: str = "queries (a decision's prompt length)",
          more: Callable[[argparse.ArgumentParser], None] | None = None) -> tuple[argparse.Namespace, Path, Any, Any]:
    """(arguments, the output folder (made), the device, the preset's model config)."""
    from tilewise.devices import get_device
    from tilewise.model.tune import model_config

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help=f"folder for {json_name}")
    ap.add_argument("--preset", default="lfm2-350m", help=f"model preset whose {measured} is measured")
    ap.add_argument("--rows", type=int, default=346, help=rows_help)
    ap.add_argument("--rounds", type=int, default=20, help="rounds of the race")
    ap.add_argument("--device", default=device, help=device_help)
    if more is not None:
        more(ap)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return args, out, get_device(args.device), model_config(args.preset)
