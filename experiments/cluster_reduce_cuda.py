"""Does summing split-K's slices inside a cluster (SR 2) make the decision faster? (CUDA, one model) And, with
`--twin dec`, does the pair-table decode (DEC 2, 3)?

The tune times every candidate alone: SR 0 with its reduction launch, SR 2 as one launch. In a decision SR 0's
reduction is fused with the next matmul's prologue (`fuse_preps`), while after SR 2 that prologue stays a launch of
its own, so the tune's pick per shape does not settle the decision. This takes the device's tuned dispatch table
(the one `tilewise.load` would use, or `--table`), makes a twin in which every config with SR 2 (wgr, splitk) has
SR 0, and races whole decisions on the two. Both sum the slices in the same order, so their scores must be
bit-identical: a nonzero difference is a bug.

`--twin dec` makes the twin's wgr configs with DEC 2 or 3 (one shared-memory load of a stored byte's two codes)
DEC 1 (the code table in registers) instead: a kernel timed alone has the SM to itself, in a decision the next
launch's blocks may share it, so the per-shape pick is checked on whole decisions. Both decodes round alike: the
scores must be bit-identical here too.

    PYTHONPATH=src python3 experiments/cluster_reduce_cuda.py [--preset lfm2-350m] [--seq 346] [--twin sr|dec]
        [--out DIR]
"""

from __future__ import annotations

import argparse
import json

from tilewise.devices import get_device
from tilewise.model.bench import PREFIX_TOKENS, prompts, race_args, race_lines, race_pair, verdict_text, write_race
from tilewise.model.cuda import CUDAExecutor
from tilewise.model.runtime import open_checkpoint
from tilewise.model.tune import model_config
from tilewise.tune.dispatch import DispatchTable, load_table

#: per twin: the parameter, the values the twin replaces, the value it puts in their place, the two sides' names
TWINS = {"sr": ("SR", (2,), 0, ("cluster", "reduction")), "dec": ("DEC", (2, 3), 1, ("pairs", "registers"))}


def twin_table(table: DispatchTable, param: str, values: tuple[int, ...], to: int) -> tuple[DispatchTable, list[str]]:
    """`table` with every config whose `param` is one of `values` given `to` instead, and the keys of the entries
    that changed."""
    doc = json.loads(json.dumps(table.to_json()))  # a copy: to_json shares the entries' range dicts
    changed = []
    for key, entry in doc["entries"].items():
        for r in entry["ranges"]:
            if r["config"].get(param) in values:
                r["config"] = {**r["config"], param: to}
                changed.append(key)
    return DispatchTable.from_json(doc), sorted(set(changed))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    race_args(ap, "lfm2-350m", 346, "table")
    ap.add_argument("--table", help="dispatch table JSON (default: the device's, as `tilewise.load` finds it)")
    ap.add_argument("--twin", choices=sorted(TWINS), default="sr",
                    help="sr: SR 2 against SR 0 (default); dec: DEC 2 and 3 against DEC 1")
    ap.add_argument("--out", help="folder for cluster_reduce.json (decode_race.json with --twin dec)")
    args = ap.parse_args()
    param, values, to, (tuned_name, twin_name) = TWINS[args.twin]
    dev = get_device(args.device)
    cfg = model_config(args.preset)
    ck = open_checkpoint(args.preset, weights="nf4")
    tuned = CUDAExecutor(ck, device=dev, dispatch=load_table(args.table) if args.table else None, quiet=True)
    twin, changed = twin_table(tuned.dispatch, param, values, to)
    picked = " or ".join(f"{param} {v}" for v in values)
    if not changed:
        print(f"no entry of the table picks {picked} at any row count: nothing to race ({dev.info.name})")
        return 0
    executors = {tuned_name: tuned, twin_name: CUDAExecutor(ck, device=dev, dispatch=twin, quiet=True)}
    for ex in executors.values():  # the fold (where the table turns it on) would fold after the clusters only,
        # changing that side's launches and rounding: the twin's parameter alone here
        ex.fold_norm = False
    _, full = prompts(cfg.vocab_size, args.seq, 40, PREFIX_TOKENS, seed=3)
    r = race_pair(executors, full, args.rounds, args.per_round, twin_name, tuned_name,
                  (f"{param} {to} twin", f"table as tuned ({picked})"))
    print(f"{dev.info.name} [{dev.info.fingerprint}]: {args.preset}, {args.seq} rows; {picked} in: "
          f"{', '.join(changed)}")
    print("\n".join(r.op_lines))
    print("\n".join(race_lines(r.samples)))
    print(f"{tuned_name} over {twin_name}: {verdict_text(r.verdict)}; max |score difference| {r.diff:.2e}"
          + ("" if r.diff == 0.0 else "  <-- NOT bit-identical"))
    write_race(args.out, "cluster_reduce.json" if args.twin == "sr" else "decode_race.json",
               "experiments/cluster_reduce_cuda.py", dev, args.preset, args.seq, r.samples, r.stats, changed=changed,
               ops=r.ops, max_abs_score_diff=r.diff, verdict=r.verdict.verdict, speedup=r.verdict.ratio,
               note=r.verdict.note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
