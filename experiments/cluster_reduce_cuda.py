"""Does summing split-K's slices inside a cluster (SR 2) make the decision faster? (CUDA, one model)

The tune times every candidate alone: SR 0 with its reduction launch, SR 2 as one launch. In a decision SR 0's
reduction is fused with the next matmul's prologue (`fuse_preps`), while after SR 2 that prologue stays a launch of
its own, so the tune's pick per shape does not settle the decision. This takes the device's tuned dispatch table
(the one `tilewise.load` would use, or `--table`), makes a twin in which every config with SR 2 (wgr, splitk) has
SR 0, and races whole decisions on the two. Both sum the slices in the same order, so their scores must be
bit-identical: a nonzero difference is a bug.

    PYTHONPATH=src python3 experiments/cluster_reduce_cuda.py [--preset lfm2-350m] [--seq 346] [--out DIR]
"""

from __future__ import annotations

import argparse
import json

from tilewise.devices import get_device
from tilewise.model.bench import PREFIX_TOKENS, op_columns, prompts, race_args, race_executors, race_lines, write_race
from tilewise.model.cuda import CUDAExecutor
from tilewise.model.runtime import open_checkpoint
from tilewise.model.tune import model_config
from tilewise.tune.dispatch import DispatchTable, load_table
from tilewise.tune.measure import compare, summarize

MODES = ("cluster", "reduction")  # the table as tuned (SR 2 where it won), and its SR 0 twin


def without_clusters(table: DispatchTable) -> tuple[DispatchTable, list[str]]:
    """`table` with every SR 2 config (wgr, splitk) made SR 0, and the keys of the entries that changed."""
    doc = json.loads(json.dumps(table.to_json()))  # a copy: to_json shares the entries' range dicts
    changed = []
    for key, entry in doc["entries"].items():
        for r in entry["ranges"]:
            if r["config"].get("SR") == 2:
                r["config"] = {**r["config"], "SR": 0}
                changed.append(key)
    return DispatchTable.from_json(doc), sorted(set(changed))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    race_args(ap, "lfm2-350m", 346, "table")
    ap.add_argument("--table", help="dispatch table JSON (default: the device's, as `tilewise.load` finds it)")
    ap.add_argument("--out", help="folder for cluster_reduce.json")
    args = ap.parse_args()
    dev = get_device(args.device)
    cfg = model_config(args.preset)
    ck = open_checkpoint(args.preset, weights="nf4")
    tuned = CUDAExecutor(ck, device=dev, dispatch=load_table(args.table) if args.table else None, quiet=True)
    twin, changed = without_clusters(tuned.dispatch)
    if not changed:
        print(f"no entry of the table picks SR 2 at any row count: nothing to race ({dev.info.name})")
        return 0
    executors = {"cluster": tuned, "reduction": CUDAExecutor(ck, device=dev, dispatch=twin, quiet=True)}
    for ex in executors.values():  # the fold (where the table turns it on) would fold after the clusters only,
        # changing that side's launches and rounding: SR 2 alone here
        ex.fold_norm = False
    _, full = prompts(cfg.vocab_size, args.seq, 40, PREFIX_TOKENS, seed=3)
    samples, diff = race_executors(executors, full, args.rounds, args.per_round)
    stats = {m: summarize(v) for m, v in samples.items()}
    verdict = compare(stats["reduction"], stats["cluster"], ("SR 0 twin", "table as tuned (SR 2)"))
    ops, lines = op_columns(executors, full[0])
    print(f"{dev.info.name} [{dev.info.fingerprint}]: {args.preset}, {args.seq} rows; SR 2 in: {', '.join(changed)}")
    print("\n".join(lines))
    print("\n".join(race_lines(samples)))
    note = f"; {verdict.note}" if verdict.note else ""
    print(f"cluster over reduction: {verdict.verdict} ({verdict.ratio:.3f}x{note}); max |score difference| {diff:.2e}"
          + ("" if diff == 0.0 else "  <-- NOT bit-identical"))
    write_race(args.out, "cluster_reduce.json", "experiments/cluster_reduce_cuda.py", dev, args.preset, args.seq,
               samples, stats, changed=changed, ops=ops, max_abs_score_diff=diff, verdict=verdict.verdict,
               speedup=verdict.ratio, note=verdict.note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
