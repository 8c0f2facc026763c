"""When each part of a `wgr` matmul runs, block by block: thread 0 of every block stamps the GPU's global timer and
its SM's cycle counter at eight points of the kernel, so that a launch's fixed costs (block start skew, setup, the
first stage's wait, the first decode, the epilogue) are measured where they happen rather than inferred by
subtracting variants (wgr_parts_cuda.py).

The stamps are written through the kernel's `counters` argument (read only by SR 1, which this experiment refuses),
edited into matmul_wgr.cu's text before NVRTC compiles it; each edit is checked to occur once. The points:

    0 entry        the block's first instruction
    1 setup        after the block-wide barrier that follows the code tables and the mbarriers
    2 pdl          after the PDL wait (a no-op without the launch attribute)
    3 landed       step 0's x tile and W rows have landed
    4 decoded      step 0's A fragments decoded
    5 looped       the K loop and its copies done
    6 ring-free    every warpgroup past the loop (the barrier before the epilogue's tile)
    7 end          the block's last store (SR 0: after one more barrier; SR 2: after its own rows' epilogue)

SR 2 also splits its epilogue (cycle counter only) where every peer's sums for the block's token groups have landed
(its own sent, then the wait for the slowest peer: "synced") and where its groups' slices are summed and staged
("reduced"); the rest ("exit") is the epilogue of its rows: residual rows, stores.

`--also VARIANT` makes one of wgr_parts_cuda.py's edits as well (e.g. const-table), so that a part's effect on
the phases is seen where it happens. Modes, each repeated `--rounds` times: `alone` (one launch after the stream is
idle), `chain` (two launches back to back, the second's stamps in a second buffer: the gap between them) and
`chain-pdl` (the same with programmatic dependent launch, as a decision's graph launches them). Phases are
cycle-counter differences turned into microseconds by the pooled ratio of timer to cycles over all blocks (the timer
alone may tick coarsely); start skew and gaps come from the timer.

    PYTHONPATH=src python3 experiments/wgr_timeline_cuda.py --out DIR --label ffn.gate_up \\
        --config BF=128,BT=128,ST=4,KS=1,MB=1,DEC=3,SR=0
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
sys.path.insert(0, str(ROOT / "src"))

import wgr_parts_cuda as parts  # noqa: E402
from tilewise.devices.base import Launch  # noqa: E402
from tilewise.kernels.matmul.cuda import CudaMatmul  # noqa: E402
from tilewise.tune.engine import Engine  # noqa: E402

POINTS = ("entry", "setup", "pdl", "landed", "decoded", "looped", "ring-free", "end")
FILL = np.iinfo(np.uint64).max
STRIDE = 20  # u64 words a block: (timer, cycles) per point, then its SM id
COUNTERS = 11  # the launch's `counters` argument (cuda_source.WGR_ARGS: final_out 10, out_h 12)

_HELPER = (
    "__device__ __forceinline__ unsigned long long tl_timer() {\n"
    "  unsigned long long t;\n"
    "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n"
    "  return t;\n"
    "}\n"
    "#define TL(i) do { if (threadIdx.x == 0) { unsigned long long *tl_ = reinterpret_cast<unsigned long long *>("
    "counters) + ((size_t)blockIdx.x + gridDim.x * ((size_t)blockIdx.y + (size_t)gridDim.y * blockIdx.z)) * "
    f"{STRIDE}; tl_[2 * (i)] = tl_timer(); tl_[2 * (i) + 1] = clock64(); if ((i) == 0) {{ unsigned s_; "
    "asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(s_)); tl_[16] = s_; tl_slot = tl_; } } } while (0)\n"
)
_PIN = "template <int SETS, int J>\n__device__ __forceinline__ void wgr_pin("
_SETUP = ("  __syncthreads();  // the mbarriers exist before any thread waits on one (the first wait precedes the "
          "next barrier)\n")
_PDL = "  PDL_BEGIN();\n#pragma unroll\n  for (int g = 0; g < AHEAD; ++g) issue_x(g);"
_LANDED = "    mbar_wait(bars, 0);  // step 0's x and every thread's W rows"
_DECODED = "  wgr_fragments<FMT, SETS, BF, DEC>(a0, base + WOFF, lut, tb, pt, r, t);\n"
_LOOPED = "  wgr_pin(acc, a1);\n  cp_async_wait<0>();\n"
_RING = "  __syncthreads();  // every warpgroup's wgmma and copies are done: the ring is free"
_END2 = "EPI == 0 ? rope : nullptr);\n    return;"
_END0 = "  if constexpr (SR == 1)  // the code table"
# SR 2's sums (wgr_push_sums, wgr_sum_own in matmul_wgr.cu): thread 0 also stamps the cycle counter once every peer's
# sums for the block's token groups have landed (word 17) and once its own groups' slices are summed and staged
# (word 18), through the slot pointer TL keeps in shared memory; the helper goes before matmul_reduce.cu's
# cluster_reduce, the first of the files compiled ahead of matmul_wgr.cu that the edits can name
_CR = "template <int EPI, int KS, int NT, int ROWS, int COLS>\n__device__ __forceinline__ void cluster_reduce("
_CR_HELPER = ("__shared__ unsigned long long *tl_slot;\n"
              "#define TLC(w) do { if (threadIdx.x == 0 && tl_slot) tl_slot[w] = clock64(); } while (0)\n")
_RECV = "  mbar_wait(recv_bar, 0);\n"
_STAGED = "    __syncthreads();  // the block's summed rows (and the scales) are staged\n"
TIMELINE = (
    (_CR, _CR_HELPER + _CR),
    (_RECV, _RECV + "  TLC(17);\n"),
    (_STAGED, _STAGED + "    TLC(18);\n"),
    (_PIN, _HELPER + _PIN),
    (parts._TOP, "  TL(0);\n" + parts._TOP),
    (_SETUP, _SETUP + "  TL(1);\n"),
    (_PDL, "  PDL_BEGIN();\n  TL(2);\n#pragma unroll\n  for (int g = 0; g < AHEAD; ++g) issue_x(g);"),
    (_LANDED, _LANDED + "\n    TL(3);"),
    (_DECODED, _DECODED + "  TL(4);\n"),
    (_LOOPED, _LOOPED + "  TL(5);\n"),
    (_RING, _RING + "\n  TL(6);"),
    (_END2, "EPI == 0 ? rope : nullptr);\n    TL(7);\n    return;"),
    (_END0, "  __syncthreads();\n  TL(7);\n" + _END0),
)
parts.EDITS["timeline"] = TIMELINE


def stamped(launch: Launch, buf: Any) -> Launch:
    return Launch(launch.program, launch.grid, [*launch.buffers[:COUNTERS], buf, *launch.buffers[COUNTERS + 1:]])


def read(dev: Any, buf: Any, blocks: int) -> np.ndarray:
    """(blocks, STRIDE) u64; a block that wrote no stamp keeps the all-ones fill and fails here."""
    got = dev.download(buf, np.uint64, (blocks, STRIDE))
    if (got[:, :16] == FILL).any():
        raise SystemExit("a block wrote no stamp at some point: the edits missed a path")
    return got


def cycles_of(st: np.ndarray) -> tuple[np.ndarray, float]:
    """(the cycle counter at each point (blocks, 8), us a cycle): the pooled ratio of timer to cycles from entry to
    end over all the blocks of `st` (stamps, (blocks, STRIDE)), since the timer alone may tick coarsely."""
    timer, cycles = st[:, 0:16:2].astype(np.int64), st[:, 1:16:2].astype(np.int64)
    return cycles, float((timer[:, 7] - timer[:, 0]).sum() / max(1, (cycles[:, 7] - cycles[:, 0]).sum()) / 1e3)


def cluster_split(st: np.ndarray) -> dict[str, np.ndarray] | None:
    """SR 2's epilogue in cycles per block: to the peers' sums landed (its own sent, then the wait for the slowest
    peer), the sums staged, the epilogue of its rows; None where a block of `st` stamped neither (SR 0)."""
    if (st[:, 17:19] == FILL).any():
        return None
    cycles, cr = st[:, 1:16:2].astype(np.int64), st[:, 17:19].astype(np.int64)
    return {"synced": cr[:, 0] - cycles[:, 6], "reduced": cr[:, 1] - cr[:, 0], "exit": cycles[:, 7] - cr[:, 1]}


def phases(runs: list[np.ndarray]) -> dict[str, Any]:
    """Per phase (between consecutive points): median, p10 and p90 over every block of every run, in us."""
    st = np.concatenate(runs)
    cycles, us_per_cycle = cycles_of(st)
    d = np.diff(cycles, axis=1) * us_per_cycle
    out: dict[str, Any] = {"mhz": 1.0 / us_per_cycle if us_per_cycle else 0.0, "phases": {}}
    for i in range(7):
        v = d[:, i]
        out["phases"][f"{POINTS[i]}->{POINTS[i + 1]}"] = [float(np.median(v)), float(np.percentile(v, 10)),
                                                            float(np.percentile(v, 90))]
    split = cluster_split(st)
    names = {"synced": "ring-free->synced", "reduced": "synced->reduced", "exit": "reduced->end"}
    for key, c in (split or {}).items():  # SR 2
        v = c * us_per_cycle
        out["phases"][names[key]] = [float(np.median(v)), float(np.percentile(v, 10)), float(np.percentile(v, 90))]
    total = (cycles[:, 7] - cycles[:, 0]) * us_per_cycle
    out["block_us"] = [float(np.median(total)), float(np.percentile(total, 10)), float(np.percentile(total, 90))]
    skew, span = [], []
    for r in runs:
        t0 = r[:, 0].astype(np.int64)
        skew.append((t0 - t0.min()) / 1e3)
        span.append((r[:, 14].astype(np.int64).max() - t0.min()) / 1e3)
    sk = np.concatenate(skew)
    out["start_skew_us"] = [float(np.median(sk)), float(np.percentile(sk, 90)), float(sk.max())]
    out["span_us"] = [float(np.median(span)), float(np.min(span)), float(np.max(span))]
    sms = np.bincount(runs[-1][:, 16].astype(np.int64))
    out["blocks_per_sm"] = {"max": int(sms.max()), "sms_used": int((sms > 0).sum())}
    return out


def main() -> int:
    ap = parts.tile_parser(__doc__, 20)
    ap.add_argument("--also", default="", choices=["", *(v for v in parts.EDITS if not v.startswith("timeline"))],
                    help="a wgr_parts_cuda.py variant's edits made too (const-table: its timeline beside the real one)")
    args = ap.parse_args()
    dev, mcfg, epilogue, norm, shape, pick = parts.tile_problem(args)
    if pick["SR"] == 1:
        raise SystemExit("SR 1 reads `counters`, which carries the stamps here: pick SR 0 or 2")
    edits = "timeline" if not args.also else f"timeline+{args.also}"
    parts.EDITS[edits] = TIMELINE + (parts.EDITS[args.also] if args.also else ())
    tpl = parts.Edited(CudaMatmul("wgr", "nf4", epilogue, norm, mcfg.norm_eps), edits)
    cfg = tpl.config_of(pick)
    why = tpl.why_illegal(cfg, dev.info.limits, shape)
    if why:
        raise SystemExit(f"illegal config: {why}")
    eng = Engine(dev, None, seed=0)
    main_ = parts.main_launches(eng, dev, tpl, cfg, shape)
    if len(main_) != 1:
        raise SystemExit(f"expected one main launch, got {len(main_)}")
    grid = main_[0].grid
    blocks = grid[0] * grid[1] * grid[2]
    fill = np.full((blocks, STRIDE), FILL, np.uint64)
    bufs = [dev.upload(fill), dev.upload(fill)]
    a, b = stamped(main_[0], bufs[0]), stamped(main_[0], bufs[1])
    for _ in range(5):  # warm: compiled, resident, clocks up
        dev.run([a, b])
    dev.synchronize()
    print(f"{dev.info.name}: {args.label} {shape} {epilogue}{' norm' if norm else ''}, wgr {pick}, "
          f"grid {grid} ({blocks} blocks)", flush=True)
    modes: dict[str, Any] = {}
    for mode in ("alone", "chain", "chain-pdl"):
        firsts, seconds, gaps = [], [], []
        for _ in range(args.rounds):
            for buf in bufs:
                dev.write(buf, fill)
            dev.synchronize()
            dev.run([a] if mode == "alone" else [a, b], pdl=mode == "chain-pdl")
            dev.synchronize()
            firsts.append(read(dev, bufs[0], blocks))
            if mode != "alone":
                seconds.append(read(dev, bufs[1], blocks))
                gaps.append((seconds[-1][:, 0].astype(np.int64).min() - firsts[-1][:, 14].astype(np.int64).max())
                            / 1e3)
        res = phases(seconds or firsts)  # in a chain, the second launch: it follows a kernel, as in a decision
        if gaps:
            res["gap_us"] = [float(np.median(gaps)), float(np.min(gaps)), float(np.max(gaps))]
        modes[mode] = res
        print(f"  {mode:<9} span {res['span_us'][0]:6.1f} us  block {res['block_us'][0]:6.1f} "
              f"[{res['block_us'][1]:.1f}, {res['block_us'][2]:.1f}]  start skew p50 {res['start_skew_us'][0]:.2f} "
              f"p90 {res['start_skew_us'][1]:.2f} max {res['start_skew_us'][2]:.2f}"
              + (f"  gap after the previous launch {res['gap_us'][0]:.2f} us" if gaps else "")
              + f"  ({res['mhz']:.0f} MHz, {res['blocks_per_sm']['sms_used']} SMs)", flush=True)
        for name, (p50, p10, p90) in res["phases"].items():
            print(f"      {name:<20} {p50:7.2f} us  [p10 {p10:.2f}, p90 {p90:.2f}]", flush=True)
    parts.write_record(args.out, f"wgr_timeline_{args.label}{'_' + args.also if args.also else ''}.json",
                       "experiments/wgr_timeline_cuda.py", dev, label=args.label, shape=shape, config=pick, grid=grid,
                       also=args.also, modes=modes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
