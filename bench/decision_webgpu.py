"""Decision latency of the NF4 LFM2 classifier on WebGPU (tilewise) vs HF transformers on the same GPU, one run.

`--device dawn` runs tilewise on Dawn (its tuning then lets the subgroup-matrix matmuls compete); `--agreement N`
adds N real game prompts scored by tilewise and by HF in float64 (all 8 scores, the chosen action).

For each preset (lfm2-350m and seed-250m shapes, seeded random weights) and weight format (nf4, f16):
- first `tilewise tune model` for the preset on this GPU (both matmul kernels across rows 1..512, attention
  tile), written to `--out`/dispatch, and a second table in which the f16-arithmetic tiled and split-K variants
  may compete (only where the adapter has shader-f16);
- tilewise WebGPU: 346-token decision latency p50/p90/p99 (host clock around prefill + scores read-back),
  prefix-cached decisions (47 shared tokens), the run without final-row slicing, per-op GPU time (timestamps),
  and the largest |score difference| against tilewise's CPU executor on the same weights (all 8 scores);
  nf4 once more with the f16-arithmetic table (row `nf4 f16-arith`: its score difference is its tolerance),
  and again for each `--submit-first` value (how the decision's launches are split into submissions; default
  row 0: all in one submission, against the device default of growing pieces from 16 launches), and with
  `--compare-record-ahead` once with the device's record-ahead off (commands encoded in each decision's own time);
- HF transformers `Lfm2Model` + Linear(hidden, 8) head on the same GPU in bf16, eager and `torch.compile`,
  same weights (unquantized, bf16), same prompt length, `use_cache=False`, timed the same way (host clock around
  the forward + reading the 8 scores back).
Prints a ratio table at the end and writes `results.json` and `summary.md` into `--out`. A ratio is printed only
where the samples support it (`tilewise.tune.measure.compare`): `tie` when the 95% intervals of the two medians
overlap, `noisy` when either sample set scatters too much to rank. torch shares the process with tilewise's CPU
reference: its OpenMP threads sleep between calls (OMP_WAIT_POLICY=PASSIVE, set before torch loads) and get as many
threads as the BLAS pool; the log's first lines state the setup.

Usage (needs torch with CUDA, transformers, wgpu; nothing installed from this repo):

    PYTHONPATH=src python3 bench/decision_webgpu.py --out bench/results/decision_webgpu

Every section has a time budget; a failing section is recorded with its error and the run goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tilewise.devices.cpu import quiet_torch_threads

OMP_LINE = quiet_torch_threads()  # before torch loads: its OpenMP threads must not spin on the CPU reference's cores

from tilewise.model.bench import PREFIX_TOKENS, bench_model, percentiles, prompts, time_calls  # noqa: E402
from tilewise.tune.measure import compare, summarize  # noqa: E402

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def left(budget_s: float) -> float:
    return budget_s - (time.perf_counter() - T0)


def tune_section(cfg: Any, args: argparse.Namespace, f16_arith: bool) -> dict[str, Any]:
    import tilewise
    from tilewise.model.tune import tune_model

    t = time.perf_counter()
    rows = [int(r) for r in args.tune_rows.split(",")] if args.tune_rows else None
    table = tune_model(tilewise.get_device(args.device), cfg, args.seq, "nf4", rows=rows, n_cand=args.tune_candidates,
                       f16_arith=f16_arith, log=lambda m: log("  " + m), climb=args.tune_climb)
    TABLES[(cfg.name, f16_arith)] = table
    return {"tuned": Path(table.source).name, "seconds": time.perf_counter() - t, "f16_arith": f16_arith,
            "cutoffs": {k: next((r["m_min"] for r in e.ranges if ".rows." not in r["kernel"]), None)
                        for k, e in table.entries.items() if e.family == "matmul"}}


TABLES: dict[tuple[str, bool], Any] = {}


def tilewise_section(ck: Any, cpu_ck: Any, args: argparse.Namespace, dispatch: Any = None,
                     variant: str = "") -> dict[str, Any]:
    from tilewise.model.runtime import Model
    from tilewise.model.webgpu import WebGPUExecutor

    t = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ex = WebGPUExecutor(ck, device=args.device, dispatch=dispatch)
    head = ck.float32("score.weight") if ck.has_head else None
    model = Model(ck, ex, head)
    load_s = time.perf_counter() - t
    cpu = None
    if cpu_ck is not None and not args.no_reference:
        from tilewise.model.cpu import CPUExecutor

        cpu = Model(cpu_ck, CPUExecutor(cpu_ck), cpu_ck.float32("score.weight"))
    res = bench_model(model, args.seq, args.decisions, prefix=PREFIX_TOKENS, cpu_model=cpu,
                      budget_s=max(5.0, min(30.0, left(args.budget_s) / 8)), log=log)
    res["load_s"] = load_s
    res["variant"] = variant
    res["weight_bytes_on_gpu"] = ex.weight_bytes()
    res["notes"] = [str(w.message) for w in caught]
    return res


def hf_decider(ck: Any, cfg: Any, args: argparse.Namespace, compiled: bool, full: list[np.ndarray]) -> Any:
    """HF `Lfm2Model` (bf16, same weights) + the 8-way head on the GPU; returns decide(i) over the prompts `full`."""
    import torch
    import transformers

    from tilewise.devices.cpu import match_torch_threads

    match_torch_threads(torch)
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    hc = transformers.Lfm2Config(**cfg.to_hf_dict())
    with torch.device("cuda"):
        model = transformers.Lfm2Model(hc).to(torch.bfloat16).eval()
    state = {k: torch.from_numpy(ck.float32(k)) for k in ck.names() if k != "score.weight"}
    model.load_state_dict(state, strict=True)
    head = torch.from_numpy(ck.float32("score.weight")).to("cuda", torch.bfloat16)
    fwd = model
    if compiled:
        fwd = torch.compile(model)
    ids = [torch.from_numpy(f).long().cuda()[None] for f in full]

    def decide(i: int) -> np.ndarray:
        with torch.inference_mode():
            h = fwd(input_ids=ids[i], use_cache=False).last_hidden_state  # (1, seq, H)
            return (h[0, -1] @ head.T).float().cpu().numpy()

    return decide


def hf_section(ck: Any, cfg: Any, args: argparse.Namespace, compiled: bool) -> dict[str, Any]:
    import torch
    import transformers

    _, full = prompts(cfg.vocab_size, args.seq, args.decisions + 3, PREFIX_TOKENS)
    decide = hf_decider(ck, cfg, args, compiled, full)
    t = time.perf_counter()
    decide(0)
    first_s = time.perf_counter() - t
    samples = time_calls(decide, args.decisions, 3, budget_s=max(5.0, min(30.0, left(args.budget_s) / 8)))
    lat = percentiles(samples)
    out = {"impl": f"HF transformers Lfm2Model bf16 {'torch.compile' if compiled else 'eager'}",
           "latency_ms_p50": lat["p50"], "latency_ms_p90": lat["p90"], "latency_ms_p99": lat["p99"],
           "latency_samples_ms": samples,
           "decisions_timed": lat["n"], "first_call_s": first_s, "torch": torch.__version__,
           "transformers": transformers.__version__, "gpu": torch.cuda.get_device_name()}
    return out


def alternate_section(ck: Any, f32: Any, cfg: Any, args: argparse.Namespace, dispatch: Any) -> dict[str, Any]:
    """tilewise and HF eager deciding in turn on the same prompts (the order flips every decision), so that both
    see the same host: on a shared machine HF eager's launch-bound latency drifts by tens of percent from one
    section to the next."""
    from tilewise.model.runtime import Model
    from tilewise.model.webgpu import WebGPUExecutor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = WebGPUExecutor(ck, device=args.device, dispatch=dispatch)
    model = Model(ck, ex, ck.float32("score.weight"))
    _, full = prompts(cfg.vocab_size, args.seq, args.decisions + 3, PREFIX_TOKENS)
    hf = hf_decider(f32, cfg, args, False, full)

    def tw(i: int) -> None:
        model.scores(model.prefill(full[i]))

    for i in range(3):  # warm-up, untimed
        tw(-1 - i)
        hf(-1 - i)
    ms: dict[str, list[float]] = {"tilewise": [], "hf": []}
    for i in range(args.decisions):
        order = (("tilewise", tw), ("hf", hf)) if i % 2 == 0 else (("hf", hf), ("tilewise", tw))
        for name, fn in order:
            t0 = time.perf_counter()
            fn(i)
            ms[name].append((time.perf_counter() - t0) * 1e3)
    lat = {k: percentiles(v) for k, v in ms.items()}
    vs_hf = compare(summarize(ms["hf"]), summarize(ms["tilewise"]), ("HF eager", "tilewise"))
    ratios = [h / t for h, t in zip(ms["hf"], ms["tilewise"])]
    log(f"  alternating: tilewise p50 {lat['tilewise']['p50']:.2f} ms, HF eager p50 {lat['hf']['p50']:.2f} ms, "
        f"median per-decision ratio {float(np.median(ratios)):.2f}x")
    return {"decisions": args.decisions, "tilewise_ms": lat["tilewise"], "hf_eager_ms": lat["hf"],
            "ratio_of_p50": lat["hf"]["p50"] / lat["tilewise"]["p50"], "median_pair_ratio": float(np.median(ratios)),
            "verdict": vs_hf.verdict, "ratio_text": vs_hf.times(),
            "pairs_tilewise_faster": int(sum(r > 1 for r in ratios)), "variant": "nf4 f16-arith"}


def game_prompts(count: int, vocab: int, seed: int = 0) -> list[np.ndarray]:
    """Token ids of `count` distinct boards from seeded games (the expert plays, with a random move now and then so
    that boards differ from the expert's own), in the shipped tokenizer."""
    from tilewise.game.engine import Game
    from tilewise.game.expert import Expert
    from tilewise.game.prompt import render_prompt
    from tilewise.game.tokenizer import encode_prompt, load_tokenizer

    tok, expert, rng = load_tokenizer(), Expert(), np.random.default_rng(seed)
    seen: set[bytes] = set()
    out: list[np.ndarray] = []
    game_seed = seed
    while len(out) < count:
        game = Game(game_seed)
        game_seed += 1
        for _ in range(400):
            if game.game_over or len(out) >= count:
                break
            ids = np.asarray(encode_prompt(tok, render_prompt(game)), dtype=np.int64)
            if ids.tobytes() not in seen and int(ids.max()) < vocab:
                seen.add(ids.tobytes())
                out.append(ids)
            action = int(rng.integers(6)) if rng.random() < 0.1 else expert.act(game)
            game.step(action)
    return out


def agreement_section(ck: Any, cfg: Any, args: argparse.Namespace, dispatch: Any) -> dict[str, Any]:
    """tilewise's 8 scores against HF `Lfm2Model` in float64 on the GPU, same (dequantized) weights, over real game
    prompts: the largest score difference and how often the chosen action (argmax of the 6 actions) agrees."""
    import torch
    import transformers

    from tilewise.model.runtime import Model
    from tilewise.model.webgpu import WebGPUExecutor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = WebGPUExecutor(ck, device=args.device, dispatch=dispatch)
    model = Model(ck, ex, ck.float32("score.weight"))
    hc = transformers.Lfm2Config(**cfg.to_hf_dict())
    where = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU only for small presets (a test)
    with torch.device(where):
        ref = transformers.Lfm2Model(hc).to(torch.float64).eval()
    ref.load_state_dict({k: torch.from_numpy(ck.float32(k).astype(np.float64)) for k in ck.names()
                         if k != "score.weight"}, strict=True)
    head = torch.from_numpy(ck.float32("score.weight").astype(np.float64)).to(where)
    ids = game_prompts(args.agreement, cfg.vocab_size)
    diffs, agree, margins = [], 0, []
    for i, x in enumerate(ids):
        mine = np.asarray(model.scores(model.prefill(x)), dtype=np.float64)
        with torch.inference_mode():
            h = ref(input_ids=torch.from_numpy(x)[None].to(where), use_cache=False).last_hidden_state
            want = (h[0, -1] @ head.T).cpu().numpy()
        diffs.append(float(np.max(np.abs(mine - want))))
        top = np.sort(want[:6])
        margins.append(float(top[-1] - top[-2]))
        agree += int(np.argmax(mine[:6]) == np.argmax(want[:6]))
        if i % 50 == 0:
            log(f"  prompt {i}: {len(x)} tokens, max |diff| {diffs[-1]:.2e}")
    out = {"prompts": len(ids), "tokens_median": int(np.median([len(x) for x in ids])),
           "max_abs_score_diff": float(np.max(diffs)), "median_abs_score_diff": float(np.median(diffs)),
           "same_action": agree, "same_action_share": agree / len(ids),
           "reference_top2_margin_median": float(np.median(margins)), "reference": f"HF Lfm2Model float64 ({where})",
           "device": args.device}
    log(f"  agreement: {agree}/{len(ids)} same action, max |score diff| {out['max_abs_score_diff']:.2e}")
    return out


def run_section(results: list[dict[str, Any]], name: str, fn: Any, *a: Any, need_s: float = 30.0,
                budget_s: float = 540.0) -> dict[str, Any] | None:
    if left(budget_s) < need_s:
        log(f"skip {name}: {left(budget_s):.0f} s left, it needs about {need_s:.0f} s")
        results.append({"section": name, "skipped": f"time budget ({left(budget_s):.0f} s left)"})
        return None
    log(f"start {name}")
    try:
        res = fn(*a)
        res["section"] = name
        results.append(res)
        return res
    except Exception as exc:  # a failing section is a result; the run goes on
        log(f"FAILED {name}: {type(exc).__name__}: {exc}")
        results.append({"section": name, "error": f"{type(exc).__name__}: {exc}",
                        "traceback": traceback.format_exc(limit=6)})
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/decision_webgpu", help="output folder")
    ap.add_argument("--presets", default="lfm2-350m,seed-250m")
    ap.add_argument("--weights", default="nf4,f16")
    ap.add_argument("--seq", type=int, default=346)
    ap.add_argument("--decisions", type=int, default=50)
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting sections after this many seconds")
    ap.add_argument("--no-hf", action="store_true", help="skip HF transformers")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--no-reference", action="store_true", help="skip the CPU score comparison")
    ap.add_argument("--no-tune", action="store_true", help="use the device's existing table (or the defaults)")
    ap.add_argument("--no-f16-arith", action="store_true", help="skip the f16-arithmetic row")
    ap.add_argument("--submit-first", default="0",
                    help="also time the f16-arithmetic decision with other submission pieces (the device's "
                         "submit_first_launches: this many launches first, then twice as many each time; 0: all "
                         "in one submission); a comma list times each, empty: none")
    ap.add_argument("--compare-record-ahead", action="store_true",
                    help="also time the f16-arithmetic decision with the device's record_ahead off (every decision "
                         "encodes its commands before the GPU can start on them)")
    ap.add_argument("--only-f16-arith", action="store_true",
                    help="nf4 only with the f16-arithmetic table: skip the plain tuning and the plain nf4 row "
                         "(a shorter run when the f16-arithmetic kernels are what changed)")
    ap.add_argument("--tune-candidates", type=int, default=6, help="random configs per kernel when tuning")
    ap.add_argument("--tune-climb", type=int, default=0, metavar="N",
                    help="per matmul shape, N more configs hill-climbing from the best (`tune model --climb`)")
    ap.add_argument("--alternate", action="store_true",
                    help="also time tilewise (nf4, f16-arith table) and HF eager deciding in turn")
    ap.add_argument("--tune-rows", default=None, help="row counts to tune at, e.g. 1,64,346 (default 1..512)")
    ap.add_argument("--device", default="webgpu", help="webgpu (wgpu-native), dawn, or an indexed name")
    ap.add_argument("--agreement", type=int, default=0, metavar="N",
                    help="also score N real game prompts with tilewise (nf4, the last table) and with HF in float64 "
                         "on the GPU (the same dequantized weights): max |score difference| over all 8 scores and "
                         "the share of prompts whose chosen action agrees")
    ap.add_argument("--clock-log", action="store_true",
                    help="sample the NVIDIA GPU's SM clock every 50 ms (nvidia-smi) into clocks.csv and set every "
                         "traced decision beside the nearest sample (results.json: trace_with_clock)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from clock_log import ClockLog, joined

    with ClockLog(out / "clocks.csv") if args.clock_log else contextlib.nullcontext() as clocks:
        meta, results = run_all(args, out)
    if clocks is not None:
        samples = clocks.samples()
        for r in results:
            if r.get("latency_trace"):
                r["trace_with_clock"] = joined(r["latency_trace"], samples)
                slow = sorted((e for e in r["trace_with_clock"] if e["timed"]), key=lambda e: -e["ms"])[:3]
                log(f"  {r.get('section', '?')}: slowest timed decisions " + ", ".join(
                    f"{e['ms']:.2f} ms at {e['sm_mhz']} MHz" for e in slow)
                    + ("" if samples else " (no clock samples: nvidia-smi missing)"))
    doc = {"meta": meta, "results": results}
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    md = summary(results, args)
    (out / "summary.md").write_text(md)
    print(md)
    log(f"wrote results.json and summary.md into {out}")
    return 0


def run_all(args: argparse.Namespace, out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the run's device and options, every section the arguments ask for, in order)."""
    if not args.no_tune:
        import os

        os.environ["TILEWISE_DISPATCH_DIR"] = str(out / "dispatch")  # the tables come back with the results
    from tilewise.model.checkpoint import random_checkpoint
    from tilewise.model.config import preset

    results: list[dict[str, Any]] = []
    import tilewise

    dev = tilewise.get_device(args.device)
    info = dev.info
    log(f"WebGPU adapter: {info.name} ({info.api}, {info.adapter_type}), driver {info.driver}")
    from tilewise.devices.cpu import thread_setup

    threads = f"{thread_setup().line()}; {OMP_LINE}; torch threads matched to BLAS when HF runs"
    log(threads)
    coop = "cooperative-matrix" in info.features
    argv = [out.name if a == str(out) else a for a in sys.argv[1:]]  # no machine paths in the record
    meta = {"adapter": info.as_dict(), "argv": argv, "seq": args.seq, "decisions": args.decisions,
            "cooperative_matrix": ("advertised, not used: wgpu-py 0.32 cannot enable experimental features and "
                                   "wgpu-native implements only 8x8 f32 fragments") if coop else "not advertised",
            "shader_f16": "shader-f16" in info.features, "threads": threads}
    f16a = "shader-f16" in info.features and not args.no_f16_arith
    for name in args.presets.split(","):
        cfg = preset(name)
        if not args.no_tune:
            if not args.only_f16_arith:
                run_section(results, f"tune {name}", tune_section, cfg, args, False, need_s=60,
                            budget_s=args.budget_s)
            if f16a:
                run_section(results, f"tune {name} f16-arith", tune_section, cfg, args, True, need_s=150,
                            budget_s=args.budget_s)
        t = time.perf_counter()
        f32 = random_checkpoint(cfg, seed=0, weights="f32")
        log(f"{name}: random f32 weights in {time.perf_counter() - t:.1f} s")
        for w in args.weights.split(","):
            t = time.perf_counter()
            ck = f32 if w == "f32" else f32.converted(w)
            for k in ck.names():
                ck.get(k)
            log(f"{name}: {w} weights in {time.perf_counter() - t:.1f} s")
            if not (args.only_f16_arith and w == "nf4"):
                run_section(results, f"tilewise {name} {w}", tilewise_section, ck, ck, args, need_s=40,
                            budget_s=args.budget_s)
            table16 = TABLES.get((name, True))
            if w == "nf4" and table16 is not None:
                run_section(results, f"tilewise {name} {w} f16-arith", tilewise_section, ck, ck, args, table16,
                            "f16-arith", need_s=40, budget_s=args.budget_s)
                default_first = dev.submit_first_launches
                for first in submit_firsts(args):  # the same decision submitted otherwise (0: all at once)
                    dev.submit_first_launches = first
                    how = "one submission" if first == 0 else f"submits of {first}, {2 * first}, ... launches"
                    try:
                        run_section(results, f"tilewise {name} {w} f16-arith submit {first}", tilewise_section, ck,
                                    ck, args, table16, f"f16-arith, {how}", need_s=30, budget_s=args.budget_s)
                    finally:
                        dev.submit_first_launches = default_first
                if args.compare_record_ahead:
                    dev.record_ahead = False
                    try:
                        run_section(results, f"tilewise {name} {w} f16-arith no-record-ahead", tilewise_section, ck,
                                    ck, args, table16, "f16-arith, no record-ahead", need_s=30,
                                    budget_s=args.budget_s)
                    finally:
                        dev.record_ahead = True
            del ck
        if not args.no_hf:
            run_section(results, f"hf-eager {name}", hf_section, f32, cfg, args, False, need_s=20,
                        budget_s=args.budget_s)
            if not args.no_compile:  # compiling and timing it took under 30 s wherever it ran; it is the target's peer
                run_section(results, f"hf-compile {name}", hf_section, f32, cfg, args, True, need_s=60,
                            budget_s=args.budget_s)
            table16 = TABLES.get((name, True))
            if args.agreement > 0:
                table = table16 if table16 is not None else TABLES.get((name, False))
                run_section(results, f"agreement {name}", agreement_section, f32.converted("nf4"), cfg, args, table,
                            need_s=60, budget_s=args.budget_s)
            if args.alternate and table16 is not None and "nf4" in args.weights.split(","):
                run_section(results, f"alternate {name}", alternate_section, f32.converted("nf4"), f32, cfg, args,
                            table16, need_s=30, budget_s=args.budget_s)
        del f32
    return meta, results


def submit_firsts(args: argparse.Namespace) -> list[int]:
    return [int(v) for v in str(args.submit_first).split(",") if v.strip() and int(v) >= 0]


def summary(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    by = {r["section"]: r for r in results}
    lines = [f"# Decision latency, {args.seq}-token prompt, batch 1 (p50 ms; host clock, read-back included)", "",
             "| model | impl | p50 ms | p90 ms | p99 ms | vs HF eager | vs torch.compile | prefix-cached p50 | "
             "no final-row slicing p50 | GPU sum of ops ms | max abs score diff vs CPU |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in args.presets.split(","):
        eager = by.get(f"hf-eager {name}", {}).get("latency_samples_ms")
        comp = by.get(f"hf-compile {name}", {}).get("latency_samples_ms")
        keys = [f"tilewise {name} {w}{v}" for w in args.weights.split(",")
                for v in ("", " f16-arith", *(f" f16-arith submit {f}" for f in submit_firsts(args)),
                          " f16-arith no-record-ahead")]
        for key in [*keys, f"hf-eager {name}", f"hf-compile {name}"]:
            r = by.get(key)
            if r is None:
                continue
            if "error" in r or "skipped" in r:
                lines.append(f"| {name} | {key.split(' ')[0]} | {r.get('error') or r.get('skipped')} |"
                             + " |" * 9)
                continue
            p50 = r["latency_ms_p50"]
            impl = f"tilewise {args.device} {r['weights']} {r.get('variant', '')}".strip() if key.startswith(
                "tilewise") else r["impl"].replace(
                "HF transformers Lfm2Model ", "HF ")

            mine = r.get("latency_samples_ms")

            def ratio(ref: list[float] | None, mine: list[float] | None = mine) -> str:
                """HF / this as `1.41x`, or `tie` / `noisy` where the samples cannot rank the two."""
                return compare(summarize(ref), summarize(mine)).times() if ref and mine else "-"

            pc = r.get("prefix_cached", {}).get("latency_ms_p50")
            nf = r.get("no_final_row_slicing", {}).get("latency_ms_p50")
            diff = r.get("max_abs_score_diff")
            gpu = r.get("gpu_ms_sum_of_ops")
            lines.append(f"| {name} | {impl} | {p50:.2f} | {r['latency_ms_p90']:.2f} | {r['latency_ms_p99']:.2f} | "
                         f"{ratio(eager)} | {ratio(comp)} | {'-' if pc is None else f'{pc:.2f}'} | "
                         f"{'-' if nf is None else f'{nf:.2f}'} | {'-' if gpu is None else f'{gpu:.2f}'} | "
                         f"{'-' if diff is None else f'{diff:.2g}'} |")
    lines += ["", "Ratios are speed-ups of the row's implementation (>1x: faster than HF); `tie`: the 95% intervals "
              "of the two medians overlap; `noisy`: the samples scatter too much to rank. HF runs bf16 of the "
              "unquantized weights; tilewise runs the stated format.", ""]
    for r in results:
        if r.get("section", "").startswith("agreement") and "prompts" in r:
            lines.append(f"- {r['section']} ({r['device']}, against {r['reference']}): the same action on "
                         f"{r['same_action']} of {r['prompts']} game prompts ({100 * r['same_action_share']:.1f}%), "
                         f"max |score difference| {r['max_abs_score_diff']:.2e} over all 8 scores (median "
                         f"{r['median_abs_score_diff']:.2e}; the reference's median top-2 margin "
                         f"{r['reference_top2_margin_median']:.2e})")
        if r.get("section", "").startswith("tune") and ("error" in r or "skipped" in r):
            lines.append(f"- {r['section']}: {r.get('error') or r.get('skipped')}")
        if "cutoffs" in r:
            lines.append(f"- {r['section']} ({r['seconds']:.0f} s): tiled kernel from rows " + ", ".join(
                f"{k}: {v}" for k, v in r["cutoffs"].items()))
    for r in results:
        if r.get("section", "").startswith("alternate") and "ratio_of_p50" in r:
            tw, hf = r["tilewise_ms"], r["hf_eager_ms"]
            lines.append(f"- {r['section']} (tilewise {r['variant']} and HF bf16 eager deciding in turn, "
                         f"{r['decisions']} each): tilewise p50 {tw['p50']:.2f} / p90 {tw['p90']:.2f} ms, HF eager "
                         f"p50 {hf['p50']:.2f} / p90 {hf['p90']:.2f} ms; HF/tilewise {r['ratio_text']} "
                         f"(p50s), {r['median_pair_ratio']:.2f}x (median of pairs), tilewise faster in "
                         f"{r['pairs_tilewise_faster']} of {r['decisions']} pairs")
    for r in results:
        if r.get("ops"):
            top = ", ".join(f"{o['name']} {o['ms']:.3f} ms/{o['launches']}" for o in r["ops"][:6])
            lines.append(f"- {r['section']}: top ops {top}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
