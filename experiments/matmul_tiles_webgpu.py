"""Tile shapes fitted to the decision length against the tuner's usual candidates, per matmul of a model, one run.

    PYTHONPATH=src python3 experiments/matmul_tiles_webgpu.py --preset lfm2-350m --seq 346 --out OUT/tiles

The tuner's candidates (`tilewise tune model`: the hand-picked seeds plus a seeded random sample) use tiles of
16-256 rows and columns in powers of two. A 346-row decision then pads: 128-row tiles compute 384 rows, and a
4608-column projection in 128x128 tiles is 108 workgroups, fewer than some GPUs have multiprocessors. This
experiment adds a family of tiles whose row count splits `seq` into 2, 3 or 4 blocks (346: 176, 120, 88 rows)
and column counts of 48-192 (not only powers of two), with f16 arithmetic where the adapter has shader-f16,
samples `--sample` of them per kernel, and times them next to the usual candidates at the decision's row
counts: every candidate verified against the float64 reference first, all timed interleaved with GPU
timestamps (`tune_matmul`, on the engine). It prints, per matmul, the fastest usual candidate, the fastest of
the family and their ratio, and the ten fastest overall; writes OUT/tiles.json (with the fitted row tiles) and
OUT/tiles.md. A tilewise-against-tilewise study, not a peer race: it lives in experiments/, not bench/.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from study_record import finish, header, save_op

FAMILY_COLS = (48, 64, 72, 96, 128, 192)
TABLE_NOTE = ("; the ratio is usual best time / family best time (>1: a fitted tile is faster). Medians of "
              "interleaved GPU-timestamp rounds.")
FAMILY_THREADS = (64, 512)  # workgroup sizes kept (fewer: not one subgroup per multiprocessor partition)


def fitted_rows(seq: int) -> list[int]:
    """Row tiles (multiples of 8) that split `seq` rows into 2, 3 or 4 blocks, plus 64 and 128."""
    from tilewise.model.tune_seeds import fitted_rows as rows_for

    return sorted({rows_for(seq, j) for j in (2, 3, 4)} | {64, 128})


def family(template: Any, limits: Any, seq: int, n: int, k: int) -> list[Any]:
    """Legal tiled / split-K configs of the fitted family for one template and (N, K), prefetch on."""
    sp = template.space()
    out = []
    ks_values = sp.params.get("KS", [1])
    for bm in fitted_rows(seq):
        for bn in FAMILY_COLS:
            for tm, tn in ((8, 4), (4, 8), (8, 8)):
                for bk in (16, 32):
                    for ks in ks_values:
                        v = {"BM": bm, "BN": bn, "BK": bk, "TM": tm, "TN": tn, "F16S": template.f16_staging,
                             "PF": 1, "CL": "strided" if tn >= 8 else "block", "DB": 0, "UK": 0}
                        if template.f16_arith:
                            v["F16A"] = True
                        if template.kind == "splitk":
                            v["KS"] = ks
                        c = sp.config(v)
                        threads = (bm // tm) * (bn // tn) if bm % tm == 0 and bn % tn == 0 else 0
                        if (FAMILY_THREADS[0] <= threads <= FAMILY_THREADS[1] and sp.is_legal(c, limits)
                                and not template.shape_problems(c, (seq, n, k))):
                            out.append(c)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="lfm2-350m", help="model preset (shapes only; weights are random)")
    ap.add_argument("--seq", type=int, default=346, help="decision length: the row count the family is fitted to")
    ap.add_argument("--rows", type=int, nargs="*", help="row counts to time (default: seq and seq - 47)")
    ap.add_argument("--sample", type=int, default=100, help="family configs per kernel and shape (seeded sample)")
    ap.add_argument("--tune-candidates", type=int, default=6, help="random configs in the usual set, as the tuner")
    ap.add_argument("--ops", nargs="*", help="matmul labels to run (default: all of the model)")
    ap.add_argument("--no-f16-arith", action="store_true", help="f32 arithmetic templates even with shader-f16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("tiles-out"), help="folder for tiles.json and tiles.md")
    args = ap.parse_args(argv)

    import tilewise
    from tilewise.kernels.space import Config
    from tilewise.model.config import preset
    from tilewise.model.tune import candidates, model_matmuls, tune_matmul

    cfg = preset(args.preset)
    dev = tilewise.get_device("webgpu")
    f16a = not args.no_f16_arith and "shader-f16" in dev.enabled_features
    rows = sorted(set(args.rows or [args.seq, max(1, args.seq - 47)]))
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    log(f"{dev.info.name} [{dev.info.fingerprint}]; {cfg.name}; rows {rows}; f16 arithmetic {f16a}; "
        f"fitted row tiles {fitted_rows(args.seq)}")
    args.out.mkdir(parents=True, exist_ok=True)
    ops = model_matmuls(cfg)
    report = header(dev, cfg.name, seq=args.seq, rows=rows, fitted_rows=fitted_rows(args.seq), f16_arith=f16a)
    lines = [f"# Fitted tiles vs the tuner's candidates: {cfg.name}, rows {rows}, {dev.info.name}", "",
             "| op | N x K | rows | usual best ms | usual best | family best ms | family best | usual/family |",
             "|---|---|---|---|---|---|---|---|"]
    for label, (epilogue, n, k, norm) in ops.items():
        if args.ops and label not in args.ops:
            continue
        usual: set[str] = set()
        fam: set[str] = set()
        rng = np.random.default_rng(args.seed)

        def configs(t: Any, n: int = n, k: int = k, rng: np.random.Generator = rng,
                    usual: set[str] = usual, fam: set[str] = fam) -> list[Any]:
            # the arithmetic the tuner would pick for this device only: f16a templates with shader-f16
            if t.kind == "rows" or t.f16_arith != f16a:
                return []
            base = candidates(t, dev.info.limits, args.tune_candidates, args.seed)
            extra = [c for c in family(t, dev.info.limits, args.seq, n, k) if c not in base]
            if len(extra) > args.sample:
                extra = [extra[i] for i in sorted(rng.choice(len(extra), args.sample, replace=False))]
            usual.update(Config((("kind", t.kind), *c.items())).key() for c in base)
            fam.update(Config((("kind", t.kind), *c.items())).key() for c in extra)
            return base + extra

        log(f"{label} ({epilogue}, N={n}, K={k})")
        _, record = tune_matmul(dev, "nf4", epilogue, n, k, rows, args.tune_candidates, args.seed, log,
                                f16_arith=f16a, norm=norm, eps=cfg.norm_eps, configs=configs, keep_times=True)
        times = record["times_ms"]
        entry: dict[str, Any] = {"N": n, "K": k, "epilogue": epilogue, "norm": norm, "failures": record["failures"],
                                 "times_ms": times, "usual": sorted(usual & set(times)),
                                 "family": sorted(fam & set(times)), "best": {}}
        for m in rows:
            ub = min((c for c in times if c in usual), key=lambda c: times[c][m])
            fb = min((c for c in times if c in fam), key=lambda c: times[c][m], default=None)
            entry["best"][m] = {"usual": ub, "usual_ms": times[ub][m], "family": fb,
                                "family_ms": times[fb][m] if fb else None}
            ratio = f"{times[ub][m] / times[fb][m]:.3f}x" if fb else "-"
            lines.append(f"| {label} | {n}x{k} | {m} | {times[ub][m]:.4f} | {ub} | "
                         f"{times[fb][m]:.4f} | {fb} | {ratio} |" if fb else
                         f"| {label} | {n}x{k} | {m} | {times[ub][m]:.4f} | {ub} | - | - | - |")
            top = sorted(times, key=lambda c: times[c][m])[:10]
            log(f"  rows {m}: usual best {times[ub][m]:.4f} ms ({ub}); family best "
                f"{times[fb][m]:.4f} ms ({fb}); ratio {ratio}" if fb else f"  rows {m}: no family config ran")
            for i, c in enumerate(top):
                log(f"    {i + 1:2d}. {times[c][m]:.4f} ms {'family' if c in fam else 'usual '} {c}")
        log(f"  {len(times)} candidates timed ({len(entry['usual'])} usual, {len(entry['family'])} family); "
            f"{len(record['failures'])} refused or failed; seconds {record['seconds']}")
        save_op(args.out / "tiles.json", report, label, entry)
    finish(args.out / "tiles.md", lines, report, TABLE_NOTE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
