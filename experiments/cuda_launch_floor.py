"""The floor of one launch inside a CUDA graph on this GPU, against which the model's small kernels are read.

A decision is one graph of 50-120 launches, and 41 of lfm2-350m's take under 5 us (reduce_prep, shortconv,
qknorm_rope); the bundled model's target (0.3 ms for about 50 launches) leaves 6 us a launch. This measures what a
launch costs when its kernel does (almost) nothing: chains of N launches of one kernel, captured as one graph and
replayed, timed by CUDA events around each replay. Per launch = the slope between a chain of 1 and a chain of N,
so the replay's own overhead drops out. Every kernel waits for its predecessor (PDL_BEGIN, as the model's do), and
each chain runs with and without programmatic dependent launch.

Kernels (256 threads a block):
    empty     returns after the wait
    touch     each thread adds 1 to one float of a buffer (the chain's launches depend on each other through it)
    smem64k   touch with 64 KB of dynamic shared memory a block (at most three blocks on an SM)
Grids: 1 block, one per SM, four per SM.

The variants are interleaved: each round replays every (kernel, grid, pdl, chain) once in a fresh random order;
the table gives medians over the rounds with their 20th and 80th percentiles.

    PYTHONPATH=src python3 experiments/cuda_launch_floor.py [--chain 100] [--rounds 40] [--out DIR]
"""
from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tilewise.devices import get_device  # noqa: E402
from tilewise.devices.base import Launch  # noqa: E402
from tilewise.kernels.cudasrc import MODEL_HEADERS, compile_cuda  # noqa: E402

THREADS = 256
SOURCE = r"""
__global__ void floor_empty(float *buf) { PDL_BEGIN(); }
__global__ void floor_touch(float *buf) {
  PDL_BEGIN();
  buf[blockIdx.x * blockDim.x + threadIdx.x] += 1.0f;
}
__global__ void floor_smem(float *buf) {
  extern __shared__ float sm[];
  PDL_BEGIN();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  sm[threadIdx.x] = buf[i];
  __syncthreads();
  buf[i] = sm[(threadIdx.x + 1) % blockDim.x] + 1.0f;
}
"""
KERNELS = {"empty": ("floor_empty", 0), "touch": ("floor_touch", 0), "smem64k": ("floor_smem", 64 * 1024)}


def header_text() -> str:
    from importlib import resources

    return "\n".join(resources.files("tilewise.kernels").joinpath(h).read_text() for h in MODEL_HEADERS)


def replay_ms(dev, graph) -> float:
    """One replay's GPU time in ms (CUDA events on the device's stream around it)."""
    cp = dev._cp
    start, end = cp.cuda.Event(), cp.cuda.Event()
    with dev._dev:
        start.record(dev._stream)
        graph.launch(wait=False)
        end.record(dev._stream)
        end.synchronize()
        return float(cp.cuda.get_elapsed_time(start, end))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chain", type=int, default=100, help="launches in the long chain")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", default="")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = get_device(args.device)
    sms = dev.info.limits.multiprocessors or 132
    grids = {"1 block": 1, f"{sms} blocks": sms, f"{4 * sms} blocks": 4 * sms}
    src = header_text() + SOURCE
    rng = np.random.default_rng(0)
    buf = dev.upload(rng.standard_normal(4 * sms * THREADS).astype(np.float32))  # never zeros
    graphs = {}
    for kname, (entry, smem) in KERNELS.items():
        prog = compile_cuda(dev, src, entry, THREADS, f"floor.{kname}", smem)
        for gname, g in grids.items():
            for pdl in (False, True):
                for n in (1, args.chain):
                    graphs[(kname, gname, pdl, n)] = dev.capture([Launch(prog, (g, 1, 1), [buf])] * n, pdl=pdl)
    for gr in graphs.values():  # warm-up: every graph instantiated and run once
        replay_ms(dev, gr)
    samples: dict[tuple, list[float]] = {k: [] for k in graphs}
    order = list(graphs)
    shuffle = random.Random(1)
    for _ in range(args.rounds):
        shuffle.shuffle(order)
        for key in order:
            samples[key].append(replay_ms(dev, graphs[key]))
    rows = []
    print(f"{dev.info.name}: chains of 1 and {args.chain} launches, {args.rounds} interleaved rounds; us per launch "
          "= (replay(N) - replay(1)) / (N - 1), median [p20, p80] over the rounds")
    print(f"{'kernel':10} {'grid':12} {'pdl':5} {'us/launch':>10} {'p20':>7} {'p80':>7} {'replay(1) us':>13}")
    for kname in KERNELS:
        for gname in grids:
            for pdl in (False, True):
                one = np.array(samples[(kname, gname, pdl, 1)])
                many = np.array(samples[(kname, gname, pdl, args.chain)])
                per = (many - one) * 1e3 / (args.chain - 1)  # paired by round
                p20, p50, p80 = np.percentile(per, [20, 50, 80])
                rows.append({"kernel": kname, "grid": gname, "pdl": pdl, "us_per_launch_p50": p50,
                             "p20": p20, "p80": p80, "replay1_us_p50": float(np.median(one) * 1e3),
                             "samples_ms": {"1": one.tolist(), str(args.chain): many.tolist()}})
                print(f"{kname:10} {gname:12} {pdl!s:5} {p50:10.2f} {p20:7.2f} {p80:7.2f} "
                      f"{np.median(one) * 1e3:13.2f}", flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "device": dev.info.name, "command": " ".join(sys.argv), "chain": args.chain, "rounds": args.rounds}
        (out / "launch_floor.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
