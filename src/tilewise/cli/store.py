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
  tilewise report --portable --install   one table for GPUs never tuned"""


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
    p.add_argument("--device-fingerprint", metavar="FP",
                   help="only this device (its full fingerprint, see --wide); with --portable, FP1,FP2,... the devices "
                        "to choose over")
    p.add_argument("--top", type=common.positive, default=5, metavar="N",
                   help="best configs shown per (device, kernel, shape)")
    p.add_argument("--wide", action="store_true",
                   help="full fingerprints, config keys and who measured each row (lines may pass 80 columns)")
    p.add_argument("--portable", action="store_true",
                   help="per shape and row range, the config with the best worst-case ratio to each device's "
                        "own best, over every device the store holds")
    p.add_argument("--tolerance", type=common.float_in(0.0, 1.0), default=0.03,
                   help="with --portable: accepted worst-case slowdown over the best portable choice")
    p.add_argument("--out", metavar="FILE", type=lambda t: common.output_file(t, "--out"),
                   help="with --portable: write the dispatch table (marked portable)")
    p.add_argument("--install", action="store_true",
                   help="with --portable: write one table per backend where the model runtime loads it on a device "
                        "that has no table of its own")
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

    if (args.out or args.install or args.tolerance != 0.03) and not args.portable:
        raise ConfigError("--out, --install and --tolerance apply to `tilewise report --portable`", "add --portable")
    if args.portable:
        return _portable(args)
    shape = args.shape.replace(",", "x").replace(" ", "") if args.shape else None
    with Store(args.store, readonly=True) as store:
        data = report_data(store, args.device_fingerprint, args.kernel, shape, args.top)
    common.emit_json(args.json, data, note=lambda text: print(text, file=sys.stderr))
    out = common.console(args, soft_wrap=True, highlight=False)
    for line in report_lines(data, args.wide):
        out.print(line, markup=False)
    return 0


def _portable(args: argparse.Namespace) -> int:
    import json

    from tilewise.tune.portable import portable_choice, portable_table
    from tilewise.tune.store import Store

    if args.shape:
        raise ConfigError("--portable takes every row count of a kernel's shapes, not one --shape", "drop --shape")
    fps = [f for f in args.device_fingerprint.split(",") if f] if args.device_fingerprint else None
    with Store(args.store, readonly=True) as store:
        stored = set(store.distinct("fingerprint"))
        unknown = [f for f in fps or () if f not in stored]
        if unknown:
            raise ConfigError(f"the store {store.path} holds no results of {', '.join(unknown)}",
                              "`tilewise report --wide` lists the stored fingerprints")
        choice = portable_choice(store.query(kernel=args.kernel, status="ok"), fps, args.tolerance)
    # every table is made before any file is written: a refused one leaves nothing half-written
    tables = {b: portable_table(choice, b) for b in choice["backends"]} if args.install else {}
    table = portable_table(choice) if args.out else None
    common.emit_json(args.json, choice, note=lambda text: print(text, file=sys.stderr))
    out = common.console(args, soft_wrap=True, highlight=False)
    for line in portable_lines(choice, args.wide):
        out.print(line, markup=False)
    if table is not None:
        common.write_atomic(args.out, json.dumps(table, indent=1))
        out.print(f"wrote {args.out} (a portable table)", markup=False)
    if tables:
        from tilewise.model.dispatch import portable_path

        for backend, t in tables.items():
            path = portable_path(backend)
            path.parent.mkdir(parents=True, exist_ok=True)
            common.write_atomic(path, json.dumps(t, indent=1))
            out.print(f"wrote {path}: {backend} devices without a table of their own run it", markup=False)
    return 0


def portable_lines(choice: dict[str, Any], wide: bool = False) -> list[str]:
    """Devices as d1, d2, ...; per problem, each range's kernel and config and its ratio on every device."""
    fit = (lambda s: s) if wide else (lambda s: _fit(s, WIDTH))
    tags = {fp: f"d{i + 1}" for i, fp in enumerate(choice["devices"])}
    lines = [f"portable choice over {len(tags)} device{'s' * (len(tags) != 1)} (ratio = time / that device's "
             "own best):"]
    lines += [fit(f"  {t}: {fp if wide else short_fingerprint(fp, WIDTH - 6)}") for fp, t in tags.items()]
    if choice.get("stale"):
        lines.append(fit(f"  left out: {choice['stale']} results measured on kernels that have changed since"))
    for g in choice["groups"]:
        lines += ["", fit(f"{g['key']} on {g['backend']} (rows {g['measured_m'][0]}..{g['measured_m'][-1]})")]
        for r in g["ranges"]:
            ratios = " ".join(f"{tags[fp]} {x:.2f}" for fp, x in r["ratio"].items())
            rows = f"{r['m_min']}..{r['m_max']}" if r["m_max"] else f"{r['m_min']}+"
            lines.append(fit(f"  M {rows}: worst {r['worst_ratio']:.2f} ({ratios})"))
            lines.append(fit(f"    {r['kernel']} {r['config_key']}"))
    return lines


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
                                               wide, [r.get("worker") for r in g["best"]])]
    return lines


def config_lines(medians_ms: list[float], keys: list[str], wide: bool = False,
                 workers: list[str | None] | None = None) -> list[str]:
    """`median_ms` and the config: full keys when `wide` (with the cluster worker that measured each, where one
    did) or the names differ between rows, else one header of names over aligned values."""
    pairs = [[tuple(p.split("=", 1)) if "=" in p else (p, "") for p in k.split(",") if p] for k in keys]
    names = [tuple(n for n, _ in p) for p in pairs]
    if wide or len(set(names)) != 1 or not names[0]:
        by = workers if wide and workers and any(workers) else [None] * len(keys)
        return ["    median_ms  config", *(f"    {m:>9.4f}  {k}" + (f"  (by {w})" if w else "")
                                          for m, k, w in zip(medians_ms, keys, by))]
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
