"""gemm-f16 on Dawn's subgroup matrices against cuBLAS (torch.matmul f16 and f32) on the same GPU, in one call.

    python bench/gemm_dawn.py --out results.json [--sample 48] [--climb 0] [--rounds 30] [--seed 0] [--unchecked]

In order, each step logged and caught so that one failure never ends the run:

1. the Dawn adapter(s): name, toggles, features, subgroup sizes and `subgroup_matrix_configs`;
2. the numerics tests (`tests/dawn/test_sgmat_numerics.py`, a pytest subprocess): every output against float64;
3. per shape (4096^3, 1024^3 and the lfm2-350m matmuls at M=346), tuning through the one engine
   (`tilewise.tune.tuner.tune`): the seed space at the device's subgroup size, then a random sample of the full
   space, then (`--climb N`) N more configs hill-climbing from the fastest, every candidate verified before it is
   timed;
4. a race of the best few against torch.matmul on f16 and f32 tensors (cuBLAS): interleaved rounds in a fresh
   random order, Dawn timed with its GPU timestamps (quantization off), torch with CUDA events; medians, 95%
   intervals and ratios;
5. a table, and JSON to --out (written after every shape, atomically).

With `--unchecked` every shape is tuned twice, on the Dawn device as it is (robustness on) and on a second one
without robustness (`disable_robustness`; its verification guards the output with canary words), and the race has
both devices' best configs beside cuBLAS, so the table shows what the bounds checks cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))  # bench_args, also where this file is loaded as a module


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_json(path: str, obj: Any) -> None:
    """Atomic: a temporary file in the same folder, then a rename."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


def shapes() -> list[tuple[str, tuple[int, int, int]]]:
    """4096^3, 1024^3 and the lfm2-350m matmuls (M=346 rows, the classifier's prompt)."""
    from tilewise.model.config import preset

    cfg = preset("lfm2-350m")
    h, f = cfg.hidden_size, cfg.ffn_dim
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    return [("square 4096", (4096, 4096, 4096)), ("square 1024", (1024, 1024, 1024)),
            ("lfm2 out/proj", (346, h, h)), ("lfm2 w1|w3", (346, f, h)), ("lfm2 w2", (346, h, f)),
            ("lfm2 conv in", (346, 3 * h, h)), ("lfm2 qkv", (346, qkv, h))]


def adapter_section(dev: Any) -> dict[str, Any]:
    from tilewise.devices import dawn

    info = dev.info.as_dict()
    info["device_toggles"] = list(getattr(dev, "toggles", ()))
    info["enabled_features"] = sorted(dev.enabled_features)
    info["all_dawn_adapters"] = [i.as_dict() for i in dawn.list_adapters()]
    log(f"dawn device: {dev.info.name} ({dev.info.api}, {dev.info.adapter_type}), fingerprint {dev.info.fingerprint}")
    log(f"  toggles: {', '.join(info['device_toggles'])}")
    log(f"  subgroups {dev.info.limits.subgroup_size_min}..{dev.info.limits.subgroup_size_max}; fragments: "
        + ", ".join(c.label() for c in dev.info.limits.subgroup_matrix_configs or ()))
    return info


def numerics_section() -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
           str(ROOT / "tests" / "dawn" / "test_sgmat_numerics.py")]
    log("numerics: " + " ".join(cmd))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-30:]
    for line in tail[-8:]:
        log("  " + line)
    return {"returncode": proc.returncode, "passed": proc.returncode == 0, "seconds": time.perf_counter() - t0,
            "tail": tail}


def candidates(tpl: Any, dev: Any, sample: int, seed: int, extra: str | None = None) -> list[Any]:
    """The seed points at the device's subgroup size, then the `extra` configs (`NAME=V,...;...`, or `@FILE`
    holding that text; each must be legal here), then `sample` legal configs of the full space."""
    space, limits = tpl.space("full"), dev.info.limits
    from tilewise.kernels.gemm.sgmat import device_subgroup_size
    from tilewise.tune.sweep import sweep_candidates

    sg = device_subgroup_size(limits)
    seeds = [space.config({**dict(c), "SG": sg}) for c in tpl.space("seed")]
    picked = list(dict.fromkeys(c for c in seeds if space.is_legal(c, limits)))
    if extra:
        text = Path(extra[1:]).read_text().strip() if extra.startswith("@") else extra
        picked += [c for c in sweep_candidates(tpl, limits, text) if c not in picked]
    picked += [c for c in space.sample(sample, seed=seed, limits=limits) if c not in picked]
    return picked


def tune_shape(tpl: Any, dev: Any, store: Any, shape: tuple[int, int, int], configs: list[Any],
               rounds: int, climb: int = 0) -> tuple[list[Any], dict[str, Any]]:
    """Evaluate `configs` at `shape` through the engine (compile, verify, time, store) and, with `climb` > 0, that
    many more configs hill-climbing from the fastest of them (`tune.search.climb`); then race the best 8 again in
    one interleaved measurement. Returns the ok outcomes best first and a JSON summary."""
    import functools

    from tilewise.tune.engine import Engine, Item
    from tilewise.tune.search import Budget
    from tilewise.tune.search import climb as climb_search
    from tilewise.tune.tuner import tune

    engine = Engine(dev, store, measure_kw={"min_rounds": min(10, rounds), "max_rounds": rounds})
    if climb > 0:
        outcomes = tune(tpl, dev, shape, space="full", strategy=functools.partial(climb_search, start=configs),
                        budget=Budget(count=len(configs) + climb), final_race=0, engine=engine).rows
    else:
        outcomes = engine.evaluate([Item(tpl, c, shape) for c in configs])
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    failures = [{"config": o.config.key(), "status": o.status, "reason": o.reason} for o in outcomes
                if o.status not in ("ok", "illegal")][:20]
    log(f"  evaluated {len(outcomes)}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for f in failures[:5]:
        log(f"    {f['status']}: {f['config']}: {f['reason'][:200]}")
    ok = sorted((o for o in outcomes if o.status == "ok" and o.stats is not None), key=lambda o: o.median_ms)
    if len(ok) > 1:
        engine.race([o.item for o in ok[:8]], outcomes=ok[:8])
        ok = sorted(ok, key=lambda o: o.median_ms)
    return ok, {"counts": counts, "failures": failures,
                "outcomes": [o.as_json() for o in outcomes if o.status != "illegal"]}


def race_torch(tpl: Any, runs: list[tuple[str, Any, list[Any]]], shape: tuple[int, int, int], rounds: int,
               seed: int) -> dict[str, Any]:
    """Interleaved rounds: each round times every Dawn candidate (GPU timestamps; `runs` holds (label prefix,
    device, best outcomes) per Dawn device) and torch f16 / f32 matmul (CUDA events), in a fresh random order; 5 runs
    per sample, the sample is their mean."""
    import torch

    import bench_args
    from tilewise.tune.measure import summarize

    M, N, K = shape
    rng = np.random.default_rng(seed)
    host = tpl.problem.make_inputs(shape, rng)
    launches = {}
    for prefix, dev, best in runs:
        bufs = tpl.upload(dev, host, shape)
        for o in best:
            prog = tpl.compile(dev, o.config, shape)
            launches[f"{prefix} {o.config}"] = (dev, tpl.launches(prog, bufs, o.config, shape))
    a16 = torch.from_numpy(host["a"]).cuda()
    b16 = torch.from_numpy(host["b"]).cuda()
    a32, b32 = a16.float(), b16.float()
    torch.backends.cuda.matmul.allow_tf32 = False  # cuBLAS fp32 as fp32, not tf32
    reps = 5

    def dawn_ms(dev: Any, ls: list[Any]) -> float:  # a run is all its launches (split-K: slices, then the sum)
        return float(np.sum(dev.time(list(ls) * reps))) / reps

    timers = {**{k: (lambda d=d, ls=ls: dawn_ms(d, ls)) for k, (d, ls) in launches.items()},
              "cuBLAS f16 (torch)": bench_args.cuda_event_ms(lambda: torch.matmul(a16, b16), reps),
              "cuBLAS f32 (torch)": bench_args.cuda_event_ms(lambda: torch.matmul(a32, b32), reps)}
    samples = bench_args.interleaved(timers, rounds, rng)
    flops = 2 * M * N * K
    out = {}
    for k, xs in samples.items():
        s = summarize(xs, rng)
        out[k] = {**s.as_dict(), "tflops": flops / s.median_ms / 1e9, "samples_ms": [float(x) for x in xs]}
    return out


def _ratio(peer: dict[str, Any], mine: dict[str, Any]) -> str:
    """peer median / mine as `1.23x`, or `tie` / `noisy` where the race cannot rank the two."""
    from tilewise.tune.measure import compare, summarize

    if not peer.get("samples_ms") or not mine.get("samples_ms"):  # a record written before samples were kept
        return f"{peer['median_ms'] / mine['median_ms']:.2f}x"
    return compare(summarize(peer["samples_ms"]), summarize(mine["samples_ms"])).times()


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'shape':<30} {'robustness':<10} {'dawn best':>10} {'TFLOP/s':>8} {'/cuBLAS16':>9} {'/cuBLAS32':>9} "
            f"{'/checked':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        race = r.get("race") or {}
        label = f"{r['name'] + ' ' + 'x'.join(map(str, r['shape'])):<30}"
        checked = None
        f16, f32 = race.get("cuBLAS f16 (torch)"), race.get("cuBLAS f32 (torch)")
        for prefix, mode in (("dawn ", "on"), ("unchecked ", "off")):
            dawn = [v for k, v in race.items() if k.startswith(prefix)]
            if not dawn:
                if mode == "on":
                    lines.append(f"{label} {mode:<10} {'-':>10}")
                continue
            best = min(dawn, key=lambda v: v["median_ms"])
            ratio16 = _ratio(f16, best) if f16 and f16.get("median_ms") else "-"
            ratio32 = _ratio(f32, best) if f32 and f32.get("median_ms") else "-"
            vs = _ratio(checked, best) if checked is not None else "-"
            checked = best if mode == "on" else checked
            lines.append(f"{label} {mode:<10} {best['median_ms']:>8.3f}ms {best['tflops']:>8.1f} {ratio16:>9} "
                         f"{ratio32:>9} {vs:>9}")
    lines.append("ratios: the peer's median / Dawn's (above 1 = Dawn faster; /checked: unchecked against robustness "
                 "on); tie: the 95% intervals overlap; noisy: the samples scatter too much to rank")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON results file (written atomically after every step)")
    ap.add_argument("--sample", type=int, default=48, help="random configs of the full space per shape")
    ap.add_argument("--climb", type=int, default=0,
                    help="more configs per shape, hill-climbing from the fastest of the seeds and the sample")
    ap.add_argument("--rounds", type=int, default=30, help="timed rounds per race")
    ap.add_argument("--race-top", type=int, default=3, help="best Dawn configs raced against cuBLAS per shape")
    ap.add_argument("--seed", type=int, default=0, help="sampling and input seed")
    ap.add_argument("--configs", default=None,
                    help="configs raced beside the seeds: NAME=V,...;NAME=V,... or @FILE holding that text")
    ap.add_argument("--skip-numerics", action="store_true", help="do not run the numerics tests first")
    ap.add_argument("--only", default=None,
                    help="comma-separated shape names to run (e.g. 'square 4096,lfm2 w1|w3'; default: all)")
    ap.add_argument("--unchecked", action="store_true",
                    help="also tune and race on Dawn without robustness (outputs guarded by canaries when verified)")
    args = ap.parse_args()
    wanted = [s.strip() for s in args.only.split(",")] if args.only else None
    unknown = sorted(set(wanted or ()) - {n for n, _ in shapes()})
    if unknown:  # refused before any device is opened
        log(f"unknown shape names {unknown}: use some of {[n for n, _ in shapes()]}")
        return 2
    os.environ.setdefault("TILEWISE_STORE", str(Path(tempfile.mkdtemp(prefix="gemm-dawn-")) / "results.sqlite"))
    report: dict[str, Any] = {"format": "tilewise-bench-gemm-dawn", "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                              "args": vars(args), "shapes": []}
    try:
        from tilewise.devices import get_device
        from tilewise.kernels.registry import get_template
        from tilewise.tune.store import Store

        dev = get_device("dawn")
        if dev.unchecked:
            raise RuntimeError("TILEWISE_DAWN_UNCHECKED=1 makes both devices unchecked: unset it, use --unchecked")
        report["adapter"] = adapter_section(dev)
        devs = [("dawn", dev)]
        if args.unchecked:
            from tilewise.devices.dawn import DawnDevice

            devs.append(("unchecked", DawnDevice(dev.info.index, disable_robustness=True)))
            log(f"unchecked device: fingerprint {devs[1][1].info.fingerprint}")
        tpl = get_template("gemm-f16", "webgpu")
        store = Store()
    except Exception as exc:
        log(f"no Dawn device: {exc}")
        report["error"] = traceback.format_exc()
        write_json(args.out, report)
        return 1
    write_json(args.out, report)
    if not args.skip_numerics:
        try:
            report["numerics"] = numerics_section()
        except Exception:
            report["numerics"] = {"error": traceback.format_exc()}
            log("numerics failed to run:\n" + report["numerics"]["error"])
        write_json(args.out, report)
    try:
        configs = candidates(tpl, dev, args.sample, args.seed, args.configs)
    except Exception as exc:  # an illegal or unreadable --configs: refused before any timing
        log(f"--configs refused: {exc}")
        return 2
    log(f"{len(configs)} candidates per shape (seed points, --configs, {args.sample} sampled)")
    if not configs:
        why = tpl.space("full").why_illegal(tpl.default_config(),
                                            dev.info.limits)
        log(f"  no legal config on this device; the default config is illegal because: {'; '.join(why)}")
        report["no_legal_config"] = why
    try:
        import torch

        report["torch"] = {"version": torch.__version__, "cuda": torch.cuda.is_available(),
                           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    except Exception as exc:
        report["torch"] = {"error": str(exc)}
    for name, shape in shapes():
        if wanted is not None and name not in wanted:
            continue
        row: dict[str, Any] = {"name": name, "shape": list(shape)}
        report["shapes"].append(row)
        log(f"{name} {shape}")
        runs: list[tuple[str, Any, list[Any]]] = []
        for prefix, d in devs:
            suffix = "" if prefix == "dawn" else f"_{prefix}"
            try:
                ranked, row["tune" + suffix] = tune_shape(tpl, d, store, shape, configs, args.rounds, args.climb)
                row["best" + suffix] = [{"config": o.config.key(), "label": str(o.config), "median_ms": o.median_ms,
                                         "gflops": o.gflops} for o in ranked[:10]]
                for o in ranked[:3]:
                    log(f"    {prefix} {o.config}: {o.median_ms:.4f} ms, {(o.gflops or 0) / 1e3:.1f} TFLOP/s")
                if ranked:
                    runs.append((prefix, d, ranked[:args.race_top]))
            except Exception:
                row["tune_error" + suffix] = traceback.format_exc()
                log(f"  tuning ({prefix}) failed:\n" + row["tune_error" + suffix])
        if runs and report["torch"].get("cuda"):
            try:
                row["race"] = race_torch(tpl, runs, shape, args.rounds, args.seed)
                for k, v in row["race"].items():
                    log(f"    race {k}: {v['median_ms']:.4f} ms [{v['ci95_ms'][0]:.4f}, {v['ci95_ms'][1]:.4f}], "
                        f"{v['tflops']:.1f} TFLOP/s")
            except Exception:
                row["race_error"] = traceback.format_exc()
                log("  race failed:\n" + row["race_error"])
        write_json(args.out, report)
    report["table"] = table(report["shapes"])
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    write_json(args.out, report)
    print(report["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
