"""Seed 000's optimization ladders on one GPU, at seed-sized and model-sized shapes, in one run.

    PYTHONPATH=src python3 bench/ladders.py --device webgpu --out bench/results/ladders-h200

For each GPU primitive (conv1d, GEMM, depthwise-separable conv2d) and each shape in SHAPES: every rung from the
unoptimized baseline through each optimization is verified against the float64 reference and timed interleaved
with the tuned best (the tuner, under a count/time budget) and the staging counterparts; the numpy/torch host
references are timed with the same function, torch's OpenMP threads sleeping between calls (OMP_WAIT_POLICY=PASSIVE)
and matched to the BLAS pool (each table states the setup). The CPU conv1d ladder (TVM) runs too when TVM is
importable and is skipped with the install command otherwise.

Writes OUT/ladders.json (a list of ladder results: {primitive, device, shape, reference_ms, rungs, staging, ...})
and OUT/ladders.txt (the tables, then one line per device/shape/schedule saying whether workgroup or private
staging won, by how much, with 95% intervals).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

SHAPES: dict[str, list[tuple[int, ...]]] = {
    # seed-sized first, then a larger or model-sized shape
    "conv1d-gpu": [(16384, 64), (1 << 20, 64)],
    "gemm-gpu": [(1024, 1024, 1024), (346, 2560, 1024)],  # 346 tokens x hidden 1024 -> FFN 2560 (the classifier)
    "dwsep-conv2d-gpu": [(1, 64, 56, 56, 128, 3, 1), (8, 32, 112, 112, 64, 3, 1)],
    "conv1d-cpu": [(16384, 64)],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="webgpu", help="WebGPU device for the GPU ladders (default webgpu)")
    ap.add_argument("--out", required=True, help="output folder (ladders.json, ladders.txt)")
    ap.add_argument("--tune", type=int, default=16, help="configs the tuner may measure per ladder (default 16)")
    ap.add_argument("--tune-s", type=float, default=12.0, help="seconds of tuning per ladder (default 12)")
    ap.add_argument("--budget-s", type=float, default=4.0, help="seconds of interleaved timing per ladder")
    ap.add_argument("--only", nargs="*", help="primitives to run (default: all)")
    ap.add_argument("--first-shape-only", action="store_true", help="only the seed-sized shape of each ladder")
    args = ap.parse_args(argv)

    from tilewise.devices.cpu import quiet_torch_threads

    quiet_torch_threads()  # before torch loads: its references are timed next to numpy's BLAS (see the tables)
    from tilewise.errors import TilewiseError
    from tilewise.ladder import LADDERS, get_ladder_device, run_ladder

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    texts: list[str] = []
    staging_lines: list[str] = []
    skipped: list[str] = []
    t_all = time.perf_counter()
    mkw = {"warmup": 3, "min_rounds": 15, "max_rounds": 60, "budget_s": args.budget_s}
    for primitive, shapes in SHAPES.items():
        if args.only and primitive not in args.only:
            continue
        spec = LADDERS[primitive]
        try:
            device = get_ladder_device(spec, None if spec.device == "tvm-llvm" else args.device)
        except TilewiseError as exc:
            skipped.append(f"{primitive}: skipped: {exc.problem} (fix: {exc.fix})")
            print(skipped[-1], file=sys.stderr, flush=True)
            continue
        for shape in shapes[:1] if args.first_shape_only else shapes:
            t0 = time.perf_counter()
            print(f"== {primitive} {shape} on {device.info.name}", file=sys.stderr, flush=True)
            try:
                res = run_ladder(primitive, device, shape, tune_count=args.tune, tune_seconds=args.tune_s,
                                 measure_kw=mkw, progress=lambda m: print(f"   .. {m}", file=sys.stderr, flush=True))
            except TilewiseError as exc:
                skipped.append(f"{primitive} {shape}: failed: {exc}")
                print(skipped[-1], file=sys.stderr, flush=True)
                continue
            d = res.as_json()
            d["seconds"] = round(time.perf_counter() - t0, 1)
            results.append(d)
            texts.append(res.table())
            print(res.table(), flush=True)
            shape_text = ",".join(map(str, shape))
            for a in res.staging:
                staging_lines.append(f"{primitive} [{shape_text}] on {res.device.get('name')}: {a.sentence()}")
    summary = ["", "== workgroup vs private staging (seed 000's question), per device and shape", *staging_lines]
    if skipped:
        summary += ["", "== skipped", *skipped]
    summary.append(f"\ntotal {time.perf_counter() - t_all:.0f} s")
    (out / "ladders.json").write_text(json.dumps({"ladders": results, "skipped": skipped}, indent=2) + "\n")
    (out / "ladders.txt").write_text("\n\n".join(texts) + "\n" + "\n".join(summary) + "\n")
    print("\n".join(summary))
    print(f"wrote {out / 'ladders.json'} and {out / 'ladders.txt'}")
    return 0 if results else 1


if __name__ == "__main__":
    raise SystemExit(main())
