"""The classifier on CUDA in one run: the CUDA test group, `tilewise bench --device cuda`, then tilewise CUDA vs HF
transformers bf16 eager vs `torch.compile` on the same GPU (decision latency p50/p90/p99).

Sections, each recorded with its error if it fails (the run goes on):
1. `pytest -m cuda` over the model's CUDA kernel and executor tests (rc, counts, the output's tail);
2. `tilewise bench --device cuda --preset <first preset>` through the command line (its JSON);
3. per preset (seeded random weights, lfm2-350m and seed-250m shapes): tilewise CUDA (nf4) decisions of `--seq`
   tokens timed on the host clock around prefill + reading the 8 scores, per-op GPU time (CUDA events), then HF
   `Lfm2Model` + Linear(hidden, 8) in bf16, eager and `torch.compile`, same weights and prompts, timed the same way
   (bench/decision_webgpu.py's `hf_decider`); the largest |score difference| of tilewise against HF eager.
   tilewise's decisions replay one CUDA graph each (`cuda_graphs` in the JSON, with the captures and replays counted;
   `TILEWISE_CUDA_GRAPHS=0` turns graphs off), and the same decisions are timed again launch by launch
   (`launch_by_launch`), so the graph's saving is measured in the same run; graphs with and without programmatic
   dependent launch, with and without the reductions fused with the next prologue, and with and without split-K
   summed in the matmul race in alternating rounds (`pdl`, `fused_preps`, `serial_reduce`, `--race-rounds`), each
   with a check that both give bit-identical scores, and the first series is timed again after them (`after_races`);
   the executor starts from the dispatch table's raced settings (`measured_settings`); then the same decisions
   through tilewise's WebGPU executor on the same GPU (`--webgpu`, e.g. `webgpu` or `dawn`), with its largest |score
   difference| to CUDA.
Writes `results.json` (date, device, command, every section) into `--out`.

Usage (on a machine with an NVIDIA GPU, CuPy, torch with CUDA and transformers):

    PYTHONPATH=src python3 bench/model_cuda.py --out bench/results/model_cuda
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from tilewise.devices.cpu import quiet_torch_threads  # noqa: E402

OMP_LINE = quiet_torch_threads()  # before torch loads

from tilewise.model.bench import (  # noqa: E402
    PREFIX_TOKENS,
    SETTING_NAMES,
    op_table,
    percentiles,
    prompts,
    race_verdict,
    time_calls,
    verdict_record,
)
from tilewise.model.tune_settings import INEXACT_SETTINGS, race_setting  # noqa: E402
from tilewise.tune.measure import summarize  # noqa: E402

T0 = time.perf_counter()
#: the executor's raced settings (`SETTING_NAMES`) and the key each race has in results.json
RACED = {"pdl": "pdl", "fuse_preps": "fused_preps", "serial_reduce": "serial_reduce", "fold_norm": "fold_norm",
         "fuse_rope": "fuse_rope", "zero_copy": "zero_copy"}
TESTS = ["tests/cuda/test_model_kernels_cuda.py", "tests/cuda/test_model_cuda.py",
         "tests/cuda/test_model_cuda_graph.py", "tests/cuda/test_model_cuda_tune.py",
         "tests/unit/test_model_cuda_plan.py", "tests/unit/test_model_cuda_graph_cache.py",
         "tests/unit/test_model_cuda_nvcc.py",
         "tests/unit/test_model_cuda_nvrtc.py"]


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def section(results: dict[str, Any], name: str, fn: Any, *args: Any) -> Any:
    log(f"{name} ...")
    try:
        out = fn(*args)
    except Exception as exc:  # a failing section is recorded and the run goes on
        results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        log(f"{name} failed: {exc}")
        return None
    results[name] = out
    log(f"{name} done")
    return out


def tests_section(timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", *TESTS]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env)
    tail = (res.stdout + res.stderr)[-6000:]
    summary = next((ln for ln in reversed(tail.splitlines()) if " in " in ln and ("passed" in ln or "failed" in ln)),
                   "")
    return {"command": " ".join(cmd[1:]), "rc": res.returncode, "summary": summary, "tail": tail}


def cli_bench_section(preset: str, out: Path, timeout_s: float) -> dict[str, Any]:
    path = out / f"tilewise_bench_cuda_{preset}.json"
    cmd = [sys.executable, "-m", "tilewise", "bench", "--device", "cuda", "--preset", preset, "--json", str(path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env)
    body = json.loads(path.read_text()) if path.exists() else None
    return {"command": "tilewise " + " ".join(cmd[3:]), "rc": res.returncode,
            "output": (res.stdout + res.stderr)[-4000:], "result": body}


def tilewise_cuda_section(ck: Any, args: argparse.Namespace,
                          device: str | None = None) -> tuple[dict[str, Any], list[np.ndarray]]:
    """tilewise decisions on `device` (default `--device`); the WebGPU section calls it with `--webgpu`."""
    from tilewise.model.runtime import from_checkpoint

    t = time.perf_counter()
    model = from_checkpoint(ck, device=device or args.device, quiet=True)
    load_s = time.perf_counter() - t
    _, full = prompts(ck.config.vocab_size, args.seq, args.decisions + 3, PREFIX_TOKENS)
    scores: dict[int, np.ndarray] = {}

    def decide(i: int) -> None:
        scores[i] = model.scores(model.prefill(full[i % len(full)]))

    t = time.perf_counter()
    decide(0)
    first_s = time.perf_counter() - t
    ex = model.executor
    graphs = bool(getattr(ex, "graphs", False))
    samples = time_calls(decide, args.decisions, 3, budget_s=args.section_s)
    lat = percentiles(samples)
    graph_counts = {k: getattr(ex, k, 0) for k in ("graph_captures", "graph_replays")}
    kept = [scores[i] for i in range(min(5, args.decisions))]  # compared with HF below
    unrolled = None
    if graphs:  # the same decisions launch by launch: what one graph replay per decision saves
        ex.graphs = False
        try:
            unrolled = percentiles(time_calls(decide, args.decisions, 3, budget_s=args.section_s))
        finally:
            ex.graphs = True
    races = args.race_rounds and graphs
    raced = {key: setting_race(model, decide, args, name, SETTING_NAMES[name])
             if races and (name != "pdl" or getattr(ex.dev, "pdl", False)) else None for name, key in RACED.items()}
    # the first series again: the races re-capture the graph at every switch, so a gap between this series and the
    # first one, with the same settings, is the first capture's own (or the GPU's state then)
    again = percentiles(time_calls(decide, args.decisions, 3, budget_s=args.section_s)) if races else None
    timed = hasattr(model.executor, "last_op_times")  # GPU executors time each launch
    ops = op_table(model.executor, full[0]) if timed else []
    out = {"impl": f"tilewise {model.device} nf4", "load_s": load_s, "first_call_s": first_s,
           "latency_ms_p50": lat["p50"], "latency_ms_p90": lat["p90"], "latency_ms_p99": lat["p99"],
           "latency_samples_ms": samples, "decisions_timed": lat["n"], "ops": ops,
           "launches_per_decision": len(model.executor.last_op_times) if timed else None,
           "cuda_graphs": graphs, **graph_counts, **raced,
           "after_races": None if again is None else {f"latency_ms_{k}": again[k] for k in ("p50", "p90", "p99")},
           "measured_settings": getattr(ex, "measured_settings", None),
           "launch_by_launch": None if unrolled is None else {f"latency_ms_{k}": unrolled[k] for k in
                                                              ("p50", "p90", "p99")},
           "device": model.device_choice.line() if model.device_choice else model.device,
           "dispatch_table": getattr(getattr(model.executor, "dispatch", None), "source", None)}
    return out, kept


def setting_race(model: Any, decide: Any, args: argparse.Namespace, attr: str, what: str) -> dict[str, Any]:
    """Graph replays with the executor's `attr` on against off, in alternating rounds on the same prompts
    (`race_modes`), and whether both give the same scores (PDL: the same kernels in the same order, so a
    difference would be a race; fused prologues and serial split-K: the same arithmetic in fewer launches; the norm
    fold rounds differently, so its scores agree within the f16 tolerance, `INEXACT_SETTINGS`)."""
    ex = model.executor
    _, full = prompts(model.config.vocab_size, args.seq, 8, PREFIX_TOKENS, seed=1)
    same, samples = race_setting(ex, attr, decide, lambda: [model.scores(model.prefill(ids)) for ids in full],
                                 args.race_rounds, args.race_per_round)  # (8 prompts, 8 scores) compared
    stats = {m: summarize(v) for m, v in samples.items()}
    verdict = race_verdict(samples, args.race_per_round, "off", "on", (f"without {what}", f"with {what}"))
    return {"setting": attr, "rounds": args.race_rounds, "per_round": args.race_per_round,
            "scores_agree": same, "exact": attr not in INEXACT_SETTINGS,
            "pdl_launches": int(getattr(ex.dev, "pdl_launches", 0)),
            **verdict_record(verdict),
            **{m: {**percentiles(v), "median_ci95_ms": list(stats[m].ci95_ms), "samples_ms": v}
               for m, v in samples.items()}}


def hf_section(ck_f32: Any, args: argparse.Namespace, compiled: bool) -> tuple[dict[str, Any], list[np.ndarray]]:
    import torch
    import transformers

    from decision_webgpu import hf_decider

    _, full = prompts(ck_f32.config.vocab_size, args.seq, args.decisions + 3, PREFIX_TOKENS)
    decide = hf_decider(ck_f32, ck_f32.config, args, compiled, full)
    t = time.perf_counter()
    first = decide(0)
    first_s = time.perf_counter() - t
    samples = time_calls(lambda i: decide(i % len(full)), args.decisions, 3, budget_s=args.section_s)
    lat = percentiles(samples)
    out = {"impl": f"HF transformers Lfm2Model bf16 {'torch.compile' if compiled else 'eager'}",
           "latency_ms_p50": lat["p50"], "latency_ms_p90": lat["p90"], "latency_ms_p99": lat["p99"],
           "latency_samples_ms": samples, "decisions_timed": lat["n"], "first_call_s": first_s,
           "torch": torch.__version__, "transformers": transformers.__version__, "gpu": torch.cuda.get_device_name()}
    return out, [first] + [decide(i) for i in range(1, min(5, args.decisions))]


def plain(v: Any) -> Any:
    """A results tree for JSON: a section's (record, kept scores) pair becomes its record."""
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], dict):
        return v[0]
    return {k: plain(x) for k, x in v.items()} if isinstance(v, dict) else v


def preset_section(preset: str, args: argparse.Namespace, res: dict[str, Any] | None = None,
                   save: Any = None) -> dict[str, Any]:
    """One preset's race; `res` (filled as sections finish) and `save` (called after each) keep a cut run's part."""
    from tilewise.model.runtime import open_checkpoint

    f32 = open_checkpoint(preset, weights="f32", seed=args.seed)
    nf4 = f32.converted("nf4").materialize()
    res = {} if res is None else res
    step = save or (lambda: None)
    tw = section(res, "tilewise_cuda", tilewise_cuda_section, nf4, args)
    step()
    if args.webgpu:  # the same decisions through WGSL on the same GPU (its own dispatch table, if tuned here)
        webgpu = section(res, "tilewise_webgpu", tilewise_cuda_section, nf4, args, args.webgpu)
        step()
        if tw is not None and webgpu is not None:
            res["max_abs_score_diff_webgpu_vs_cuda"] = max(float(np.abs(a - b).max()) for a, b in zip(tw[1],
                                                                                                      webgpu[1]))
    if not args.no_hf:
        # HF runs the NF4 weights dequantized, so a score difference is the kernels' error, not quantization's
        deq = type(f32).from_arrays(f32.config, {k: nf4.float32(k) for k in nf4.names()}, "f32", f"{preset}:nf4-deq")
        eager = section(res, "hf_eager", hf_section, deq, args, False)
        step()
        if not args.no_compile:
            section(res, "hf_compile", hf_section, deq, args, True)
        if tw is not None and eager is not None:
            diffs = [float(np.abs(a - b.astype(np.float32)).max()) for a, b in zip(tw[1], eager[1])]
            res["max_abs_score_diff_vs_hf_eager"] = max(diffs)
    flat = {k: (v[0] if isinstance(v, tuple) else v) for k, v in res.items()}
    base = flat.get("tilewise_cuda", {}).get("latency_ms_p50")
    for k in ("hf_eager", "hf_compile", "tilewise_webgpu"):
        p50 = flat.get(k, {}).get("latency_ms_p50") if isinstance(flat.get(k), dict) else None
        if base and p50:
            flat[f"{k}_over_tilewise_p50"] = p50 / base
    return flat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/model_cuda", help="output folder")
    ap.add_argument("--presets", default="lfm2-350m,seed-250m", help="model presets, comma-separated")
    ap.add_argument("--seq", type=int, default=346, help="prompt tokens per decision")
    ap.add_argument("--decisions", type=int, default=50, help="timed decisions per implementation")
    ap.add_argument("--seed", type=int, default=0, help="seed of the presets' random weights")
    ap.add_argument("--device", default="cuda", help="tilewise's device (cuda, cuda:N; cpu only to try the script)")
    ap.add_argument("--section-s", type=float, default=30.0, help="time budget of one timing section")
    ap.add_argument("--tests-timeout-s", type=float, default=240.0, help="time limit of the test section")
    ap.add_argument("--no-tests", action="store_true", help="skip the CUDA test group")
    ap.add_argument("--no-cli", action="store_true", help="skip `tilewise bench --device cuda`")
    ap.add_argument("--no-hf", action="store_true", help="skip HF transformers (eager and torch.compile)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--race-rounds", type=int, default=20,
                    help="rounds of each setting race (with and without each of the executor's raced settings), "
                         "judged round by round (0 skips them)")
    ap.add_argument("--race-per-round", type=int, default=3, help="decisions per setting per round of those races")
    ap.add_argument("--webgpu", default="webgpu",
                    help="tilewise's WebGPU device raced in the same run (webgpu, dawn, ...; '' skips it)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                               "command": "python3 bench/model_cuda.py " + " ".join(sys.argv[1:]),
                               "omp": OMP_LINE, "seq": args.seq}
    try:
        from tilewise.devices import get_device

        results["device"] = get_device("cuda").info.as_dict()
    except Exception as exc:  # recorded; the sections say what else fails
        results["device"] = {"error": str(exc)}
    presets = [p for p in args.presets.split(",") if p]

    def save() -> None:  # after every section, atomically: a run cut short keeps what it finished
        tmp = out / "results.json.tmp"
        tmp.write_text(json.dumps(plain(results), indent=1, default=str))
        tmp.replace(out / "results.json")

    if not args.no_tests:
        section(results, "tests", tests_section, args.tests_timeout_s)
        save()
    if not args.no_cli and presets:
        section(results, "cli_bench", cli_bench_section, presets[0], out, 300.0)
        save()
    for preset in presets:
        results[f"race_{preset}"] = partial = {}
        section(partial, f"race_{preset}", preset_section, preset, args, partial, save)
        race = partial.pop(f"race_{preset}", None)  # the finished race, or its error beside the sections that ran
        results[f"race_{preset}"] = race if race and "error" not in race else {**plain(partial), **(race or {})}
        save()
    for preset in presets:
        r = results.get(f"race_{preset}") or {}
        line = [preset]
        for k in ("tilewise_cuda", "tilewise_webgpu", "hf_eager", "hf_compile"):
            v = r.get(k) or {}
            if "latency_ms_p50" in v:
                line.append(f"{k} p50 {v['latency_ms_p50']:.2f} p90 {v['latency_ms_p90']:.2f} "
                            f"p99 {v['latency_ms_p99']:.2f} ms"
                            + (f" ({r[k + '_over_tilewise_p50']:.2f}x tilewise cuda)" if k + "_over_tilewise_p50"
                               in r else ""))
            elif "error" in v:
                line.append(f"{k} error")
        for name, key in RACED.items():
            race = (r.get("tilewise_cuda") or {}).get(key)
            if race:
                line.append(f"tilewise cuda with {SETTING_NAMES[name]} p50 {race['on']['p50']:.3f} ms, without "
                            f"{race['off']['p50']:.3f} ({race['verdict']}, {race['speedup']:.3f}x; scores "
                            f"{'bit-identical' if race['exact'] else 'within the f16 tolerance'}: "
                            f"{race['scores_agree']})")
        tw = r.get("tilewise_cuda") or {}
        if tw.get("after_races"):
            line.append(f"tilewise cuda after the races p50 {tw['after_races']['latency_ms_p50']:.3f} ms; the "
                        f"table's settings: {tw.get('measured_settings') or 'none raced'}")
        log(" | ".join(line))
    log(f"wrote {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
