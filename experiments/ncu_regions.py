"""Where a kernel's warps wait, by region: Nsight Compute's SASS-level warp-state samples of each profiled kernel,
split into the part before its main loop, the loop and the part after it.

An instruction is the loop's when it ran at least four times per warp (its "Instructions Executed" against the
kernel's first instruction's); any other instruction is the prologue's before the loop's first one and the
epilogue's after it.
Prints per region the samples (share of the kernel's), SASS lines, warp instructions and the top stall reasons.

    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > source.csv
    python3 experiments/ncu_regions.py source.csv [--names full,no-decode,no-mma]
"""
from __future__ import annotations

import argparse
import collections
import csv
import itertools
from pathlib import Path


def kernels(path: Path) -> list[list[list[str]]]:
    """The CSV's kernels, each as its header row and instruction rows (the file repeats a "Kernel Name" line)."""
    lines = path.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith('"Kernel Name"')] + [len(lines)]
    return [list(csv.reader(lines[a + 1:b])) for a, b in itertools.pairwise(starts)]


LOOP_TIMES = 4  # a K loop of a few steps; a prologue's copy loops run once or twice


def regions(rows: list[list[str]]) -> dict[str, collections.Counter]:
    head, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    col = {h: i for i, h in enumerate(head)}
    samples = col["Warp Stall Sampling (All Samples)"]
    stalls = [h for h in head if h.startswith("stall_") and "Not" not in h]
    executed = [int(r[col["Instructions Executed"]].replace(",", "") or 0) for r in body]
    once = executed[0] if executed else 0
    hot = [e >= LOOP_TIMES * once for e in executed]
    first = hot.index(True) if any(hot) else len(hot)
    out: dict[str, collections.Counter] = {}
    for i, r in enumerate(body):
        name = "loop" if hot[i] else "prologue" if i < first else "epilogue"
        c = out.setdefault(name, collections.Counter())
        c["samples"] += int(r[samples] or 0)
        c["sass"] += 1
        c["warp_inst"] += executed[i]
        for h in stalls:
            c["stall:" + h[len("stall_"):]] += int(r[col[h]] or 0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", type=Path)
    ap.add_argument("--names", default="", help="comma-separated names of the kernels, in profile order")
    args = ap.parse_args()
    names = [n for n in args.names.split(",") if n]
    for k, rows in enumerate(kernels(args.csv)):
        regs = regions(rows)
        total = sum(c["samples"] for c in regs.values()) or 1
        print(f"== {names[k] if k < len(names) else f'kernel {k}'}: {total} samples")
        for name, c in regs.items():
            top = sorted(((v, h[6:]) for h, v in c.items() if h.startswith("stall:")), reverse=True)[:6]
            print(f"  {name:<9}{c['samples']:6d} ({c['samples'] / total:6.1%})  sass {c['sass']:5d}  warp instructions "
                  f"{c['warp_inst']:9d}  " + ", ".join(f"{h} {v}" for v, h in top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
