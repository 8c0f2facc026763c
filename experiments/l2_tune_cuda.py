"""Does the tuner's cold L2 pick the kernels that decide fastest? (CUDA, one model, one call)

`CUDADevice.time` evicts L2 before every sample (`flush_l2`), so a tune times each kernel with its weights and its
input rows in device memory. In a decision the input rows were written by the kernel before, so they are in L2,
and a model whose weights fit in L2 (the bundled model's NF4 weights take a few MB of the H200's 60 MB) reads those
from L2 too. If the two conditions rank configs differently, the table the tuner writes is not the fastest one.

This tunes the model twice on one device with the store off, L2 evicted before every sample (the tuner's default)
and kept, then:
    picks     each op whose pick differs at the decision's rows, with both tunes' medians
    race      decisions on the two tables in alternating rounds (`race_modes`), graph replays as `play` runs them
    ops       each op label's GPU time on both tables (launch by launch, L2 kept, as in a decision)
    scores    the largest score difference between the two tables over the same prompts (different kernels, so a
              small one is expected; a large one is a wrong kernel)

    PYTHONPATH=src python3 experiments/l2_tune_cuda.py --out OUT_DIR [--preset default] [--seq 348] [--budget 8]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

from tilewise.devices import get_device
from tilewise.model.bench import PREFIX_TOKENS, percentiles, prompts, race_args, race_pair, verdict_text
from tilewise.model.cuda import CUDAExecutor
from tilewise.model.runtime import open_checkpoint
from tilewise.model.tune import model_config, tune_model

MODES = ("cold", "warm")  # L2 evicted before each sample (the tuner's default), or kept


def picks(tables: dict[str, Any], m: int) -> list[dict[str, Any]]:
    """Each entry's pick at `m` rows in both tables, with each tune's median there where it measured `m`."""
    out = []
    for key in sorted(set().union(*(t.entries for t in tables.values()))):
        row: dict[str, Any] = {"key": key}
        for mode, table in tables.items():
            picked = table.pick(key, m)
            entry = table.entries.get(key)
            per_m = getattr(entry, "per_m", None) or {}
            best = per_m.get(m) or per_m.get(str(m)) or {}
            row[mode] = {"kernel": picked[0] if picked else None, "config": picked[1] if picked else None,
                         "median_ms": best.get("median_ms") if isinstance(best, dict) else None}
        row["same"] = row["cold"]["kernel"] == row["warm"]["kernel"] and row["cold"]["config"] == row["warm"]["config"]
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for l2_tune.json and the two tables")
    race_args(ap, "default", 348, "table")
    ap.add_argument("--budget", type=int, default=8, help="candidates per kernel in each tune")
    ap.add_argument("--budget-s", type=float, default=120.0, help="seconds for each tune")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = get_device(args.device)
    cfg = model_config(args.preset)
    ck = open_checkpoint(args.preset, weights="nf4")
    tables: dict[str, Any] = {}
    tune_s: dict[str, float] = {}
    for mode in MODES:  # `l2=mode` sets the device's L2 condition for the tune and restores it after
        t0 = time.perf_counter()
        tables[mode] = tune_model(dev, cfg, seq=args.seq, rows=[1], budget=args.budget, budget_s=args.budget_s,
                                  path=out / f"dispatch-{mode}.json", store=None, force=True, l2=mode,
                                  log=lambda s, mode=mode: print(f"[{mode}] {s}", flush=True))
        tune_s[mode] = time.perf_counter() - t0
    executors = {mode: CUDAExecutor(ck, device=dev, dispatch=tables[mode], quiet=True) for mode in MODES}
    _, full = prompts(cfg.vocab_size, args.seq, 40, PREFIX_TOKENS, seed=3)
    r = race_pair(executors, full, args.rounds, args.per_round, "cold", "warm",
                  ("table tuned with L2 evicted", "table tuned with L2 kept"))
    samples, stats, verdict, diff, ops, op_lines = r
    rows = picks(tables, args.seq)
    print(f"{dev.info.name} [{dev.info.fingerprint}]: {args.preset}, {args.seq} rows, budget {args.budget}; tunes "
          + ", ".join(f"{m} {s:.1f} s" for m, s in tune_s.items()))
    print(f"{'op key':<34}{'cold pick (ms)':<44}{'warm pick (ms)':<44}")
    for r in rows:
        if r["same"]:
            continue
        cells = [f"{r[m]['kernel']} {r[m]['config']} ({r[m]['median_ms'] or float('nan'):.4f})" for m in MODES]
        print(f"{r['key']:<34}{cells[0]:<44}{cells[1]:<44}")
    print(f"{sum(r['same'] for r in rows)} of {len(rows)} entries pick the same kernel and config")
    print("\n".join(op_lines))
    for m in MODES:
        p = percentiles(samples[m])
        print(f"decision on the {m} table: p50 {p['p50']:.4f} ms, p90 {p['p90']:.4f}, p99 {p['p99']:.4f} "
              f"({p['n']} decisions)")
    print(f"warm over cold: {verdict_text(verdict)}; max |score difference| {diff:.2e}")
    argv = [("OUT_DIR" if a == str(out) else a) for a in sys.argv[1:]]
    doc = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "command": "python3 experiments/l2_tune_cuda.py " + " ".join(argv), "device": dev.info.as_dict(),
           "preset": args.preset, "seq": args.seq, "budget": args.budget, "tune_s": tune_s, "picks": rows, "ops": ops,
           "max_abs_score_diff": diff, "verdict": verdict.verdict, "speedup": verdict.ratio, "note": verdict.note,
           **{m: {**percentiles(v), "median_ci95_ms": list(stats[m].ci95_ms), "samples_ms": v}
              for m, v in samples.items()}}
    (out / "l2_tune.json").write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
