"""How much do the blocks after the last attention block save when they run on the few rows the last row reaches
back to? (any executor, one model, whole decisions)

Final-row slicing (`runtime.block_rows`) used to cut the last block only: its mixer's output projection and FFN ran
on one row, every other block on every row. It now cuts every block after the last attention block to the rows the
convolutions after it reach back to (lfm2-350m: the last attention block's output projection, FFN and attention
queries on 3 rows instead of 346). This races the two plans on one device (its tuned table), in alternating rounds of
whole decisions on the same prompts (graph replays on CUDA):

    last    the old plan: only the last block sliced (its conv in_proj on the last conv_L_cache rows)
    tail    the plan as it is

The two run different kernels on the tail's rows (the table's configs at 3 rows, not at 346), so their outputs agree
within the f16 tolerance (float32 rounding on the CPU), not bit for bit; the largest difference of the last row's
normed hidden state (every value of it) is printed.

    PYTHONPATH=src python3 experiments/tail_slicing.py [--device cuda] [--preset lfm2-350m] [--seq 346] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from tilewise.devices import get_device
from tilewise.model import runtime
from tilewise.model.bench import (
    PREFIX_TOKENS,
    prompts,
    race_args,
    race_lines,
    race_modes,
    race_verdict,
    verdict_record,
    verdict_text,
    write_race,
)
from tilewise.model.runtime import BlockRows, open_checkpoint
from tilewise.tune.measure import summarize

MODES = ("last", "tail")


def last_block_only(layer_types, conv_L: int, n: int, final_row_slicing: bool) -> list[BlockRows]:
    """The row plan before the tail was sliced: every block whole, the last one on one row."""
    plan = [BlockRows(n, n) for _ in layer_types]
    if final_row_slicing:
        plan[-1] = BlockRows(min(n, conv_L) if layer_types[-1] == "conv" else n, 1)
    return plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    race_args(ap, "lfm2-350m", 346, "plan")
    ap.add_argument("--weights", default="nf4", help="weight format")
    ap.add_argument("--out", help="folder for tail_slicing.json")
    args = ap.parse_args()
    dev = get_device(args.device)
    ck = open_checkpoint(args.preset, weights=args.weights)
    cfg = ck.config
    _, full = prompts(cfg.vocab_size, args.seq, 40, PREFIX_TOKENS, seed=4)
    sliced = runtime.block_rows(cfg.layer_types, cfg.conv_L_cache, args.seq, True)
    print(f"{args.preset}, {args.seq} rows: blocks' (inputs, outputs) where sliced: "
          f"{[(i, b.inputs, b.outputs) for i, b in enumerate(sliced) if b.outputs < args.seq]}")
    executors = {mode: runtime.EXECUTORS[dev.info.backend](ck, dev, quiet=True) for mode in MODES}
    module = sys.modules[type(executors["tail"]).__module__]
    real = module.block_rows

    def forward(mode: str, ids) -> np.ndarray:
        """The mode's decision: the GPU executors keep the plan of their first call, the CPU plans every call."""
        module.block_rows = last_block_only if mode == "last" else real
        try:
            return executors[mode].forward(ids, 0, None, True)[0]
        finally:
            module.block_rows = real

    diff = max(float(np.abs(forward("last", ids) - forward("tail", ids)).max()) for ids in full[:8])
    current = {"mode": "tail"}
    samples = race_modes(lambda i: forward(current["mode"], full[i % len(full)]), lambda m: current.update(mode=m),
                         list(MODES), args.rounds, args.per_round)
    stats = {m: summarize(v) for m, v in samples.items()}
    print(f"{dev.info.name} [{dev.info.fingerprint}]: {args.preset} ({args.weights}), {args.seq} rows")
    print("\n".join(race_lines(samples, "decision, slicing ")))
    verdict = race_verdict(samples, args.per_round, "last", "tail", ("the last block sliced", "the tail sliced"))
    print(f"tail over last: {verdict_text(verdict)}")
    print(f"max |difference| of the normed last hidden state over 8 prompts: {diff:.2e}")
    write_race(args.out, "tail_slicing.json", "experiments/tail_slicing.py", dev, args.preset, args.seq, samples,
               stats, max_abs_hidden_diff=diff,
               verdict=verdict_record(verdict))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
