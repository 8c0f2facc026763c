"""Seed 003 on an NVIDIA GPU: the warp-tiling SGEMM template against cuBLAS fp32 (TF32 off), in one run.

Every candidate goes through the evaluation engine (`tilewise.tune.engine`): compiled (NVRTC, `--workers` threads
per batch), verified value by value against float64 on fresh inputs with a NaN-poisoned output, timed with CUDA
events (L2 flushed before every sample, candidates interleaved round-robin) and stored. cuBLAS is the template's
peer (`CudaGemm.peer_program`): it is raced through `Engine.race(..., peer=True)`, in the same interleaved
measurement as the configs it is compared with. What it does, in order:

1. Device facts and limits (cudaDeviceProp) and the fingerprint the results are stored under.
2. The seed's 16-point table at 4096^3: legality first (two points are illegal, with the rule), then compile and
   verify (odd shape with partial tiles, float64), then one race of every verified point with cuBLAS; ranked.
3. The full sweep over the legal grid (`tune`, space `full`, random order, bounded by `--budget-s` and
   `--sweep-count`): batches of parallel NVRTC compiles, verification at an odd shape, a short interleaved
   timing at 4096^3.
4. Finals per shape (4096^3, 2048^3, 346x2560x1024, 346x1024x2560): every verified config raced briefly at that
   shape, then the best few raced with many rounds next to cuBLAS; the winner verified at the shape itself
   against float64 (by the engine) and compared with cuBLAS's output on one more input set. Ratio table printed.
5. Writes `gemm_cuda.json` (everything), `gemm_cuda.txt` (the printed tables) and `results.sqlite` (the
   tilewise results store, every outcome the engine recorded) into `--out`. The store is written, not read:
   every run measures everything again.

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
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("CUPY_TF32", "0")  # cuBLAS fp32 must stay fp32 (no TF32 tensor cores)

from tilewise.devices.base import Device
from tilewise.devices.cuda import CUDADevice
from tilewise.errors import TilewiseError
from tilewise.kernels.base import Shape, parse_shape
from tilewise.kernels.gemm.cuda import KERNEL7, SEED_WINNER, CudaGemm
from tilewise.kernels.space import Config
from tilewise.tune.engine import Engine, Item, Outcome
from tilewise.tune.measure import Stats, compare, tie_groups
from tilewise.tune.search import Budget
from tilewise.tune.store import Store, shape_key
from tilewise.tune.tuner import tune

TUNE_SHAPE = (4096, 4096, 4096)
FINAL_SHAPES = [(4096, 4096, 4096), (2048, 2048, 2048), (346, 2560, 1024), (346, 1024, 2560)]
CUBLAS = "cuBLAS"
NAMES = ("M", "N", "K")


class Log:
    """Prints and keeps every line for the text log."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)


class BenchGemm(CudaGemm):
    """The CUDA GEMM template with the bench's compile threads; `at_shape` verifies at the timed shape itself
    instead of the template's cheaper verify shape (the finals' check of each winner)."""

    def __init__(self, workers: int, at_shape: bool = False) -> None:
        super().__init__()
        self.workers, self.at_shape = workers, at_shape

    def precompile(self, device: Device, configs: Sequence[Config], shape: Shape, workers: int | None = None,
                   ) -> dict[Config, Any]:
        return super().precompile(device, configs, shape, workers or self.workers)

    def verify_shape(self, config: Config, shape: Shape) -> Shape:
        return tuple(shape) if self.at_shape else super().verify_shape(config, shape)



def _ratio(cublas: Stats, pick: Stats) -> str:
    """cuBLAS time / the pick's as `0.953`, or `tie` / `noisy` where the race cannot rank the two."""
    vs = compare(cublas, pick)
    return f"{vs.ratio:.3f}" if vs.verdict in ("faster", "slower") else vs.verdict

def tflops(flops: int, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def rounds(n: int, budget_s: float = 30.0) -> dict[str, Any]:
    """Measurement arguments for exactly `n` timed rounds (after one warm-up round)."""
    return {"warmup": 1, "min_rounds": n, "max_rounds": n, "budget_s": budget_s}


def opt(value: Any, spec: str = "") -> str:
    """`value` formatted, or "-" when it is unknown (a device that does not report registers)."""
    return "-" if value is None else format(value, spec)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.log = Log()
        self.dev = CUDADevice(args.device, flush_l2=not args.no_flush)
        self.tpl = BenchGemm(args.workers)
        self.at_shape = BenchGemm(args.workers, at_shape=True)
        self.limits = self.dev.info.limits
        self.tune_shape = parse_shape(args.tune_shape, NAMES)
        self.final_shapes = [parse_shape(s, NAMES) for s in args.shapes.split(";")]
        self.rng = np.random.default_rng(args.seed + 1)  # the inputs of the cuBLAS cross-checks
        self.report: dict[str, Any] = {}
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.store = Store(out / "results.sqlite")
        self.eng = Engine(self.dev, self.store, force=True, seed=args.seed, measure_kw=rounds(args.sweep_rounds),
                          progress=self._progress)
        self.eng.peer_program(self.tpl)  # a refused peer (TF32 on) stops the run before any work
        #: each config's latest outcome at the tuning shape (the seed table's, then the sweep's)
        self.latest: dict[Config, Outcome] = {}
        self.seed_ranked: list[Config] = []
        self.sweep_ranked: list[Config] = []
        self._sweep: tuple[float, float, int] | None = None  # (start, wall-clock start, legal count) in the sweep

    # ---- helpers ---------------------------------------------------------------------------------------
    def facts(self, oc: Outcome) -> dict[str, Any]:
        """What the report keeps of one outcome: status, message, errors, and the compiled kernel's registers."""
        out: dict[str, Any] = {"status": oc.status, "message": oc.reason}
        if oc.rel_err is not None:
            out.update(rel_err=oc.rel_err, max_abs_err=oc.max_abs_err)
        prog = None if oc.status == "illegal" else self.eng.program(oc.item)
        if prog is not None and not isinstance(prog, Exception):
            out.update(registers=prog.meta.get("registers"), local_bytes=prog.meta.get("local_bytes"))
        return out

    def verified(self, shape: Shape, configs: Sequence[Config]) -> list[Outcome]:
        """The configs the engine verifies at `shape` (untimed; verifications are shared with earlier stages)."""
        outs = self.eng.evaluate([Item(self.tpl, c, shape) for c in configs], batch=None, timed=False)
        return [oc for oc in outs if oc.status == "ok"]

    def race(self, outcomes: Sequence[Outcome], n: int, budget_s: float = 30.0) -> tuple[dict[Config, Stats], Stats]:
        """One interleaved race of verified outcomes with cuBLAS, `n` rounds; the engine stores the new times.

        Returns (config -> stats, cuBLAS's stats)."""
        got = self.eng.race([oc.item for oc in outcomes], peer=True, measure_kw=rounds(n, budget_s),
                            outcomes=outcomes)
        if got.peer is None:
            raise RuntimeError(f"cuBLAS was not raced: {got.peer_error or 'no verified config to race it with'}")
        return self.stats(outcomes, got.stats), got.peer

    @staticmethod
    def stats(outcomes: Sequence[Outcome], stats: Sequence[Stats]) -> dict[Config, Stats]:
        return {oc.config: st for oc, st in zip(outcomes, stats)}

    def _progress(self, stage: str, done: int, total: int | None) -> None:
        """During the sweep, a line at the start of each batch: the configs this sweep stored so far, and the best."""
        if self._sweep is None or not stage.startswith("compiling"):
            return
        t0, wall, legal = self._sweep
        mine = [r for r in self.store.query(self.dev.info.fingerprint, self.tpl.name, shape_key(self.tune_shape))
                if r.created >= wall]
        if not mine:
            return
        ok = [r for r in mine if r.status == "ok" and r.median_ms is not None]
        best = min(ok, key=lambda r: r.median_ms) if ok else None
        self.log(f"  {len(mine):5d}/{legal} configs  {time.perf_counter() - t0:6.1f} s  best so far "
                 + (f"{self.tpl.describe(self.tpl.space('full').parse(best.config))} {best.median_ms:.3f} ms"
                    if best else "-"))

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
        shape = self.tune_shape
        self.log(f"\n== seed 003: {space.size} hand-picked points at {shape_key(shape)} ==")
        t0 = time.perf_counter()
        outs = self.eng.evaluate([Item(self.tpl, c, shape) for c in space], batch=None, timed=False)
        self.latest.update({oc.config: oc for oc in outs})
        stats, cub = self.race([oc for oc in outs if oc.status == "ok"], self.args.rounds)
        flops = self.tpl.flops(shape)
        rows = []
        self.log(f"{'rank':>4} {'config':<40} {'ms':>7} {'TFLOP/s':>8} {'%cuBLAS':>8} {'tie':>4} {'regs':>5} note")
        rank = 0
        ranking = tie_groups({**stats, CUBLAS: cub})
        for key, st, group in ranking:
            if key == CUBLAS:
                self.log(f"{'':>4} {'cuBLAS sgemm (fp32, TF32 off)':<40} {st.median_ms:7.3f} "
                         f"{tflops(flops, st.median_ms):8.2f} {100.0:8.1f} {group:>4}")
                rows.append({"config": CUBLAS, "median_ms": st.median_ms, "group": group})
                continue
            v = self.facts(self.latest[key])
            rank += 1
            note = "kernel 7 shape" if tuple(key.values()) == KERNEL7 else (
                "seed's winner" if tuple(key.values()) == SEED_WINNER else "")
            self.log(f"{rank:>4} {self.tpl.describe(key):<40} {st.median_ms:7.3f} {tflops(flops, st.median_ms):8.2f} "
                     f"{100 * cub.median_ms / st.median_ms:8.1f} {group:>4} {opt(v.get('registers')):>5} {note}")
            rows.append({"config": key.key(), "describe": self.tpl.describe(key), **st.as_dict(), "group": group,
                         "tflops": tflops(flops, st.median_ms), "pct_cublas": 100 * cub.median_ms / st.median_ms,
                         **v})
        for oc in outs:
            if oc.status not in ("ok", "illegal"):
                self.log(f"   - {self.tpl.describe(oc.config):<40} {oc.status}: {oc.reason}")
                rows.append({"config": oc.config.key(), "describe": self.tpl.describe(oc.config), **self.facts(oc)})
        for oc in outs:
            if oc.status == "illegal":
                why = oc.reason.split("; ")
                self.log(f"   x {self.tpl.describe(oc.config):<40} illegal: {why[0]}")
                rows.append({"config": oc.config.key(), "describe": self.tpl.describe(oc.config), "status": "illegal",
                             "reasons": why})
        self.seed_ranked = [k for k, _, _ in ranking if k != CUBLAS]
        self.report["seed"] = {"shape": list(shape), "rows": rows, "seconds": time.perf_counter() - t0}

    def sweep(self) -> None:
        args = self.args
        space = self.tpl.space("full")
        shape = self.tune_shape
        self.log(f"\n== full sweep at {shape_key(shape)} (random order, budget {args.budget_s:.0f} s) ==")
        t0 = time.perf_counter()
        legal, illegal = space.split(self.limits)
        t_rules = time.perf_counter() - t0
        before = dict(self.eng.seconds)
        self._sweep = (t0, time.time(), len(legal))
        try:
            res = tune(self.tpl, self.dev, shape, space="full", strategy="random", seed=args.seed, final_race=0,
                       budget=Budget(count=args.sweep_count, seconds=args.budget_s), engine=self.eng,
                       batch=args.sweep_batch or max(args.workers * 4, 32))
        finally:
            self._sweep = None
        seconds = time.perf_counter() - t0
        rows = res.rows
        self.latest.update({r.config: r for r in rows})
        spent = {k: self.eng.seconds[k] - before[k] for k in before}
        status = dict(Counter(r.status for r in rows))
        ranked = sorted((r for r in rows if r.status == "ok" and r.stats), key=lambda r: r.stats.median_ms)
        best = f"{self.tpl.describe(ranked[0].config)} {ranked[0].stats.median_ms:.3f} ms" if ranked else "-"
        self.log(f"  {len(rows):5d}/{len(legal)} configs  {seconds:6.1f} s  best so far {best}")
        flops = self.tpl.flops(shape)
        self.log(f"  grid {space.size} configs: {len(legal)} legal, {len(illegal)} rejected by the rules "
                 f"({t_rules:.1f} s); tried {len(rows)}: {status}")
        self.log(f"  compile {spent['compile']:.1f} s ({args.workers} threads), verify {spent['verify']:.1f} s, "
                 f"time {spent['measure'] + spent['inputs']:.1f} s, total {seconds:.1f} s")
        rejected: dict[str, int] = {}
        for _, why in illegal:
            rule = why[0].split(":")[0]
            rejected[rule] = rejected.get(rule, 0) + 1
        self.log(f"  rejected by first failing rule: {rejected}")
        self.log(f"  top 10 at {shape_key(shape)} (short timing; finals re-time):")
        for r in ranked[:10]:
            v = self.facts(r)
            self.log(f"    {self.tpl.describe(r.config):<40} {r.stats.median_ms:7.3f} ms "
                     f"{tflops(flops, r.stats.median_ms):6.2f} TFLOP/s regs {opt(v.get('registers'))} "
                     f"spill {opt(v.get('local_bytes'))}")
        for r in [r for r in rows if r.status != "ok"][:10]:
            self.log(f"    ! {self.tpl.describe(r.config)} {r.status}: {r.reason}")
        self.report["sweep"] = {
            "shape": list(shape), "grid": space.size, "legal": len(legal), "illegal": len(illegal),
            "rejected_by_rule": rejected, "tried": len(rows), "status": status, "seconds": seconds,
            "seconds_compile": spent["compile"], "seconds_verify": spent["verify"],
            "seconds_time": spent["measure"] + spent["inputs"],
            "compiled": sum(1 for r in rows if not isinstance(self.eng.program(r.item), Exception)),
            "measured": len(ranked), "budget_s": args.budget_s,
            "ranked": [{"config": r.config.key(), "describe": self.tpl.describe(r.config), **r.stats.as_dict(),
                        **self.facts(r)} for r in ranked],
        }
        self.sweep_ranked = [r.config for r in ranked]

    def finalists(self, shape: Shape, best: Config | None) -> list[Outcome]:
        """The verified outcomes raced against cuBLAS at `shape`: at the tuning shape the sweep's fastest; at
        another shape the fastest of a brief race of every verified config legal there; plus the tuning shape's
        best wherever it is legal."""
        n = self.args.finalists
        if shape == self.tune_shape:
            return [self.latest[c] for c in self.sweep_ranked[:n]]
        pool = [c for c, oc in self.latest.items() if oc.status == "ok" and not self.tpl.shape_problems(c, shape)]
        outs = self.verified(shape, pool)
        brief = self.stats(outs, self.eng.race([oc.item for oc in outs], measure_kw=rounds(3), outcomes=outs).stats)
        chosen = sorted(outs, key=lambda oc: brief[oc.config].median_ms)[:n]
        chosen += [oc for oc in outs if oc.config == best and oc not in chosen]
        return chosen

    def finals(self) -> None:
        args = self.args
        best4096 = self.sweep_ranked[0] if self.sweep_ranked else None
        rows = []
        self.log("\n== finals: tuned best vs cuBLAS fp32 (TF32 off) ==")
        self.log(f"{'shape':<16} {'pick':<40} {'ms':>8} {'TFLOP/s':>8} {'cuBLAS ms':>9} {'TFLOP/s':>8} {'ratio':>6} "
                 f"{'err64':>8} {'vs cuBLAS':>9} {'cuBLAS err64':>12}")
        for shape in self.final_shapes:
            flops = self.tpl.flops(shape)
            stats, cub = self.race(self.finalists(shape, best4096), args.rounds, budget_s=60)
            pick, pst = min(stats.items(), key=lambda kv: kv[1].median_ms)
            check = self.check_at_shape(pick, shape)
            tie = any(k == CUBLAS for k, _, g in tie_groups({**stats, CUBLAS: cub}) if g == 1)
            row = {"shape": list(shape), "pick": pick.key(), "describe": self.tpl.describe(pick), **pst.as_dict(),
                   "tflops": tflops(flops, pst.median_ms), "cublas": cub.as_dict(),
                   "cublas_tflops": tflops(flops, cub.median_ms), "ratio": cub.median_ms / pst.median_ms,
                   "vs_cublas": compare(cub, pst).verdict,
                   "cublas_in_winning_tie_group": tie, **check,
                   "tile_waste": self.tpl.tile_waste(pick, shape),
                   "finalists": {c.key(): s.as_dict() for c, s in stats.items()}}
            if best4096 is not None and best4096 != pick and best4096 in stats:
                b = stats[best4096]
                row["best4096"] = {"config": best4096.key(), **b.as_dict(), "ratio": cub.median_ms / b.median_ms}
            rows.append(row)
            self.log(f"{shape_key(shape):<16} {self.tpl.describe(pick):<40} {pst.median_ms:8.4f} "
                     f"{row['tflops']:8.2f} {cub.median_ms:9.4f} {row['cublas_tflops']:8.2f} {_ratio(cub, pst):>6} "
                     f"{opt(check['rel_err'], '8.1e'):>8} {check['rel_vs_cublas']:9.1e} "
                     f"{check['cublas_rel_err']:12.1e}")
            if not check["ok"]:
                self.log(f"  warning: the pick is {check['status']} at this shape: {check['message']}")
            if check["cublas_rel_err"] > 1e-4:
                self.log("  warning: cuBLAS is far from float64 here: TF32 may be on (unset CUPY_TF32)")
            if "best4096" in row:
                self.log(f"{'':<16}   (best at {shape_key(self.tune_shape)} {self.tpl.describe(best4096)} here: "
                         f"{row['best4096']['median_ms']:.4f} ms, ratio {row['best4096']['ratio']:.3f})")
        self.report["finals"] = rows

    def check_at_shape(self, cfg: Config, shape: Shape) -> dict[str, Any]:
        """The winner verified by the engine at the shape itself (fresh inputs, poisoned output, float64), then
        cuBLAS checked against float64 and the winner against cuBLAS on one more input set (the peer is not a
        tilewise candidate, so no engine verifies it; the winner runs the engine's compiled program)."""
        oc = self.eng.evaluate([Item(self.at_shape, cfg, shape)], timed=False)[0]
        t, dev = self.tpl, self.dev
        host = t.make_inputs(shape, self.rng)
        bufs = t.upload(dev, host, shape)
        dev.run(t.peer_launches(self.eng.peer_program(t), bufs, shape))
        cub = t.read_output(dev, bufs, shape).astype(np.float64)
        t.poison(dev, bufs, shape)
        dev.run(t.launches(self.eng.program(Item(t, cfg, shape)), bufs, cfg, shape))
        out = t.read_output(dev, bufs, shape).astype(np.float64)
        ref = t.reference(host, shape)
        return {"ok": oc.status == "ok", "status": oc.status, "rel_err": oc.rel_err, "max_abs_err": oc.max_abs_err,
                "message": oc.reason, "rel_vs_cublas": float(np.linalg.norm(out - cub) / np.linalg.norm(cub)),
                "cublas_rel_err": float(np.linalg.norm(cub - ref) / np.linalg.norm(ref))}

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
    p.add_argument("--tune-shape", default=",".join(map(str, TUNE_SHAPE)),
                   help="M,N,K of the seed table and the sweep (default 4096,4096,4096)")
    p.add_argument("--shapes", default=";".join(",".join(map(str, s)) for s in FINAL_SHAPES),
                   help="final shapes M,N,K separated by ';' (default: 4096^3, 2048^3, 346x2560x1024, 346x1024x2560)")
    p.add_argument("--sweep-count", type=int, default=None, help="most configs the sweep tries (default: no bound)")
    p.add_argument("--sweep-batch", type=int, default=None,
                   help="configs compiled, verified and timed together in the sweep (default: max(4 x workers, 32))")
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
