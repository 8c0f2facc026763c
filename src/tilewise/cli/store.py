"""`tilewise store export|import|path` (share tuning results between machines) and `tilewise report` (what the
results store holds).

`store path`, `store export` and `report` only read: they open the store read-only and never create one.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tilewise.cli import common
from tilewise.errors import ConfigError

WIDTH = 80  # the report fits this many columns unless --wide
_STORE_HELP = "the results store file (default: TILEWISE_STORE, else the user cache; `tilewise store path` shows it)"

STORE_EPILOG = """examples:
  tilewise store export results.json   write every result to results.json
  tilewise store import results.json   add them here (stored rows are kept)"""

REPORT_EPILOG = """examples:
  tilewise report --kernel gemm --top 3   fastest 3 configs per gemm shape
  tilewise report --json - --wide         JSON on stdout, the report on stderr"""


def register(sub: Any) -> None:
    p = sub.add_parser("store", help="export or import tuning results (share them between machines)",
                       description="Show the results store's path, export its results to JSON, or import them.",
                       epilog=STORE_EPILOG)
    p.add_argument("action", choices=["export", "import", "path"],
                   help="path: print the store's file; export: write every result to FILE; import: read FILE "
                        "into the store (all rows or none)")
    p.add_argument("file", nargs="?", metavar="FILE",
                   help="the JSON file to export to ('-' for stdout) or import from")
    p.add_argument("--store", metavar="PATH", help=_STORE_HELP)
    p.add_argument("--replace", action="store_true",
                   help="on import, overwrite rows this store already has (they are kept otherwise)")
    p.set_defaults(func=cmd_store)

    p = sub.add_parser("report", help="list what the results store holds",
                       description="Per device, kernel and shape: the status counts and the fastest ok configs.",
                       epilog=REPORT_EPILOG)
    p.add_argument("--store", metavar="PATH", help=_STORE_HELP)
    p.add_argument("--kernel", metavar="NAME", help="only this kernel (e.g. gemm)")
    p.add_argument("--shape", metavar="SHAPE", help="only this shape, e.g. 64x64x64 (or 64,64,64)")
    p.add_argument("--device-fingerprint", metavar="FP", help="only this device (its full fingerprint, see --wide)")
    p.add_argument("--top", type=common.positive, default=5, metavar="N",
                   help="best configs shown per (device, kernel, shape)")
    p.add_argument("--wide", action="store_true",
                   help="full fingerprints and config keys (lines may pass 80 columns)")
    common.add_json(p, "the report (every field of the configs shown)")
    p.set_defaults(func=cmd_report)


# ---- store -------------------------------------------------------------------------------------------------------
def cmd_store(args: argparse.Namespace) -> int:
    from tilewise.tune.store import Store, default_path

    path = Path(args.store) if args.store else default_path()
    if args.replace and args.action != "import":
        raise ConfigError(f"--replace applies to `tilewise store import`, not `store {args.action}`",
                          "drop --replace")
    if args.action == "path":
        if args.file:
            raise ConfigError(f"`tilewise store path` takes no FILE (got {args.file!r})", "tilewise store path")
        print(path)
        if not path.exists():  # on stderr, so `$(tilewise store path)` stays the bare path
            print("(does not exist yet: `tilewise tune`, `tilewise sweep` or `tilewise store import` create it)",
                  file=sys.stderr)
        return 0
    if not args.file:
        example = "results.json" if args.action == "import" else "results.json (or - for stdout)"
        raise ConfigError(f"`tilewise store {args.action}` needs a FILE", f"tilewise store {args.action} {example}")
    if args.action == "export":
        with Store(path, readonly=True) as store:
            n = store.export_json(args.file)
        where = "stdout" if args.file == common.STDOUT else args.file
        print(f"exported {n} results from {path} to {where}", file=sys.stderr if where == "stdout" else sys.stdout)
        return 0
    from tilewise.tune.store_io import read_export

    rows = read_export(args.file)  # every row checked before the store is opened (or created)
    with Store(path) as store:
        added, skipped = store.put_many(rows, replace=args.replace)
    print(f"imported {added} results into {path}"
          + (f"; kept {skipped} already stored (use --replace to overwrite)" if skipped else ""))
    return 0


# ---- report ------------------------------------------------------------------------------------------------------
def cmd_report(args: argparse.Namespace) -> int:
    from tilewise.tune.store import Store

    shape = args.shape.replace(",", "x").replace(" ", "") if args.shape else None
    with Store(args.store, readonly=True) as store:
        data = report_data(store, args.device_fingerprint, args.kernel, shape, args.top)
    common.emit_json(args.json, data, note=lambda text: print(text, file=sys.stderr))
    out = common.console(args, soft_wrap=True, highlight=False)
    for line in report_lines(data, args.wide):
        out.print(line, markup=False)
    return 0


def report_data(store: Any, fingerprint: str | None, kernel: str | None, shape: str | None,
                top: int) -> dict[str, Any]:
    """Per (device, kernel, shape): status counts and the `top` fastest ok rows (every field)."""
    total = len(store)
    summary = store.summary(fingerprint, kernel, shape)
    if total and not summary:
        raise _no_match(store, fingerprint, kernel, shape)
    from tilewise.tune.store import STATUSES

    groups: dict[tuple[str, str, str], dict[str, int]] = {}
    for s in sorted(summary, key=lambda s: STATUSES.index(s["status"])):
        groups.setdefault((s["fingerprint"], s["kernel"], s["shape"]), {})[s["status"]] = s["count"]
    groups = dict(sorted(groups.items()))
    return {"store": str(store.path), "results": total,
            "filters": {"device_fingerprint": fingerprint, "kernel": kernel, "shape": shape},
            "groups": [{"fingerprint": fp, "kernel": k, "shape": sh, "statuses": counts,
                        "best": [asdict(r) for r in store.best(fp, k, sh, top)]}
                       for (fp, k, sh), counts in groups.items()]}


def _no_match(store: Any, fingerprint: str | None, kernel: str | None, shape: str | None) -> ConfigError:
    for flag, column, value in (("--device-fingerprint", "fingerprint", fingerprint), ("--kernel", "kernel", kernel),
                                ("--shape", "shape", shape)):
        stored = store.distinct(column)
        if value is not None and value not in stored:
            listed = ", ".join(stored[:8]) + (f" and {len(stored) - 8} more" if len(stored) > 8 else "")
            return ConfigError(f"the store {store.path} holds no results for {flag} {value}",
                               f"it holds {column}s: {listed}")
    given = " ".join(f"{f} {v}" for f, v in (("--device-fingerprint", fingerprint), ("--kernel", kernel),
                                              ("--shape", shape)) if v is not None)
    return ConfigError(f"the store {store.path} holds no results matching {given} together",
                       "drop a filter; `tilewise report` alone lists everything")


def report_lines(data: dict[str, Any], wide: bool = False) -> list[str]:
    """The report as lines of at most `WIDTH` columns (unless `wide`): a device line, then one block per kernel
    and shape: its status counts and the best configs as `median_ms  values` under their parameter names."""
    fit = (lambda s: s) if wide else (lambda s: _fit(s, WIDTH))
    n = data["results"]
    counted = f": {n} result{'s' * (n != 1)}"
    where = data["store"]
    if not wide and len(where) + len(counted) + 14 > WIDTH:  # keep the file name, shorten the folders
        where = "…" + where[len(where) + len(counted) + 15 - WIDTH:]
    lines = [f"results store {where}{counted}"]
    if not data["groups"]:
        return [*lines, "it holds no results yet"]
    device = None
    for g in data["groups"]:
        if g["fingerprint"] != device:
            device = g["fingerprint"]
            lines += ["", fit(f"device {device if wide else short_fingerprint(device)}")]
        counts = ", ".join(f"{s} {c}" for s, c in g["statuses"].items())
        lines += _wrap(f"  {g['kernel']} {g['shape']}: {counts}", "      ", wide)
        if not g["best"]:
            lines.append("    no timed ok results")
            continue
        lines += [fit(s) for s in config_lines([r["median_ms"] for r in g["best"]], [r["config"] for r in g["best"]],
                                               wide)]
    return lines


def config_lines(medians_ms: list[float], keys: list[str], wide: bool = False) -> list[str]:
    """`median_ms` and the config: full keys when `wide` or the names differ between rows, else one header of
    names over aligned values."""
    pairs = [[tuple(p.split("=", 1)) if "=" in p else (p, "") for p in k.split(",") if p] for k in keys]
    names = [tuple(n for n, _ in p) for p in pairs]
    if wide or len(set(names)) != 1 or not names[0]:
        return ["    median_ms  config", *(f"    {m:>9.4f}  {k}" for m, k in zip(medians_ms, keys))]
    widths = [max(len(n), *(len(p[i][1]) for p in pairs)) for i, n in enumerate(names[0])]
    head = "    median_ms  " + " ".join(n.rjust(w) for n, w in zip(names[0], widths))
    return [head, *(f"    {m:>9.4f}  " + " ".join(v.rjust(w) for (_, v), w in zip(p, widths))
                    for m, p in zip(medians_ms, pairs))]


def short_fingerprint(fp: str, width: int = 60) -> str:
    """`backend:api:name…:digest`: the start and the hash (which tells any two devices apart)."""
    if len(fp) <= width:
        return fp
    head, _, digest = fp.rpartition(":")
    if not head or len(digest) > width // 2:
        return fp[: width - 1] + "…"
    return fp[: width - len(digest) - 2] + "…:" + digest


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _wrap(text: str, indent: str, wide: bool) -> list[str]:
    import textwrap

    if wide or len(text) <= WIDTH:
        return [text]
    return textwrap.wrap(text, WIDTH, subsequent_indent=indent, break_long_words=True, break_on_hyphens=False)
