"""`tilewise store export|import|path` (share tuning results between machines) and `tilewise report` (what the
results store holds)."""

from __future__ import annotations

import argparse
from typing import Any

from tilewise.errors import ConfigError


def register(sub: Any) -> None:
    p = sub.add_parser("store", help="export or import tuning results (share them between machines)")
    p.add_argument("action", choices=["export", "import", "path"])
    p.add_argument("file", nargs="?", help="FILE.json")
    p.add_argument("--store", metavar="PATH")
    p.add_argument("--replace", action="store_true", help="on import, overwrite rows this store already has")
    p.set_defaults(func=cmd_store)

    p = sub.add_parser("report", help="list what the results store holds")
    p.add_argument("--store", metavar="PATH")
    p.add_argument("--kernel")
    p.add_argument("--shape")
    p.add_argument("--device-fingerprint")
    p.add_argument("--top", type=int, default=5, help="best configs shown per (device, kernel, shape)")
    p.set_defaults(func=cmd_report)


def cmd_store(args: argparse.Namespace) -> int:
    from tilewise.tune.store import Store

    store = Store(args.store)
    if args.action == "path":
        print(store.path)
        return 0
    if not args.file:
        raise ConfigError(f"`tilewise store {args.action}` needs a FILE.json", f"tilewise store {args.action} r.json")
    if args.action == "export":
        n = store.export_json(args.file)
        print(f"exported {n} results from {store.path} to {args.file}")
    else:
        added, skipped = store.import_json(args.file, replace=args.replace)
        print(f"imported {added} results into {store.path}"
              + (f"; kept {skipped} already stored (use --replace to overwrite)" if skipped else ""))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from tilewise.tune.store import Store

    store = Store(args.store)
    console = Console(soft_wrap=True)
    summary = [s for s in store.summary() if (not args.kernel or s["kernel"] == args.kernel)
               and (not args.shape or s["shape"] == args.shape.replace(",", "x"))
               and (not args.device_fingerprint or s["fingerprint"] == args.device_fingerprint)]
    if not summary:
        console.print(f"the store {store.path} holds no matching results", markup=False)
        return 0
    groups: dict[tuple[str, str, str], dict[str, int]] = {}
    for s in summary:
        groups.setdefault((s["fingerprint"], s["kernel"], s["shape"]), {})[s["status"]] = s["count"]
    t = Table(title=f"results in {store.path}")
    for col in ("device", "kernel", "shape", "statuses", "best configs (median ms)"):
        t.add_column(col, overflow="fold")
    for (fp, kernel, shape), counts in groups.items():
        ok = sorted((r for r in store.query(fp, kernel, shape, "ok") if r.median_ms is not None),
                    key=lambda r: r.median_ms or 0.0)[: args.top]
        best = "\n".join(f"{r.median_ms:.4f}  {r.config}" for r in ok)
        t.add_row(fp, kernel, shape, ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), best)
    console.print(t)
    return 0
