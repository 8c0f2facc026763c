"""Where does the norm fold win or lose? (CUDA, one model, whole decisions and op by op)

`fold_norm` drops the normed prologue launch between a residual matmul that sums in its own launch (wgr with KS 1
or SR 2, splitk with SR 2) and the next wgr matmul: the residual launch also writes f16 (h * g) rows and each row's
sums of squares, and the next matmul scales its outputs by 1 / rms(h). The tune races the setting on whole decisions
only, so a loss or tie there does not say which part costs: the heavier epilogues or the scaled consumer, against
the prologue launches saved. This races the device's tuned table with the fold on and off and
prints both decisions' GPU time per op and launches per op. The fold rounds differently: the scores agree within
the f16 tolerance, not in every bit.

    PYTHONPATH=src python3 experiments/fold_norm_cuda.py [--preset lfm2-350m] [--seq 346] [--out DIR]
"""

from __future__ import annotations

import argparse

import numpy as np

from tilewise.devices import get_device
from tilewise.model.bench import PREFIX_TOKENS, prompts, race_args, race_lines, race_pair, verdict_text, write_race
from tilewise.model.cuda import CUDAExecutor
from tilewise.model.runtime import open_checkpoint
from tilewise.tune.dispatch import load_table

MODES = ("fold", "plain")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    race_args(ap, "lfm2-350m", 346, "mode")
    ap.add_argument("--table", help="dispatch table JSON (default: the device's, as `tilewise.load` finds it)")
    ap.add_argument("--out", help="folder for fold_norm.json")
    args = ap.parse_args()
    dev = get_device(args.device)
    ck = open_checkpoint(args.preset, weights="nf4")
    table = load_table(args.table) if args.table else None
    executors = {m: CUDAExecutor(ck, device=dev, dispatch=table, quiet=True) for m in MODES}
    for m, ex in executors.items():
        ex.fold_norm = m == "fold"
    _, full = prompts(ck.config.vocab_size, args.seq, 40, PREFIX_TOKENS, seed=3)
    r = race_pair(executors, full, args.rounds, args.per_round, "plain", "fold", ("fold off", "fold on"))
    scale = max(float(np.abs(executors["plain"].forward(ids, 0, None, True)[1].scores).max()) for ids in full[:8])
    print(f"{dev.info.name} [{dev.info.fingerprint}]: {args.preset}, {args.seq} rows; "
          f"other settings: {executors['fold'].measured_settings or 'none raced'}")
    print("\n".join(r.op_lines))
    print("\n".join(race_lines(r.samples)))
    print(f"fold over plain: {verdict_text(r.verdict)}; max |score difference| {r.diff:.2e} "
          f"({r.diff / max(scale, 1.0):.1e} of the largest score)")
    write_race(args.out, "fold_norm.json", "experiments/fold_norm_cuda.py", dev, args.preset, args.seq, r.samples,
               r.stats, ops=r.ops, max_abs_score_diff=r.diff, verdict=r.verdict.verdict, speedup=r.verdict.ratio,
               note=r.verdict.note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
