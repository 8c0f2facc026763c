"""Tuned WGSL fp32 GEMM against cuBLAS fp32 (TF32 off, through torch), in one run.

    PYTHONPATH=src python3 bench/gemm_webgpu.py --budget-s 180 --out bench/results/gemm-h200

1. Tunes the WGSL GEMM at 4096^3 on the WebGPU device: an earlier run's winners (PRIOR, with their
   double-buffered variants; --no-prior skips them), seed 003's 16 points, then random configs of the
   "large" space until --budget-s is spent (every candidate verified on fresh random inputs against a
   float64 reference, timed interleaved with GPU timestamps).
2. At each benchmark shape, races the best configs of step 1 (legal at that shape) together and keeps the
   fastest (a per-shape pick: seed 001's padding lesson).
3. Times cuBLAS fp32 with TF32 off on the same shapes with CUDA events and the same statistics, on fresh
   random inputs, and prints a ratio table (WGSL time / cuBLAS time; cuBLAS GFLOP/s share).
Without torch+CUDA it still tunes and says cuBLAS was not measured. Writes OUT.json and OUT.txt.

Every WGSL candidate goes through the evaluation engine (`tilewise.tune.engine`): one engine for the whole run
compiles, verifies, times and stores each one (the tuning steps through `tune`, the per-shape races through
`Engine.evaluate` and `Engine.race`), so the per-shape races reuse the tuning's programs and verifications. cuBLAS
runs on another device (CUDA through torch, not the WebGPU adapter), so it cannot join a WGSL race: it is timed
here with CUDA events and summarized with the same statistics.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# an earlier run's winners and their double-buffered (PF=2) variants are raced first: a short budget then starts
# from tiles known to be good on a large GPU, and the seed space and random search look for better ones
PRIOR = [
    "BM=128,BN=128,BK=16,WM=32,WN=128,WNITER=4,TM=8,TN=4,NT=128,SA=workgroup,SB=workgroup,VEC=4,PF=1",
    "BM=128,BN=128,BK=16,WM=32,WN=128,WNITER=1,TM=4,TN=8,NT=128,SA=workgroup,SB=workgroup,VEC=4,PF=1",
    "BM=128,BN=128,BK=16,WM=64,WN=64,WNITER=2,TM=8,TN=8,NT=128,SA=workgroup,SB=workgroup,VEC=4,PF=1",
    "BM=128,BN=128,BK=16,WM=128,WN=32,WNITER=4,TM=4,TN=4,NT=128,SA=workgroup,SB=workgroup,VEC=4,PF=1",
    "BM=128,BN=256,BK=16,WM=128,WN=32,WNITER=2,TM=4,TN=8,NT=256,SA=workgroup,SB=workgroup,VEC=4,PF=1",
    "BM=128,BN=64,BK=32,WM=16,WN=64,WNITER=1,TM=4,TN=4,NT=256,SA=private,SB=workgroup,VEC=4,PF=1",
]
SHAPES = [(4096, 4096, 4096), (1024, 1024, 1024), (346, 2560, 1024)]  # (M, N, K): 346x1024 @ 1024x2560
TUNE_MEASURE = {"warmup": 2, "min_rounds": 6, "max_rounds": 20, "budget_s": 3.0}
RACE_MEASURE = {"warmup": 3, "min_rounds": 15, "max_rounds": 40, "budget_s": 8.0}


def cublas_times(shape: tuple[int, int, int], samples: int, seed: int) -> dict[str, Any] | None:
    """Median/p20/p80/CI of torch.matmul fp32 (TF32 off) with CUDA events; None without torch+CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from tilewise.tune.measure import summarize

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.rand(M, K, device="cuda", generator=g) + 0.5  # (M, K)
    b = torch.rand(K, N, device="cuda", generator=g) + 0.5  # (K, N)
    c = torch.empty(M, N, device="cuda")  # (M, N)
    for _ in range(5):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        torch.matmul(a, b, out=c)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    ref = a.double() @ b.double()
    rel = float(torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref))
    st = summarize(times)
    return {"median_ms": st.median_ms, "p20_ms": st.p20_ms, "p80_ms": st.p80_ms, "ci95_ms": list(st.ci95_ms),
            "rel_err": rel, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "samples_ms": times}


def ok_by_speed(rows: list[Any]) -> list[Any]:
    """The verified and timed outcomes, fastest first."""
    return sorted((r for r in rows if r.status == "ok" and r.stats), key=lambda r: r.stats.median_ms)


def race_at(eng: Any, tpl: Any, shape: tuple[int, ...], configs: list[Any], say: Any) -> tuple[list[Any], Any]:
    """Verify `configs` at `shape` through the engine, then time the verified ones in one interleaved race.

    Returns (the raced outcomes, in race order, with the race's stats; the race)."""
    from tilewise.tune.engine import Item
    from tilewise.tune.store import shape_key

    outcomes = eng.evaluate([Item(tpl, c, shape) for c in configs], batch=None, timed=False)
    for oc in outcomes:
        if oc.status != "ok":
            say(f"  {oc.config} is {oc.status} at {shape_key(shape)}: {oc.reason}")
    ok = [oc for oc in outcomes if oc.status == "ok"]
    race = eng.race([oc.item for oc in ok], measure_kw=RACE_MEASURE, outcomes=ok) if ok else None
    return ok, race


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=180.0, help="seconds of tuning at 4096^3 (default 180)")
    ap.add_argument("--out", default="bench/results/gemm-webgpu", help="output path prefix (.json and .txt)")
    ap.add_argument("--device", default="webgpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--race", type=int, default=8, help="best configs raced again at each shape")
    ap.add_argument("--shape-budget-s", type=float, default=30.0,
                    help="seconds of extra tuning at each other benchmark shape (seed space + random)")
    ap.add_argument("--store", default=None, help="results store to resume from (default: a fresh temporary one, "
                    "so every run measures everything again)")
    ap.add_argument("--no-prior", action="store_true", help="skip the earlier run's winners (search from scratch)")
    ap.add_argument("--tune-shape", default="4096,4096,4096", help="M,N,K to tune at")
    ap.add_argument("--shapes", default=";".join(",".join(map(str, s)) for s in SHAPES),
                    help="benchmark shapes M,N,K separated by ';' (default: 4096^3, 1024^3, 346x2560x1024)")
    args = ap.parse_args(argv)

    from tilewise.devices.cpu import quiet_torch_threads

    omp = quiet_torch_threads()  # before torch loads (cuBLAS through torch): no OpenMP threads spinning on the host
    import tilewise
    from tilewise.kernels.base import parse_shape
    from tilewise.kernels.gemm.webgpu import WgslGemm
    from tilewise.tune.engine import Engine
    from tilewise.tune.measure import compare, summarize, tie_groups
    from tilewise.tune.search import Budget
    from tilewise.tune.store import Store
    from tilewise.tune.tuner import Row, tune

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    store = Store(args.store or Path(tempfile.mkdtemp(prefix="tilewise-bench-")) / "results.sqlite")
    dev = tilewise.get_device(args.device)
    tpl = WgslGemm()
    tune_shape = parse_shape(args.tune_shape, ("M", "N", "K"))
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    say(f"device: {dev.info.name} ({dev.info.api}, {dev.info.driver}); timer {dev.timer}")
    say(f"fingerprint: {dev.info.fingerprint}")
    t0 = time.perf_counter()

    def progress(stage: str, done: int, total: int | None) -> None:
        if stage.startswith("timing") or stage == "final race":
            print(f"  [{time.perf_counter() - t0:6.1f} s] {stage} ({done} configs so far)", flush=True)

    eng = Engine(dev, store, seed=args.seed, measure_kw=TUNE_MEASURE, progress=progress)

    def tuned(shape: tuple[int, ...], space: str, seed: int, **kw: Any) -> list[Row]:
        return tune(tpl, dev, shape, space=space, seed=seed, final_race=0, engine=eng, **kw).rows

    full = tpl.space("full")
    prior = [full.parse(k) for k in PRIOR]
    prior += [c.replace(PF=2) for c in prior]
    rows: list[Row] = []
    if not args.no_prior:
        rows += tuned(tune_shape, "full", args.seed, configs=prior)
    rows += tuned(tune_shape, "seed", args.seed)
    left = args.budget_s - (time.perf_counter() - t0)
    if left > 5:
        rows += tuned(tune_shape, "large", args.seed, strategy="random", budget=Budget(seconds=left))
    tuned_s = time.perf_counter() - t0
    ok = ok_by_speed(rows)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    say(f"tuned {len(rows)} configs at {'x'.join(map(str, tune_shape))} in {tuned_s:.0f} s: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if not ok:
        say("no config verified; nothing to compare")
        return 1
    say("best at the tuning shape (separate batches; the per-shape race below re-times them together):")
    for r in ok[:5]:
        say(f"  {r.config}  {r.stats.median_ms:.3f} ms  {r.gflops / 1e3:.1f} TFLOP/s")
    finalists = [r.config for r in ok[: args.race]]

    table: list[dict[str, Any]] = []
    for shape in [parse_shape(s, ("M", "N", "K")) for s in args.shapes.split(";")]:
        M, N, K = shape
        cands = [c for c in finalists if not tpl.shape_problems(c, shape)]
        if tuple(shape) != tuple(tune_shape) and args.shape_budget_s > 0:
            # small shapes want other tiles (fewer workgroups than multiprocessors otherwise): tune here too
            t1 = time.perf_counter()
            extra = tuned(shape, "seed", args.seed)
            left = args.shape_budget_s - (time.perf_counter() - t1)
            if left > 3:
                extra += tuned(shape, "large", args.seed + 7, strategy="random", budget=Budget(seconds=left))
            cands += [r.config for r in ok_by_speed(extra)[: args.race] if r.config not in cands]
        # each candidate is verified by the engine (at the template's cheaper verify shape with the same edge
        # structure, once per program) and raced at the real shape on one input set
        raced, race = race_at(eng, tpl, shape, cands, say)
        if race is None:
            say(f"  no config verified at {M}x{N}x{K}; shape skipped")
            continue
        ranked = tie_groups({oc.config: st for oc, st in zip(raced, race.stats)})
        best_cfg, best_st, _ = ranked[0]
        tied = [k for k, _, g in ranked if g == 1]
        cub = cublas_times(shape, 40, args.seed)
        flops = 2 * M * N * K
        row = {"shape": f"{M}x{K}x{N} (M,K,N)", "M": M, "N": N, "K": K, "wgsl_config": best_cfg.key(),
               "wgsl_label": str(best_cfg), "wgsl_median_ms": best_st.median_ms, "wgsl_ci95_ms": list(best_st.ci95_ms),
               "wgsl_tflops": flops / best_st.median_ms / 1e9, "tied_with": [str(k) for k in tied[1:]],
               "cublas": cub}
        if cub:
            row["cublas_tflops"] = flops / cub["median_ms"] / 1e9
            row["fraction_of_cublas"] = cub["median_ms"] / best_st.median_ms
            vs = compare(summarize(cub["samples_ms"]), best_st)  # separate runs: their intervals still must part
            row["vs_cublas"] = vs.verdict
            row["fraction_text"] = f"{100 * vs.ratio:.0f}%" if vs.verdict in ("faster", "slower") else vs.verdict
        table.append(row)

    say("")
    say(f"{'shape M x K x N':<20} {'WGSL ms':>9} {'TFLOP/s':>8} {'cuBLAS ms':>10} {'TFLOP/s':>8} {'WGSL/cuBLAS':>12}  "
        "best WGSL config")
    for row in table:
        cub = row["cublas"]
        cub_ms = f"{cub['median_ms']:.3f}" if cub else "n/a"
        cub_tf = f"{row['cublas_tflops']:.1f}" if cub else "n/a"
        frac = row["fraction_text"] if cub else "n/a"
        say(f"{row['M']}x{row['K']}x{row['N']:<10} {row['wgsl_median_ms']:>9.3f} {row['wgsl_tflops']:>8.1f} "
            f"{cub_ms:>10} {cub_tf:>8} {frac:>12}  {row['wgsl_label']}")
    if not any(r["cublas"] for r in table):
        say("cuBLAS was not measured (no torch with CUDA on this machine)")
    else:
        say("WGSL/cuBLAS = cuBLAS time / WGSL time (share of cuBLAS fp32 throughput, TF32 off); tie: the 95% "
            "intervals overlap; noisy: the samples scatter too much to rank")
    say(omp)
    record = {"date": time.strftime("%Y-%m-%d"), "device": dev.info.as_dict(), "python": platform.python_version(),
              "argv": [Path(a).name if a == args.out else a for a in sys.argv], "tune_shape": list(tune_shape),
              "tune_seconds": tuned_s, "status_counts": counts,
              "tuned": [r.as_json() for r in ok[:20]], "table": table}
    out.with_suffix(".json").write_text(json.dumps(record, indent=1, default=str))
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    store.close()
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.txt')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
