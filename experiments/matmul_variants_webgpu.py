"""One kernel parameter's values side by side on the fastest configs of an earlier run, per matmul of a model.

    PYTHONPATH=src python3 experiments/matmul_variants_webgpu.py --from bench/results/matmul_tiles/X-tiles.json \
        --param UK=0,1 --top 8 --out OUT/variants

Takes each matmul kernel's `--top` fastest configs at the decision length from an `experiments/matmul_tiles_webgpu.py`
record, sets `--param` to each of its values on every one of them, and verifies (float64 reference, every output
value) and times them all interleaved at the decision's row counts with GPU timestamps (`tune_matmul`, on the
engine): the same tile with and without the change, in one run. Prints per config the time of each value and the
ratio to the first value, and per matmul best against best; writes OUT/variants.json and OUT/variants.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from study_record import finish, header, save_op

TABLE_NOTE = (". Ratio: baseline time / variant time (>1: the variant is faster). Medians of interleaved "
              "GPU-timestamp rounds; every config verified first.")


def parse_param(text: str) -> tuple[str, list[Any]]:
    """`NAME=V1,V2,...` -> (NAME, values as int where they are numbers)."""
    name, _, vals = text.partition("=")
    if not name or not vals:
        raise SystemExit(f"--param {text!r}: write NAME=V1,V2 (e.g. UK=0,1)")
    return name, [int(v) if v.lstrip("-").isdigit() else v for v in vals.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="source", type=Path, required=True, help="tiles.json of matmul_tiles_webgpu.py")
    ap.add_argument("--param", required=True, help="NAME=V1,V2: the parameter and its values (first = baseline)")
    ap.add_argument("--top", type=int, default=8, help="fastest configs per matmul taken from the record")
    ap.add_argument("--rows", type=int, nargs="*", help="row counts to time (default: the record's)")
    ap.add_argument("--ops", nargs="*", help="matmul labels to run (default: all in the record)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("variants-out"), help="folder for variants.json and .md")
    args = ap.parse_args(argv)

    import tilewise
    from tilewise.kernels.space import Config
    from tilewise.model.config import preset
    from tilewise.model.tune import model_matmuls, tune_matmul

    rec = json.loads(args.source.read_text())
    name, values = parse_param(args.param)
    cfg = preset(rec["preset"])
    seq = int(rec["seq"])
    rows = sorted(set(args.rows or rec["rows"]))
    dev = tilewise.get_device("webgpu")
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    log(f"{dev.info.name}; {cfg.name}; {name} in {values}; top {args.top} of {args.source.name} at {seq} rows")
    args.out.mkdir(parents=True, exist_ok=True)
    report = header(dev, cfg.name, seq=seq, rows=rows, param=name, values=values, source=args.source.name)
    lines = [f"# {name} = {values} on the {args.top} fastest configs per matmul: {cfg.name}, rows {rows}, "
             f"{dev.info.name}", "",
             "| op | rows | config (baseline value) | " + " | ".join(f"{name}={v} ms" for v in values) + " | "
             + " | ".join(f"{values[0]}/{v}" for v in values[1:]) + " |",
             "|---|---|---|" + "---|" * (2 * len(values) - 1)]
    shapes = model_matmuls(cfg)
    for label, entry in rec["ops"].items():
        if (args.ops and label not in args.ops) or label not in shapes:
            continue
        epilogue, n, k, norm = shapes[label]
        times0 = entry["times_ms"]
        # fastest first; per kernel, the first --top configs that take every value of the parameter (the short-row
        # kernel has no UK, a 4-column thread tile no strided layout) are the baselines
        ranked = sorted(times0, key=lambda c: times0[c][str(seq)])
        pairs: list[list[str]] = []  # per base config, the tagged keys of its configs with each value, in order

        def configs(t: Any, ranked: list[str] = ranked, pairs: list[list[str]] = pairs) -> list[Any]:
            sp = t.space()
            out: list[Any] = []
            taken = 0
            for key in ranked:
                if taken >= args.top:
                    break
                kind, _, rest = key.partition(",")
                given = dict(part.split("=", 1) for part in rest.split(","))
                if kind != f"kind={t.kind}" or not set(given) <= set(sp.params):
                    continue
                # keys the record predates (a parameter added since) take the space's first value
                base = sp.parse(",".join(f"{kk}={given.get(kk, vals[0])}" for kk, vals in sp.params.items()))
                if base.get("F16A", False) != t.f16_arith or base["F16S"] != t.f16_staging:
                    continue
                row = [base.replace(**{name: v}) for v in values]
                keys = [Config((("kind", t.kind), *c.items())).key() for c in row]
                if keys not in pairs and all(sp.is_legal(c, dev.info.limits) for c in row):
                    out += [c for c in row if c not in out]
                    pairs.append(keys)
                    taken += 1
            return out

        log(f"{label} ({epilogue}, N={n}, K={k}): per kernel the {args.top} fastest configs that take every value, "
            f"x {len(values)} values")
        _, record = tune_matmul(dev, "nf4", epilogue, n, k, rows, 0, args.seed, log, f16_arith=True, norm=norm,
                                eps=cfg.norm_eps, configs=configs, keep_times=True)
        times = record["times_ms"]
        pairs[:] = [row for row in pairs if all(r in times for r in row)]  # both ways verified and timed
        op_out: dict[str, Any] = {"N": n, "K": k, "times_ms": times, "failures": record["failures"], "best": {}}
        for m in rows:
            for row in sorted(pairs, key=lambda r: times[r[0]][m]):
                ms = [times[r][m] for r in row]
                lines.append(f"| {label} | {m} | {row[0]} | " + " | ".join(f"{x:.4f}" for x in ms) + " | "
                             + " | ".join(f"{ms[0] / x:.3f}x" for x in ms[1:]) + " |")
            best = {str(v): min((times[r[i]][m] for r in pairs), default=None) for i, v in enumerate(values)}
            op_out["best"][m] = best
            b0 = best[str(values[0])]
            log(f"  rows {m}: best per value " + ", ".join(f"{name}={v}: {best[str(v)]:.4f} ms" for v in values)
                + "; " + ", ".join(f"{values[0]}/{v} {b0 / best[str(v)]:.3f}x" for v in values[1:]))
        log(f"  {len(pairs)} configs timed with every value; {len(record['failures'])} refused or failed")
        save_op(args.out / "variants.json", report, label, op_out)
    finish(args.out / "variants.md", lines, report, TABLE_NOTE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
