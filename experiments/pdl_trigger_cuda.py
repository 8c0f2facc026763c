"""Where should a kernel let the next launch start? (CUDA, one model, whole decisions)

Every model kernel calls PDL_BEGIN(): it waits for the launch before (griddepcontrol.wait). With PDL_EARLY_TRIGGER
1 (kernels/pdl.cuh) it then at once lets the next launch's blocks become resident (griddepcontrol.launch_dependents);
with 0, the kernels as they are, the next launch is let in as this one's blocks exit. Where a grid needs more than
one wave, early blocks of the next launch hold shared memory, registers and warp slots while they wait, which the
grid's later waves need; where it fits one wave they cost nothing and start their pre-wait work early. This races
whole decisions (graph replays) on the device's tuned table in three modes:

    off     PDL off
    start   PDL on, the next launch triggered right after the wait (the kernels' text edited before NVRTC:
            PDL_EARLY_TRIGGER 1)
    exit    PDL on, no explicit trigger: the next launch starts as this one's blocks exit (the kernels as they are)

All three run the same kernels in the same order, so their scores must be bit-identical.

    PYTHONPATH=src python3 experiments/pdl_trigger_cuda.py [--preset default] [--seq 348] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tilewise.kernels.cudasrc as cudasrc
from cuda_sources import model_sources
from tilewise.devices import get_device
from tilewise.model.bench import (
    PREFIX_TOKENS,
    prompts,
    race_args,
    race_executors,
    race_lines,
    race_verdict,
    verdict_record,
    verdict_text,
    write_race,
)
from tilewise.model.cuda import CUDAExecutor
from tilewise.model.runtime import open_checkpoint
from tilewise.tune.measure import summarize

MODES = ("off", "start", "exit")
#: pdl.cuh's switch of the early trigger (checked to occur once) and its edit
TRIGGER, EARLY = "#define PDL_EARLY_TRIGGER 0\n", "#define PDL_EARLY_TRIGGER 1\n"


def early_trigger(real):
    """`model_source` with PDL_BEGIN() triggering the next launch right after its wait."""

    def source(family: str, *files: str) -> str:
        text = real(family, *files)
        if text.count(TRIGGER) != 1:
            raise SystemExit(f"pdl.cuh's trigger line occurs {text.count(TRIGGER)} times in {family}'s source")
        return text.replace(TRIGGER, EARLY)

    return source


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    race_args(ap, "default", 348, "mode")
    ap.add_argument("--out", help="folder for pdl_trigger.json")
    args = ap.parse_args()
    dev = get_device(args.device)
    if not getattr(dev, "pdl", False):
        print(f"{dev.info.name} has no programmatic dependent launch: nothing to race")
        return 0
    ck = open_checkpoint(args.preset, weights="nf4")
    _, full = prompts(ck.config.vocab_size, args.seq, 40, PREFIX_TOKENS, seed=3)
    executors = {}
    for mode in MODES:  # each compiles its kernels at its first decision: `start` with the edited text
        edit = model_sources(early_trigger(cudasrc.model_source)) if mode == "start" else contextlib.nullcontext()
        with edit:
            ex = CUDAExecutor(ck, device=dev, quiet=True, pdl=mode != "off")
            ex.forward(full[0], 0, None, True)
        executors[mode] = ex
    samples, diff = race_executors(executors, full, args.rounds, args.per_round)
    stats = {m: summarize(v) for m, v in samples.items()}
    print(f"{dev.info.name} [{dev.info.fingerprint}]: {args.preset}, {args.seq} rows; the table's other settings: "
          f"{executors['exit'].measured_settings or 'none raced'}")
    print("\n".join(race_lines(samples, "decision, PDL ")))
    verdicts = {f"{a} over {b}": race_verdict(samples, args.per_round, b, a, (b, a)) for a, b in
                (("start", "off"), ("exit", "off"), ("exit", "start"))}
    for name, v in verdicts.items():
        print(f"{name}: {verdict_text(v)}")
    print(f"max |score difference| {diff:.2e}" + ("" if diff == 0.0 else "  <-- NOT bit-identical"))
    write_race(args.out, "pdl_trigger.json", "experiments/pdl_trigger_cuda.py", dev, args.preset, args.seq, samples,
               stats, max_abs_score_diff=diff,
               verdicts={k: verdict_record(v) for k, v in verdicts.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
