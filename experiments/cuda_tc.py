"""What an mma.sync matmul fed by a cp.async ring reaches when x is already f16 (experiment, apart from the family).

    python3 experiments/cuda_tc.py build --out BUILD      # here: nvcc -> BUILD/tc.cubin, BUILD/configs.json
    python3 experiments/cuda_tc.py run --build BUILD --out OUT [--rounds 15]   # on the GPU (CuPy)

`build` instantiates `cuda_tc.cu` for a grid of tiles (f16 and nf4 weights), compiles one cubin for sm_90 with
nvcc and keeps each config's registers and spills from ptxas (spilling configs are dropped). `run` loads the cubin,
checks every output of every config against a float64 reference on random inputs at the lfm2-350m matmul shapes
(346 rows), then times all configs interleaved in rounds: the median of the rounds, each the mean of 5 launches
between CUDA events, each after a write of 2x L2 (as the tuner times). It also times the prologue that rounds x to
f16 (with the RMSNorm). Prints each shape's best per weight format with its TFLOP/s and its ratio to the family's
best recorded at that shape (`FAMILY_BEST_MS`); writes OUT/tc.json. For the ratio to cuBLAS use
`bench/matmul_cuda.py`: a CuPy matmul timed here from the default stream read 3-4x slower than the engine's cuBLAS
peer on the same GPU, so this script no longer reports one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# lfm2-350m at 346 rows: gate/up as one plain N = 2 x 4608 product (the same FLOPs as the SwiGLU pair)
SHAPES = {"ffn.gate_up": (346, 9216, 1024), "ffn.down": (346, 1024, 4608), "conv.in_proj": (346, 3072, 1024),
          "attn.qkv": (346, 2048, 1024), "conv.out_proj": (346, 1024, 1024)}
# the family's best at these shapes on the same GPU (kernels/matmul `mma`/`splitk`, x f32 converted per tile)
FAMILY_BEST_MS = {"ffn.gate_up": 0.0629, "ffn.down": 0.0532, "conv.in_proj": 0.0430, "attn.qkv": 0.0311,
                  "conv.out_proj": 0.0244}
PREP_NT = 256


def smem_bytes(wfmt: int, bm: int, bn: int, bk: int, st: int) -> int:
    stage = bm * (bk + 8) * 2 + (bn * (bk + 8) * 2 if wfmt == 1 else bn * (bk // 2) + bn * 4)
    return st * stage + 64


def grid_configs() -> list[dict]:
    out = []
    for wfmt, bm, bn, bk, wm, wn, st, mb in itertools.product((1, 0), (64, 128), (64, 128, 256), (32, 64), (32, 64),
                                                               (32, 64), (3, 4), (1, 2)):
        nt = (bm // wm) * (bn // wn) * 32
        if bm % wm or bn % wn or not 128 <= nt <= 512 or (wm // 16) * (wn // 8) * 4 > 128:
            continue
        if mb * (smem_bytes(wfmt, bm, bn, bk, st) + 1024) > 228 * 1024 or nt * mb > 1024:
            continue
        out.append(dict(wfmt=wfmt, BM=bm, BN=bn, BK=bk, WM=wm, WN=wn, ST=st, MB=mb, NT=nt))
    return out


def wrapper(i: int, c: dict) -> str:
    args = "const unsigned short *xh, const unsigned char *w, const float *absmax, float *out, int M, int N, int K"
    return (f'extern "C" __global__ void __launch_bounds__({c["NT"]}, {c["MB"]}) tc_{i}({args}) {{ '
            f'tc_mm<{c["wfmt"]}, {c["BM"]}, {c["BN"]}, {c["BK"]}, {c["WM"]}, {c["WN"]}, {c["ST"]}>'
            f'(xh, w, absmax, out, M, N, K); }}\n')


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    configs = grid_configs()
    src = (HERE / "cuda_tc.cu").read_text() + "".join(wrapper(i, c) for i, c in enumerate(configs))
    args = "const float *x, const float *norm_w, float eps, unsigned short *xh, int K"
    for norm in (0, 1):
        src += (f'extern "C" __global__ void __launch_bounds__({PREP_NT}) prep_{norm}({args}) '
                f'{{ prep_x16<{norm}, {PREP_NT}>(x, norm_w, eps, xh, K); }}\n')
    (out / "tc_all.cu").write_text(src)
    t0 = time.perf_counter()
    r = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-Xptxas", "-v", "-o",
                        str(out / "tc.cubin"), str(out / "tc_all.cu")], capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr[-4000:])
    info: dict[str, dict] = {}
    name = None
    for line in r.stderr.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            name = m.group(1)
        elif name and (m := re.search(r"(\d+) bytes spill stores", line)):
            info.setdefault(name, {})["spill"] = int(m.group(1))
        elif name and (m := re.search(r"Used (\d+) registers", line)):
            info.setdefault(name, {})["regs"] = int(m.group(1))
    kept = []
    for i, c in enumerate(configs):
        c = {**c, "name": f"tc_{i}", **info.get(f"tc_{i}", {})}
        if c.get("spill", 0) == 0:
            kept.append(c)
    (out / "configs.json").write_text(json.dumps(kept, indent=1))
    print(f"built {len(configs)} configs in {time.perf_counter() - t0:.0f} s; {len(kept)} without spills")


def run(build_dir: Path, out: Path, rounds: int, limit: int) -> None:
    import cupy as cp
    import numpy as np

    sys.path.insert(0, str(HERE.parent / "src"))
    from tilewise.quant.nf4 import weight_arrays, weight_values

    out.mkdir(parents=True, exist_ok=True)
    mod = cp.RawModule(path=str(build_dir / "tc.cubin"))
    configs = json.loads((build_dir / "configs.json").read_text())
    if limit:
        configs = configs[:limit]
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    log = lambda msg: print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)  # noqa: E731
    results: dict = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rounds": rounds,
                     "shapes": {}}
    funcs = {}
    for c in configs:
        f = mod.get_function(c["name"])
        smem = smem_bytes(c["wfmt"], c["BM"], c["BN"], c["BK"], c["ST"])
        f.max_dynamic_shared_size_bytes = smem
        funcs[c["name"]] = (f, smem)

    flush = cp.empty(2 * 50 * 2**20 // 4, dtype=cp.float32)  # 2x the H200's L2

    def timed(fn, reps: int = 5) -> float:
        """The mean of `reps` launches, each between CUDA events after a write of 2x L2 (cold caches, as in a
        model, and the host has queued the launch before the GPU reaches it: no launch gaps are timed)."""
        ev = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)]
        for a, b in ev:
            flush.fill(0.0)
            a.record()
            fn()
            b.record()
        ev[-1][1].synchronize()
        return sum(cp.cuda.get_elapsed_time(a, b) for a, b in ev) / reps

    for label, (m, n, k) in SHAPES.items():
        x = rng.standard_normal((m, k)).astype(np.float32)
        norm_w = (1 + 0.3 * rng.standard_normal(k)).astype(np.float32)
        wf = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        nf4 = weight_arrays(wf, "nf4")
        w_nf4 = weight_values(nf4, "nf4", n, k)  # (N, K) float64, exactly what the kernel multiplies
        w16 = wf.astype(np.float16)
        d_x, d_nw = cp.asarray(x), cp.asarray(norm_w)
        d_xh = cp.empty((m, k), dtype=cp.float16)
        prep = {nm: mod.get_function(f"prep_{nm}") for nm in (0, 1)}
        # the prologue, checked: x rounded to f16 (and normed)
        for nm in (1, 0):
            prep[nm]((m,), (PREP_NT,), (d_x, d_nw, np.float32(1e-5), d_xh, np.int32(k)))
        xn = x.astype(np.float64)
        xh_ref = xn.astype(np.float16)
        assert np.array_equal(d_xh.get(), xh_ref), f"{label}: prep_0 differs from numpy's f16 rounding"
        xh64 = xh_ref.astype(np.float64)
        dev_w = {1: cp.asarray(w16.view(np.uint8)), 0: cp.asarray(nf4["w"].view(np.uint8))}
        dev_abs = {1: cp.asarray(np.ones(1, np.float32)), 0: cp.asarray(nf4["absmax"])}
        refs = {1: xh64 @ w16.astype(np.float64).T, 0: xh64 @ w_nf4.T}  # (M, N)
        d_out = cp.empty((m, n), dtype=cp.float32)
        row: dict = {"shape": [m, n, k], "configs": {}}
        cands = {}
        for c in configs:
            f, smem = funcs[c["name"]]
            grid = ((n + c["BN"] - 1) // c["BN"], (m + c["BM"] - 1) // c["BM"], 1)
            argv = (d_xh, dev_w[c["wfmt"]], dev_abs[c["wfmt"]], d_out, np.int32(m), np.int32(n), np.int32(k))
            fn = lambda f=f, grid=grid, c=c, argv=argv, smem=smem: f(grid, (c["NT"],), argv, shared_mem=smem)  # noqa: E731
            d_out.fill(np.nan)
            fn()
            got = d_out.get().astype(np.float64)
            ref = refs[c["wfmt"]]
            err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
            ok = bool(np.isfinite(got).all() and err < 1e-3)
            row["configs"][c["name"]] = {**c, "rel_err": err, "ok": ok}
            if ok:
                cands[c["name"]] = fn
        pargs = (d_x, d_nw, np.float32(1e-5), d_xh, np.int32(k))
        cands["prep_norm"] = lambda f=prep[1], m=m, pargs=pargs: f((m,), (PREP_NT,), pargs)
        for fn in cands.values():
            fn()
        cp.cuda.Device().synchronize()
        times: dict[str, list[float]] = {nm: [] for nm in cands}
        names = list(cands)
        for rd in range(rounds):
            order = names[rd % len(names):] + names[: rd % len(names)]  # rotate who goes first
            for nm in order:
                times[nm].append(timed(cands[nm]))
        med = {nm: float(np.median(v)) for nm, v in times.items()}
        for nm, v in times.items():
            if nm in row["configs"]:
                row["configs"][nm]["ms"] = med[nm]
                row["configs"][nm]["ms_rounds"] = v
        row["prep_norm_ms"] = med["prep_norm"]
        results["shapes"][label] = row
        flop = 2 * m * n * k
        best = {}
        for wf_ in (1, 0):
            ok = [(cf["ms"], nm) for nm, cf in row["configs"].items() if cf["ok"] and cf["wfmt"] == wf_ and "ms" in cf]
            if ok:
                best[wf_] = min(ok)
        bad = sum(not cf["ok"] for cf in row["configs"].values())
        fam = FAMILY_BEST_MS[label]
        msg = f"{label} {m}x{n}x{k}: prep+norm {med['prep_norm']:.4f} ms"
        for wf_, (ms, nm) in best.items():
            c = row["configs"][nm]
            msg += (f"; best {'f16' if wf_ else 'nf4'} {ms:.4f} ms, {flop / ms / 1e9:.0f} TFLOP/s, {fam / ms:.2f}x the "
                    f"family's {fam:.4f} ({c['BM']}x{c['BN']}x{c['BK']} w{c['WM']}x{c['WN']} st{c['ST']} "
                    f"mb{c['MB']}, {c.get('regs')} regs)")
        msg += f"; {bad} configs failed the check"
        log(msg)
        (out / "tc.json").write_text(json.dumps(results, indent=1))
    log("done")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("--build", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--rounds", type=int, default=15)
    r.add_argument("--limit", type=int, default=0, help="only the first N configs (0: all)")
    a = ap.parse_args()
    if a.cmd == "build":
        build(a.out)
    else:
        run(a.build, a.out, a.rounds, a.limit)


if __name__ == "__main__":
    main()
