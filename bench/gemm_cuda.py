"""Seed 003 on an NVIDIA GPU: the warp-tiling SGEMM template against cuBLAS fp32 (TF32 off), in one run.

What it does, in order (all timings: CUDA events, L2 flushed before every sample, candidates interleaved
round-robin by `tune.measure.measure`; every verified output checked value by value against float64):

1. Device facts and limits (cudaDeviceProp) and the fingerprint the results are stored under.
2. The seed's 16-point table at 4096^3: legality first (two points are illegal, with the rule), then
   compile, verify (odd shape with partial tiles, float64), time interleaved with cuBLAS; ranked.
3. The full sweep over the legal grid (`--space full`, random order, bounded by `--budget-s`): parallel NVRTC
   compiles, verification at an odd shape, a short interleaved timing at 4096^3.
4. Finals per shape (4096^3, 2048^3, 346x2560x1024, 346x1024x2560): every verified config timed briefly at
   that shape, then the best few re-timed with many rounds next to cuBLAS; the winner verified at the
   shape against float64 and cuBLAS. Ratio table printed.
5. Writes `gemm_cuda.json` (everything), `gemm_cuda.txt` (the printed tables) and `results.sqlite` (the
   tilewise results store) into `--out`.

Run: PYTHONPATH=src python bench/gemm_cuda.py --out bench/results/gemm_cuda_h200 --budget-s 330
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import tilewise

os.environ.setdefault("CUPY_TF32", "0")  # cuBLAS fp32 must stay fp32 (no TF32 tensor cores)

from tilewise.devices.cuda import CUDADevice
from tilewise.errors import TilewiseError
from tilewise.kernels.gemm.cuda import KERNEL7, SEED_WINNER, VERIFY_SHAPE, CudaGemm
from tilewise.kernels.space import Config
from tilewise.tune.measure import measure, tie_groups
from tilewise.tune.search import Budget, get_strategy
from tilewise.tune.store import Result, Store, shape_key
from tilewise.tune.tuner import config_source_hash
from tilewise.tune.verify import Verifier, compare

TUNE_SHAPE = (4096, 4096, 4096)
FINAL_SHAPES = [(4096, 4096, 4096), (2048, 2048, 2048), (346, 2560, 1024), (346, 1024, 2560)]
CUBLAS = "cuBLAS"


class Log:
    """Prints and keeps every line for the text log."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)


def tflops(flops: int, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.log = Log()
        self.dev = CUDADevice(args.device, flush_l2=not args.no_flush)
        self.tpl = CudaGemm()
        self.limits = self.dev.info.limits
        self.rng = np.random.default_rng(args.seed)
        self.programs: dict[Config, Any] = {}
        self.verified: dict[Config, dict[str, Any]] = {}
        self.report: dict[str, Any] = {}
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.store = Store(out / "results.sqlite")
        self.bufs: dict[tuple[int, ...], Any] = {}
        self.peer = self.tpl.peer_program(self.dev)

    # ---- helpers ---------------------------------------------------------------------------------------
    def buffers(self, shape: tuple[int, int, int]) -> Any:
        if shape not in self.bufs:
            host = self.tpl.make_inputs(shape, self.rng)
            self.bufs[shape] = (host, self.tpl.upload(self.dev, host, shape))
        return self.bufs[shape][1]

    def ensure_compiled(self, configs: list[Config]) -> dict[Config, Any]:
        todo = [c for c in configs if c not in self.programs]
        if todo:
            self.programs.update(self.tpl.precompile(self.dev, todo, TUNE_SHAPE, self.args.workers))
        return {c: self.programs[c] for c in configs}

    def verify(self, configs: list[Config], verifier: Verifier) -> None:
        for cfg in configs:
            if cfg in self.verified:
                continue
            prog = self.programs[cfg]
            if isinstance(prog, Exception):
                kind = "compile_error" if "NVRTC" in str(prog) else "launch_error"
                self.verified[cfg] = {"status": kind, "message": str(prog).splitlines()[0]}
                continue
            try:
                chk = verifier.check(prog, cfg)
            except TilewiseError as exc:
                self.verified[cfg] = {"status": "launch_error", "message": str(exc).splitlines()[0]}
                continue
            where = shape_key(verifier.shape)
            self.verified[cfg] = {"status": "ok" if chk.ok else "wrong",
                                  "message": f"verified at {where}: {chk.message}",
                                  "rel_err": chk.rel_err, "max_abs_err": chk.max_abs_err,
                                  "registers": prog.meta.get("registers"), "local_bytes": prog.meta.get("local_bytes")}

    def time_configs(self, configs: list[Config], shape: tuple[int, int, int], rounds: int,
                     with_cublas: bool = False, budget_s: float = 30.0) -> dict[Any, Any]:
        bufs = self.buffers(shape)
        cands: dict[Any, Any] = {c: self.tpl.launches(self.programs[c], bufs, c, shape) for c in configs}
        if with_cublas:
            cands[CUBLAS] = self.tpl.peer_launches(self.peer, bufs, shape)
        m = measure(self.dev, cands, warmup=1, min_rounds=rounds, max_rounds=rounds, budget_s=budget_s, rng=self.rng)
        return m.stats

    def put(self, cfg: Config, shape: tuple[int, int, int], status: str, message: str = "", stats: Any = None,
            extra: dict[str, Any] | None = None) -> None:
        # the same key as `tilewise tune` uses, so `tilewise store import` of these results resumes a tune
        r = Result(self.dev.info.fingerprint, self.tpl.name, config_source_hash(self.tpl, cfg), shape_key(shape),
                   cfg.key(), status, message,
                   version=tilewise.__version__, created=time.time(),
                   tile_waste=self.tpl.tile_waste(cfg, shape), **(extra or {}))
        if stats is not None:
            r.median_ms, r.p20_ms, r.p80_ms = stats.median_ms, stats.p20_ms, stats.p80_ms
            r.ci_lo_ms, r.ci_hi_ms, r.samples = stats.ci95_ms[0], stats.ci95_ms[1], stats.n
            r.gflops = self.tpl.flops(shape) / (stats.median_ms * 1e-3) / 1e9
        self.store.put(r)

    # ---- stages ----------------------------------------------------------------------------------------
    def device_facts(self) -> None:
        info = self.dev.info
        self.report["device"] = info.as_dict()
        self.report["host"] = {"python": platform.python_version(), "argv": sys.argv}
        lim = info.limits
        self.log(f"device {info.name} cc {lim.compute_capability}, driver {info.driver}, {lim.multiprocessors} SMs, "
                 f"L2 {info.extra.get('l2_cache_bytes', 0) >> 20} MiB")
        self.log(f"  shared/block {lim.max_workgroup_storage_bytes} (opt-in {lim.shared_bytes_per_block_optin}), "
                 f"shared/SM {lim.shared_bytes_per_multiprocessor}, regs/block {lim.registers_per_block}, "
                 f"regs/SM {lim.registers_per_multiprocessor}, threads/block {lim.max_invocations_per_workgroup}, "
                 f"threads/SM {lim.max_threads_per_multiprocessor}")
        flush = "on" if self.dev.flush_l2 else "off"
        self.log(f"  fingerprint {info.fingerprint}; timer CUDA events; L2 flush {flush}")

    def seed_table(self) -> None:
        space = self.tpl.space("seed")
        shape = TUNE_SHAPE
        self.log(f"\n== seed 003: 16 hand-picked points at {shape_key(shape)} ==")
        legal, illegal = space.split(self.limits)
        t0 = time.perf_counter()
        self.ensure_compiled(legal)
        self.verify(legal, Verifier(self.tpl, self.dev, VERIFY_SHAPE, self.rng))
        ok = [c for c in legal if self.verified[c]["status"] == "ok"]
        stats = self.time_configs(ok, shape, self.args.rounds, with_cublas=True)
        cub = stats[CUBLAS].median_ms
        flops = self.tpl.flops(shape)
        rows = []
        self.log(f"{'rank':>4} {'config':<40} {'ms':>7} {'TFLOP/s':>8} {'%cuBLAS':>8} {'tie':>4} {'regs':>5} note")
        rank = 0
        for key, st, group in tie_groups(stats):
            if key == CUBLAS:
                self.log(f"{'':>4} {'cuBLAS sgemm (fp32, TF32 off)':<40} {st.median_ms:7.3f} "
                         f"{tflops(flops, st.median_ms):8.2f} {100.0:8.1f} {group:>4}")
                rows.append({"config": CUBLAS, "median_ms": st.median_ms, "group": group})
                continue
            v = self.verified[key]
            rank += 1
            note = "kernel 7 shape" if tuple(key.values()) == KERNEL7 else (
                "seed's winner" if tuple(key.values()) == SEED_WINNER else "")
            self.log(f"{rank:>4} {self.tpl.describe(key):<40} {st.median_ms:7.3f} {tflops(flops, st.median_ms):8.2f} "
                     f"{100 * cub / st.median_ms:8.1f} {group:>4} {v.get('registers', ''):>5} {note}")
            rows.append({"config": key.key(), "describe": self.tpl.describe(key), **st.as_dict(), "group": group,
                         "tflops": tflops(flops, st.median_ms), "pct_cublas": 100 * cub / st.median_ms, **v})
            self.put(key, shape, "ok", v["message"], st, {"rel_err": v.get("rel_err")})
        for c in legal:
            if self.verified[c]["status"] != "ok":
                self.log(f"   - {self.tpl.describe(c):<40} {self.verified[c]['status']}: {self.verified[c]['message']}")
                rows.append({"config": c.key(), "describe": self.tpl.describe(c), **self.verified[c]})
                self.put(c, shape, self.verified[c]["status"], self.verified[c]["message"])
        for c, why in illegal:
            self.log(f"   x {self.tpl.describe(c):<40} illegal: {why[0]}")
            rows.append({"config": c.key(), "describe": self.tpl.describe(c), "status": "illegal", "reasons": why})
            self.put(c, shape, "illegal", "; ".join(why))
        self.seed_ranked = [k for k, _, _ in tie_groups(stats) if k != CUBLAS]
        self.report["seed"] = {"shape": list(shape), "rows": rows, "seconds": time.perf_counter() - t0}

    def sweep(self) -> None:
        args = self.args
        space = self.tpl.space("full")
        shape = TUNE_SHAPE
        self.log(f"\n== full sweep at {shape_key(shape)} (random order, budget {args.budget_s:.0f} s) ==")
        t0 = time.perf_counter()
        legal, illegal = space.split(self.limits)
        t_rules = time.perf_counter() - t0
        budget = Budget(seconds=args.budget_s)
        order = list(get_strategy("random")(space, self.limits, Budget(), args.seed))
        verifier = Verifier(self.tpl, self.dev, VERIFY_SHAPE, self.rng)
        timed: dict[Config, Any] = {}
        t_compile = t_verify = t_time = 0.0
        done = 0
        chunk = max(args.workers * 4, 32)
        while done < len(order) and not budget.out_of_time():
            part = order[done:done + chunk]
            done += len(part)
            t = time.perf_counter()
            self.ensure_compiled(part)
            t_compile += time.perf_counter() - t
            t = time.perf_counter()
            self.verify(part, verifier)
            t_verify += time.perf_counter() - t
            ok = [c for c in part if self.verified[c]["status"] == "ok"]
            t = time.perf_counter()
            if ok:
                timed.update(self.time_configs(ok, shape, args.sweep_rounds))
            t_time += time.perf_counter() - t
            best = min(timed.items(), key=lambda kv: kv[1].median_ms) if timed else None
            self.log(f"  {done:5d}/{len(order)} configs  {time.perf_counter() - t0:6.1f} s  best so far "
                     + (f"{self.tpl.describe(best[0])} {best[1].median_ms:.3f} ms" if best else "-"))
        seconds = time.perf_counter() - t0
        status: dict[str, int] = {}
        for c in order[:done]:
            v = self.verified[c]
            status[v["status"]] = status.get(v["status"], 0) + 1
            self.put(c, shape, v["status"], v["message"], timed.get(c), {"rel_err": v.get("rel_err")})
        ranked = sorted(timed.items(), key=lambda kv: kv[1].median_ms)
        flops = self.tpl.flops(shape)
        self.log(f"  grid {space.size} configs: {len(legal)} legal, {len(illegal)} rejected by the rules "
                 f"({t_rules:.1f} s); tried {done}: {status}")
        self.log(f"  compile {t_compile:.1f} s ({args.workers} threads), verify {t_verify:.1f} s, time {t_time:.1f} s, "
                 f"total {seconds:.1f} s")
        rejected: dict[str, int] = {}
        for _, why in illegal:
            rule = why[0].split(":")[0]
            rejected[rule] = rejected.get(rule, 0) + 1
        self.log(f"  rejected by first failing rule: {rejected}")
        self.log(f"  top 10 at {shape_key(shape)} (short timing; finals re-time):")
        for c, st in ranked[:10]:
            v = self.verified[c]
            self.log(f"    {self.tpl.describe(c):<40} {st.median_ms:7.3f} ms {tflops(flops, st.median_ms):6.2f} TFLOP/s"
                     f" regs {v.get('registers')} spill {v.get('local_bytes')}")
        bad = [(c, v) for c, v in self.verified.items() if v["status"] not in ("ok",)]
        for c, v in bad[:10]:
            self.log(f"    ! {self.tpl.describe(c)} {v['status']}: {v['message']}")
        self.report["sweep"] = {
            "shape": list(shape), "grid": space.size, "legal": len(legal), "illegal": len(illegal),
            "rejected_by_rule": rejected, "tried": done, "status": status, "seconds": seconds,
            "seconds_compile": t_compile, "seconds_verify": t_verify, "seconds_time": t_time,
            "compiled": sum(1 for c in order[:done] if not isinstance(self.programs.get(c), Exception)),
            "measured": len(timed), "budget_s": args.budget_s,
            "ranked": [{"config": c.key(), "describe": self.tpl.describe(c), **st.as_dict(), **self.verified[c]}
                       for c, st in ranked],
        }
        self.sweep_ranked = [c for c, _ in ranked]

    def finals(self) -> None:
        args = self.args
        verified_ok = [c for c, v in self.verified.items() if v["status"] == "ok"]
        best4096 = self.sweep_ranked[0] if self.sweep_ranked else None
        rows = []
        self.log("\n== finals: tuned best vs cuBLAS fp32 (TF32 off) ==")
        self.log(f"{'shape':<16} {'pick':<40} {'ms':>8} {'TFLOP/s':>8} {'cuBLAS ms':>9} {'TFLOP/s':>8} {'ratio':>6} "
                 f"{'err64':>8} {'vs cuBLAS':>9} {'cuBLAS err64':>12}")
        for shape in FINAL_SHAPES:
            flops = self.tpl.flops(shape)
            pool = [c for c in verified_ok if not self.tpl.shape_problems(c, shape)]
            if shape == TUNE_SHAPE:
                short = list(self.sweep_ranked[: args.finalists])
            else:
                st = self.time_configs(pool, shape, 3)
                short = [c for c, _ in sorted(st.items(), key=lambda kv: kv[1].median_ms)[: args.finalists]]
            if best4096 is not None and best4096 not in short:
                short.append(best4096)
            stats = self.time_configs(short, shape, args.rounds, with_cublas=True, budget_s=60)
            cub = stats.pop(CUBLAS)
            pick, pst = min(stats.items(), key=lambda kv: kv[1].median_ms)
            check = self.check_at_shape(pick, shape)
            tie = any(k == CUBLAS for k, _, g in tie_groups({**stats, CUBLAS: cub}) if g == 1)
            row = {"shape": list(shape), "pick": pick.key(), "describe": self.tpl.describe(pick), **pst.as_dict(),
                   "tflops": tflops(flops, pst.median_ms), "cublas": cub.as_dict(),
                   "cublas_tflops": tflops(flops, cub.median_ms), "ratio": cub.median_ms / pst.median_ms,
                   "cublas_in_winning_tie_group": tie, **check,
                   "tile_waste": self.tpl.tile_waste(pick, shape),
                   "finalists": {c.key(): s.as_dict() for c, s in stats.items()}}
            if best4096 is not None and best4096 != pick:
                b = stats[best4096]
                row["best4096"] = {"config": best4096.key(), **b.as_dict(), "ratio": cub.median_ms / b.median_ms}
            rows.append(row)
            self.put(pick, shape, "ok" if check["ok"] else "wrong", check["message"], pst,
                     {"rel_err": check["rel_err"]})
            self.log(f"{shape_key(shape):<16} {self.tpl.describe(pick):<40} {pst.median_ms:8.4f} "
                     f"{row['tflops']:8.2f} {cub.median_ms:9.4f} {row['cublas_tflops']:8.2f} {row['ratio']:6.3f} "
                     f"{check['rel_err']:8.1e} {check['rel_vs_cublas']:9.1e} {check['cublas_rel_err']:12.1e}")
            if check["cublas_rel_err"] > 1e-4:
                self.log("  warning: cuBLAS is far from float64 here: TF32 may be on (unset CUPY_TF32)")
            if "best4096" in row:
                self.log(f"{'':<16}   (4096-best {self.tpl.describe(best4096)} here: "
                         f"{row['best4096']['median_ms']:.4f} ms, ratio {row['best4096']['ratio']:.3f})")
        self.report["finals"] = rows

    def check_at_shape(self, cfg: Config, shape: tuple[int, int, int]) -> dict[str, Any]:
        """Run once on fresh inputs with a poisoned output; compare with float64 (GPU DGEMM) and cuBLAS fp32."""
        cp = self.dev._cp
        host = self.tpl.make_inputs(shape, self.rng)
        bufs = self.tpl.upload(self.dev, host, shape)
        self.tpl.poison(self.dev, bufs, shape)
        self.dev.run(self.tpl.launches(self.programs[cfg], bufs, cfg, shape))
        out = self.tpl.read_output(self.dev, bufs, shape)
        a = cp.asarray(host["a"], dtype=cp.float64)
        b = cp.asarray(host["b"], dtype=cp.float64)
        ref = cp.asnumpy(a @ b)
        chk = compare(out, ref, self.tpl.dtype)
        self.dev.run(self.tpl.peer_launches(self.peer, bufs, shape))
        cub = self.tpl.read_output(self.dev, bufs, shape).astype(np.float64)
        rel_cub = float(np.linalg.norm(out - cub) / np.linalg.norm(cub))
        cub_err = float(np.linalg.norm(cub - ref) / np.linalg.norm(ref))
        return {"ok": chk.ok, "rel_err": chk.rel_err, "max_abs_err": chk.max_abs_err, "message": chk.message,
                "rel_vs_cublas": rel_cub, "cublas_rel_err": cub_err}

    def write(self) -> None:
        self.report["args"] = vars(self.args)
        (self.out / "gemm_cuda.json").write_text(json.dumps(self.report, indent=1, default=_json_default))
        (self.out / "gemm_cuda.txt").write_text("\n".join(self.log.lines) + "\n")
        self.store.close()
        self.log(f"\nwrote {self.out / 'gemm_cuda.json'}, {self.out / 'gemm_cuda.txt'}, {self.out / 'results.sqlite'}")


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    return str(o)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/results/gemm_cuda", help="directory for the JSON/text logs and store")
    p.add_argument("--budget-s", type=float, default=330.0, help="wall-clock bound of the full sweep")
    p.add_argument("--workers", type=int, default=min(32, os.cpu_count() or 4), help="parallel NVRTC compiles")
    p.add_argument("--rounds", type=int, default=30, help="timed rounds for the seed table and finals")
    p.add_argument("--sweep-rounds", type=int, default=5, help="timed rounds per config in the sweep")
    p.add_argument("--finalists", type=int, default=6, help="configs re-timed per final shape")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-flush", action="store_true", help="do not flush L2 between samples")
    p.add_argument("--skip-sweep", action="store_true", help="seed table and finals only (finals use seed points)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    try:
        bench = Bench(args)
    except TilewiseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        bench.device_facts()
        bench.seed_table()
        if args.skip_sweep:
            bench.sweep_ranked = bench.seed_ranked
        else:
            bench.sweep()
        bench.finals()
    except Exception as exc:  # keep what was measured: the logs are written either way
        bench.report["error"] = f"{type(exc).__name__}: {exc}"
        bench.log(f"\nerror: {bench.report['error']}")
        raise
    finally:
        bench.report["seconds_total"] = time.perf_counter() - t0
        bench.log(f"\ntotal {bench.report['seconds_total']:.0f} s")
        bench.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
