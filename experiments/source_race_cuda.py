"""Is the working tree's CUDA kernel text faster than another commit's? Whole decisions (graph replays) of two
executors in one process, one compiled from the model kernels' files as commit `--base` had them (read through git),
one from the tree's, raced in alternating rounds (`model.bench.race_pair`) so that the machine's drift and clocks hit
both alike. Separate runs of the same code can differ by more than a kernel change is worth; alternating rounds in
one process are what the settings races use for the same reason.

Both executors take the device's dispatch table (the tree's kernel versions) and its settings; a base whose kernels
lack a config the table names fails to compile and says so. Every decision of the base runs with the base text in
place, so a plan built later compiles from it too. Printed: each side's p50/p90/p99, the verdict with its
confidence, the largest |score difference| (0 where the change keeps the bits) and the GPU time per op.

    PYTHONPATH=src python3 experiments/source_race_cuda.py --base e6e2e68 [--preset lfm2-350m --seq 346] [--out DIR]
    PYTHONPATH=src python3 experiments/source_race_cuda.py --base-dir OTHER/src/tilewise/kernels
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
sys.path.insert(0, str(ROOT / "src"))

import tilewise.kernels.cudasrc as cudasrc  # noqa: E402
from cuda_sources import model_sources, source_at, source_in, source_users  # noqa: E402
from tilewise.devices import get_device  # noqa: E402
from tilewise.model.bench import PREFIX_TOKENS, prompts, race_args, race_pair, report_pair  # noqa: E402
from tilewise.model.cuda import CUDAExecutor  # noqa: E402
from tilewise.model.runtime import open_checkpoint  # noqa: E402


class WithSource:
    """An executor whose every decision runs with `source` as the kernels' text (so any plan it builds, at any
    decision, compiles from it). Both sides of the race are wrapped, the tree's with its own text, so that the
    patching costs them alike; the patched modules are found once."""

    def __init__(self, ex: Any, source: Any) -> None:
        self.ex, self.source, self.users = ex, source, source_users()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with model_sources(self.source, self.users):
            return self.ex.forward(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ex, name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    race_args(ap, "lfm2-350m", 346, "side")
    base_from = ap.add_mutually_exclusive_group(required=True)
    base_from.add_argument("--base", help="the commit whose kernel files the tree is raced against (read with git)")
    base_from.add_argument("--base-dir", help="a copy of another tree's src/tilewise/kernels folder, raced instead")
    ap.add_argument("--out", help="folder for source_race.json")
    args = ap.parse_args()
    args.base = args.base or f"base ({Path(args.base_dir).name})"
    dev = get_device(args.device)
    ck = open_checkpoint(args.preset, weights="nf4")
    _, full = prompts(ck.config.vocab_size, args.seq, 40, PREFIX_TOKENS, seed=3)
    source = source_in(args.base_dir) if args.base_dir else source_at(args.base)
    base = WithSource(CUDAExecutor(ck, device=dev, quiet=True), source)
    tree = WithSource(CUDAExecutor(ck, device=dev, quiet=True), cudasrc.model_source)
    for ex in (base, tree):  # each compiles its kernels at its first decision
        ex.forward(full[0], 0, None, True)
    sides = {args.base: base, "tree": tree}
    race = race_pair(sides, full, args.rounds, args.per_round, args.base, "tree", (args.base, "tree"))
    print(f"{dev.info.name} [{dev.info.fingerprint}]: {args.preset}, {args.seq} rows; settings "
          f"{tree.measured_settings or 'none raced'}; the kernels at {args.base} against the tree's")
    report_pair(race, f"tree over {args.base}", args, dev, "source_race.json", "experiments/source_race_cuda.py",
                base=args.base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
