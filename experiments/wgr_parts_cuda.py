"""Where the `wgr` matmul's time goes on Hopper: one config of `nf4_mm_wgr` at a decision's row count, with one part
of the kernel taken out at a time, all raced in one interleaved measurement (the CUDA twin of sgmat_parts_dawn.py).

The variants edit matmul_wgr.cu's text before NVRTC compiles it (each edit is checked to have changed the text).
They compute wrong values on purpose, so they are timed, never verified or stored:

    full        the kernel as the executor launches it; its prep launch (and a split config's reduction) run
                once first and are not timed: every variant's time is the main launch's alone
    no-decode   the next step's A fragments are never decoded: the wgmma run on whatever the registers hold
    no-mma      the wgmma are never issued (the fragments are still decoded: one xor of each into an
                accumulator keeps them alive)
    no-wcopy    the W rows are never copied to shared memory (the decode reads stale stages)
    barrier     the stages handed back by one __syncthreads a step (WGR_RELEASE 0, the previous pipeline)
                instead of mbarriers: a complete kernel, but timed here like the others
    bare        the kernel returns at once: a launch of the same grid doing nothing
    no-loop     the K loop runs no step: launch, prologue stages, the first decode, the epilogue
    no-epi      the epilogue's tile is staged but never written out
    prologue    no K step and no stores (no-loop - prologue: the stores; prologue - bare: the rest of the fixed cost)
    no-prefetch the tensor map not prefetched ahead of the first x copy
    no-table    DEC 2 and 3: the pair table never built (its cost in the prologue)
    table-rot   DEC 2 and 3: the pair table built one code pair a thread, stored to every copy in a rotated order
                (the same table)
    epi-serial  residual epilogues load, add and store one chunk at a time (EPI_BATCH 1), as before the batches
    no-own-epi  SR 2: a block's own token groups are summed and staged, but their rows never read back or stored
    const-table DEC 1's code table built from NF4_CODE in constant memory (16 loads and conversions a thread), and
                DEC 0's f32 table filled by every config, as before the table became literal words
    dec0        the same config with the shared-memory table decode (DEC 0)
    dec2, dec3  the same config with the shared-memory pair table (DEC 2: 8 copies, DEC 3: 32 copies)
    f16-w       the same config with f16 weights (no decode; four times the bytes staged)
    scaled      the norm fold's consumer (KS 1): the same kernel given each token's sums of squares (`ss_in`), so
                its epilogue scales every output by 1 / rms, as the executor launches it with `fold_norm` on
    scaled-raw  scaled, with x's rows also 3-30x larger, as the fold's unnormed rows h * g come

With `--profile` it instead runs each variant's main launch once inside the profiler's range, for Nsight Compute:

    ncu --profile-from-start off --set full -k regex:nf4_mm_wgr -o OUT/wgr \\
        python3 experiments/wgr_parts_cuda.py --profile --variants full,no-decode,no-mma

    PYTHONPATH=src python3 experiments/wgr_parts_cuda.py --out DIR [--label ffn.gate_up] [--config BF=128,BT=120]
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import tilewise.kernels.matmul.cuda as mc  # noqa: E402
from tilewise.devices import get_device  # noqa: E402
from tilewise.devices.base import Launch  # noqa: E402
from tilewise.model.tune import model_config, model_matmuls  # noqa: E402
from tilewise.tune.engine import Engine, Item  # noqa: E402
from tilewise.tune.measure import measure  # noqa: E402

# the gate/up winner at 346 rows (cuda_space._WGR_WINNERS[0] with the register-table decode)
PICK = {"BF": 128, "BT": 120, "ST": 4, "KS": 1, "MB": 1, "DEC": 1, "SR": 0}

_NEXT = ("    if (kt + 1 < steps)\n"
         "      wgr_fragments<FMT, SETS, BF, DEC>(nxt, base + WOFF + ((kt + 1) % ST) * WBYTES, lut, tb, pt, r, t);")
_MMA = "    for (int s = 0; s < SETS; ++s) wgmma_rs<BT>(acc[s], a[s][kk], wg_desc(xs + kk * 32));"
_COPY = "    cp_w_rows<FMT, SETS, BF, NT, SETS * BF * RS, decltype(row_at), false>("
_ABSMAX = "    if (FMT == 0) {  // the step's absmax"
_LOOP = "  for (int kt = 0; kt < steps; kt += 2) {"
_TOP = "  constexpr int NT = wgr_threads(BF), SETS = EPI == 2 ? 2 : 1, BK = 64;"
_EPI = "        if (e >= CHUNKS || tok >= M || feat >= N) continue;"  # the epilogue's store loop (not the fold's)
_TABLE = "    for (int e = tid; e < 256 * wgr_pair_copies(DEC); e += NT) {"
_TABLE_BODY = ("\n      const int b = e / wgr_pair_copies(DEC);\n"
               "      pairs[e] = f16_bits(NF4_CODE[b >> 4]) | (unsigned)f16_bits(NF4_CODE[b & 15]) << 16;\n    }")
# one code pair a thread, converted once and stored to every copy, each lane starting at its own copy so that a
# warp's stores fall in 32 different banks (copies 32: lane; 8: lane / 4)
_TABLE_ROT = ("    for (int b = tid; b < 256; b += NT) {\n"
              "      constexpr int C = wgr_pair_copies(DEC);\n"
              "      const unsigned v = f16_bits(NF4_CODE[b >> 4]) | (unsigned)f16_bits(NF4_CODE[b & 15]) << 16;\n"
              "#pragma unroll\n"
              "      for (int c = 0; c < C; ++c) pairs[b * C + ((c + lane * C / 32) & (C - 1))] = v;\n    }")
_OWN_EPI = ("      chunk_epilogue<EPI, SETS>(y, res[u], ok[u], fold, t0 + row[u], col, final_out, out_h, fold_g, "
            "ss_out, N, rope);")
_LITERAL = ("  return Nf4Table{{0x52339200u, 0x00d4ea8du, 0x68e02618u, 0x00c9800du},\n"
            "                  {0xb6b8b9bcu, 0x00adb1b4u, 0x3533312du, 0x3c393837u}};")
_CONST_TABLE = ("  Nf4Table tb;\n#pragma unroll\n  for (int i = 0; i < 4; ++i) {\n    tb.lo[i] = tb.hi[i] = 0u;\n"
                "#pragma unroll\n    for (int j = 0; j < 4; ++j) {\n"
                "      const unsigned short h = f16_bits(NF4_CODE[4 * i + j]);\n"
                "      tb.lo[i] |= (unsigned)(h & 0xffu) << (8 * j);\n"
                "      tb.hi[i] |= (unsigned)(h >> 8) << (8 * j);\n    }\n  }\n  return tb;")
_LUT_DEC0 = "  if (DEC == 0 && tid < 16) lut[tid] = NF4_CODE[tid];"
EDITS: dict[str, tuple[tuple[str, str], ...]] = {  # variant -> (text, its replacement), each occurring once
    "no-decode": ((_NEXT, "    wgr_pin(acc, nxt);"),),
    # a real use of the fragments, so that ptxas keeps the decode (an empty asm pin does not)
    "no-mma": ((_MMA, "    for (int s = 0; s < SETS; ++s) acc[s][0][0] += __uint_as_float(a[s][kk][0] ^ a[s][kk][1] ^ "
                      "a[s][kk][2] ^ a[s][kk][3]);"),),
    "no-wcopy": ((_COPY, "    if (M < 0) " + _COPY[4:]),  # the rows and the step's absmax (arrivals stay)
                 (_ABSMAX, "    if (FMT == 0 && M < 0) {  // the step's absmax")),
    "barrier": (("#ifndef WGR_RELEASE\n#define WGR_RELEASE 1", "#ifndef WGR_RELEASE\n#define WGR_RELEASE 0"),),
    "bare": ((_TOP, "  if (M > 0) return;\n" + _TOP),),
    "no-loop": ((_LOOP, "  for (int kt = 0; kt < steps && M < 0; kt += 2) {"),),
    "no-epi": ((_EPI, "        if (e >= CHUNKS || tok >= M || feat >= N || M > 0) continue;"),),
    # no K step and no stores: launch, prologue and the tile staged; with no-loop and bare it splits the fixed cost
    "prologue": ((_LOOP, "  for (int kt = 0; kt < steps && M < 0; kt += 2) {"),
                 (_EPI, "        if (e >= CHUNKS || tok >= M || feat >= N || M > 0) continue;")),
    "no-prefetch": (("  if (tid == 0) tma_prefetch_map(&xmap);\n", ""),),
    "no-table": ((_TABLE, "    for (int e = tid; e < 256 * wgr_pair_copies(DEC) && M < 0; e += NT) {"),),
    "table-rot": ((_TABLE + _TABLE_BODY, _TABLE_ROT),),
    "epi-serial": (("#ifndef EPI_BATCH\n#define EPI_BATCH 8", "#ifndef EPI_BATCH\n#define EPI_BATCH 1"),),
    "no-own-epi": ((_OWN_EPI, "      if (M < 0) " + _OWN_EPI[6:]),),
    "const-table": ((_LITERAL, _CONST_TABLE), (_LUT_DEC0, "  if (tid < 16) lut[tid] = NF4_CODE[tid];")),
}


_SOURCE = mc.matmul_source  # the real one: Edited.compile swaps the module's name for an edited text


def edited_source(part: str) -> str:
    src = _SOURCE()
    if not part:
        return src
    for old, new in EDITS[part]:
        if src.count(old) != 1:
            raise SystemExit(f"{part}: the text to edit occurs {src.count(old)} times in matmul_wgr.cu (expected once)")
        src = src.replace(old, new)
    return src


class Edited(mc.CudaMatmul):
    """A wgr matmul compiled from edited source (one part taken out)."""

    def __init__(self, base: mc.CudaMatmul, part: str) -> None:
        super().__init__(base.kind, base.fmt, base.epilogue, base.norm, base.eps)
        self.part = part
        self.name = f"{base.name}~{part}"

    def compile(self, device: Any, config: Any, shape: Any) -> Any:
        real = mc.matmul_source
        mc.matmul_source = lambda: edited_source(self.part)  # type: ignore[assignment]
        try:
            return super().compile(device, config, shape)
        finally:
            mc.matmul_source = real  # type: ignore[assignment]


def variants(epilogue: str, norm: bool, eps: float, cfg: dict[str, Any]) -> dict[str, tuple[mc.CudaMatmul, dict]]:
    base = mc.CudaMatmul("wgr", "nf4", epilogue, norm, eps)
    out: dict[str, tuple[mc.CudaMatmul, dict]] = {"full": (base, cfg)}
    out.update({p: (Edited(base, p), cfg) for p in EDITS})
    out.update({f"dec{d}": (base, {**cfg, "DEC": d}) for d in (0, 1, 2, 3) if d != cfg["DEC"]})
    out["f16-w"] = (mc.CudaMatmul("wgr", "f16", epilogue, norm, eps), {**cfg, "DEC": 0})
    if cfg["KS"] == 1:  # the fold's consumer sums in its own launch
        out.update({v: (base, cfg) for v in SCALED})
    return out


#: the norm fold's consumer: variant -> whether x's rows are also made as large as unnormed residual rows
SCALED = {"scaled": False, "scaled-raw": True}


def main_launches(eng: Engine, dev: Any, tpl: mc.CudaMatmul, cfg: Any, shape: tuple[int, int, int],
                  variant: str = "") -> list:
    """The main launch of one run, after its prep launch has filled xh once (x random, never zeros). The `SCALED`
    variants' launch also reads random sums of squares (M, K / 64), as the fold's producer would have written them."""
    launches = eng.launches(Item(tpl, cfg, shape))
    prog = eng.program(Item(tpl, cfg, shape))
    before = [ln for ln in launches if ln.program is not prog]
    dev.run(before)
    dev.synchronize()
    main = [ln for ln in launches if ln.program is prog]
    if variant in SCALED:
        m, _, k = shape
        rng = np.random.default_rng(1)
        if SCALED[variant]:  # the prep's f16 rows (its buffer 4, xh) times 10^U(0.5, 1.5) per row
            xh = before[0].buffers[4]
            rows = dev.download(xh, np.float16, (m, k)).astype(np.float32) * 10.0 ** rng.uniform(0.5, 1.5, (m, 1))
            dev.write(xh, rows.astype(np.float16))
        ss = dev.upload((rng.uniform(0.5, 2.0, (m, k // 64)) * 64).astype(np.float32))  # (M, K / 64)
        at = mc.WGR_ARGS
        main = [Launch(ln.program, ln.grid, [*ln.buffers[:at["ss_in"]], ss, np.float32(1e-5),
                                             *ln.buffers[at["eps"] + 1:]]) for ln in main]
    return main


def write_record(out: str, filename: str, script: str, dev: Any, **fields: Any) -> None:
    """An experiment's JSON record into folder `out` (nothing without one): when, the command (the folder written as
    OUT_DIR), the device, then `fields`."""
    if not out:
        return
    doc = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "command": f"python3 {script} " + " ".join("OUT_DIR" if a == out else a for a in sys.argv[1:]),
           "device": dev.info.as_dict(), **fields}
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / filename).write_text(json.dumps(doc, indent=1, default=str))


def tile_parser(doc: str, rounds: int) -> argparse.ArgumentParser:
    """The options every wgr tile experiment takes: where, which model matmul, which config, how many rounds."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="")
    ap.add_argument("--preset", default="lfm2-350m")
    ap.add_argument("--rows", type=int, default=346)
    ap.add_argument("--label", default="ffn.gate_up")
    ap.add_argument("--config", default="", help="overrides of PICK, e.g. BT=128,ST=5")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--device", default="cuda")
    return ap


def tile_problem(args: argparse.Namespace) -> tuple[Any, Any, str, bool, tuple[int, int, int], dict[str, int]]:
    """(device, model config, epilogue, norm, shape, config) of the tile the options name."""
    mcfg = model_config(args.preset)
    epilogue, n, k, norm = model_matmuls(mcfg)[args.label]
    pick = {**PICK, **{kv.split("=")[0]: int(kv.split("=")[1]) for kv in args.config.split(",") if kv}}
    return get_device(args.device), mcfg, epilogue, norm, (args.rows, n, k), pick


def main() -> int:
    ap = tile_parser(__doc__, 30)
    ap.add_argument("--variants", default="", help="comma-separated subset (default: all)")
    ap.add_argument("--profile", action="store_true", help="one launch of each variant inside the profiler range")
    args = ap.parse_args()
    dev, mcfg, epilogue, norm, shape, pick = tile_problem(args)
    n, k = shape[1], shape[2]
    vs = variants(epilogue, norm, mcfg.norm_eps, pick)
    if args.variants:
        vs = {nm: vs[nm] for nm in args.variants.split(",")}
    eng = Engine(dev, None, seed=0)
    configs = {nm: tpl.config_of(c) for nm, (tpl, c) in vs.items()}
    illegal = {nm: why for nm, (tpl, _) in vs.items()
               if (why := tpl.why_illegal(configs[nm], dev.info.limits, shape))}
    runs = {nm: main_launches(eng, dev, tpl, configs[nm], shape, nm) for nm, (tpl, _) in vs.items()
            if nm not in illegal}
    print(f"{dev.info.name}: {args.label} {shape} {epilogue}{' norm' if norm else ''}, wgr {pick}", flush=True)
    for nm, why in illegal.items():
        print(f"  {nm:<10} illegal: {why}")
    if args.profile:
        import cupy as cp

        for launches in runs.values():  # warm: compiled, resident, clocks up
            for _ in range(3):
                dev.run(launches)
        dev.synchronize()
        cp.cuda.profiler.start()
        for nm, launches in runs.items():
            dev.run(launches)
            dev.synchronize()
            print(f"  profiled {nm}", flush=True)
        cp.cuda.profiler.stop()
        return 0
    got = measure(dev, runs, warmup=3, min_rounds=args.rounds, max_rounds=args.rounds, budget_s=60.0, rng=eng.rng)
    full = got.stats["full"].median_ms if "full" in got.stats else None
    flops = 2 * args.rows * n * k * (2 if epilogue == "swiglu" else 1)
    for nm, st in got.stats.items():
        rel = f"{st.median_ms / full:6.2f}x full   saves {(full - st.median_ms) * 1e3:7.1f} us" if full else ""
        print(f"  {nm:<10} {st.median_ms * 1e3:8.1f} us  [{st.ci95_ms[0] * 1e3:.1f}, {st.ci95_ms[1] * 1e3:.1f}]  "
              f"{flops / st.median_ms / 1e9:6.1f} TFLOP/s  {rel}", flush=True)
    write_record(args.out, f"wgr_parts_{args.label}.json", "experiments/wgr_parts_cuda.py", dev, label=args.label,
                 shape=shape, config=pick, illegal=illegal, parts={nm: st.as_dict() for nm, st in got.stats.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
