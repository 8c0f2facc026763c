"""Decision latency of the CPU executor against HF transformers' `Lfm2Model` on the CPU, in one run.

A decision is what `tilewise play` does per move: run the prompt (346 tokens, batch 1) and read the 8 scores
of the last position. For each preset (seeded random weights) it times, interleaved round-robin in a fresh
random order per round (so drift hits every variant alike), after warm-up:

- `hf f32`: `Lfm2Model` (torch, SDPA attention, `use_cache=False`) over all 346 tokens, then the head on the
  last row. HF has no CPU NF4 path, so it is also the equal-precision peer of tilewise's NF4 run, whose
  matrices are dequantized to float32 once at load (the NF4 and f32 runs do the same float32 arithmetic);
- `tw <fmt> full`: tilewise, no final-row slicing, no prefix cache;
- `tw <fmt> slice`: final-row slicing (the blocks after the last attention block on the rows the last row needs);
- `tw <fmt> cache`: prefix cache: the first 47 tokens (seed 001's shared prefix) are prefilled once outside
  the timing and each decision extends that base with the 299 remaining tokens;
- `tw <fmt> slice+cache`: both;
- `tw f32 full n=K`: the first K tokens only (K = 47, 150, 250). A line through these and the full prompt
  splits a decision into a fixed part and a per-token part; the prefix cache can only skip the per-token part
  of the tokens it skips, so its saving is also reported against that share.
(NF4 runs the same float32 arithmetic as f32 after load, so only its `full` and `slice+cache` are timed.)

It prints medians with 20th/80th percentiles and ratios, checks every variant's scores against HF's on the same
weights (the NF4 variants against HF running the dequantized NF4 weights),
and writes the table to bench/results/ with the date, device and command. A ratio or saving of medians is printed
only where the samples support it (`tilewise.tune.measure.compare`): `tie` when the 95% intervals overlap, `noisy`
when the samples scatter too much to rank.

torch and tilewise's BLAS share the process, so neither may slow the other: both pools get `--threads` threads
(OMP/OPENBLAS/MKL_NUM_THREADS and torch.set_num_threads) and torch's OpenMP threads sleep between calls
(OMP_WAIT_POLICY=PASSIVE unless set already; run with OMP_WAIT_POLICY=ACTIVE to see the difference). The header
states the setup.

Usage: python bench/cpu_decision.py [--presets seed-250m lfm2-350m] [--repeats 7] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# thread counts must be fixed before numpy / torch load their BLAS; without --threads the user's variables or
# tilewise's choice (the physical cores available) stand
for _i, _a in enumerate(sys.argv):
    if _a == "--threads" and _i + 1 < len(sys.argv):
        for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[_var] = sys.argv[_i + 1]
# torch's OpenMP threads spin after each call by default and slow the BLAS call timed next (30.3 vs 24.6 ms p50 on a
# 2-core VM); PASSIVE makes them sleep at once. It must be set before torch loads its OpenMP runtime.
# --omp-default leaves OpenMP's default (to measure what PASSIVE prevents).
if "--omp-default" not in sys.argv:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import datetime  # noqa: E402
import platform  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import tilewise  # noqa: E402
from tilewise.model import checkpoint as ckpt  # noqa: E402
from tilewise.model.config import preset  # noqa: E402
from tilewise.tune.measure import compare, summarize  # noqa: E402

PROMPT_TOKENS = 346
PREFIX_TOKENS = 47
FIT_TOKENS = (47, 150, 250)  # shorter prompts timed to split a decision into fixed + per-token cost


def _hf_model(cfg, tensors):
    import torch
    import transformers

    fields = cfg.to_hf_dict()
    fields.pop("architectures")
    fields.pop("model_type")
    hc = transformers.Lfm2Config(**fields)
    with torch.device("meta"):
        model = transformers.Lfm2Model(hc)
    _assign(model, tensors)
    # non-persistent buffers are not in the state dict: rebuild RoPE's exactly as HF's init does
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float) / cfg.head_dim))
    model.rotary_emb.inv_freq = inv_freq
    model.rotary_emb.original_inv_freq = inv_freq.clone()
    return model.eval()


def _assign(model, tensors) -> None:
    import torch

    state = {k: torch.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in tensors.items() if k != ckpt.HEAD}
    model.load_state_dict(state, strict=True, assign=True)  # shares the numpy memory, no copy


def bench_preset(name: str, repeats: int, warmup: int, seed: int = 0) -> tuple[list[str], dict]:
    import torch

    from tilewise.model.runtime import from_checkpoint

    t0 = time.perf_counter()
    if name == "default":  # the bundled model's own weights (dequantized to float32, HF's equal-precision input)
        from tilewise.model.runtime import DEFAULT_MODEL_DIR

        bundled = ckpt.Checkpoint.open(DEFAULT_MODEL_DIR)
        cfg = bundled.config
        tensors = {n: bundled.float32(n) for n in bundled.names()}
    else:
        cfg = preset(name)
        tensors = ckpt.random_tensors(cfg, seed=seed)
    head = tensors[ckpt.HEAD]
    hf = _hf_model(cfg, tensors)
    ck32 = ckpt.Checkpoint.from_arrays(cfg, tensors, "f32", f"preset:{name}")
    models = {"f32": from_checkpoint(ck32), "nf4": from_checkpoint(ck32.converted("nf4"))}
    load_s = time.perf_counter() - t0
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, PROMPT_TOKENS)
    ids_t = torch.from_numpy(ids)[None]

    def hf_decision() -> np.ndarray:
        with torch.inference_mode():
            out = hf(ids_t, use_cache=False).last_hidden_state[0, -1].numpy()
        return head @ out

    variants = {"hf f32": hf_decision}
    for fmt, m in models.items():
        base = {}
        for slicing in (False, True):
            m.final_row_slicing = slicing
            base[slicing] = m.prefill(ids[:PREFIX_TOKENS])  # the shared prefix, prefilled once per session

        def full(m=m, slicing=False):
            m.final_row_slicing = slicing
            return m.scores(m.prefill(ids))

        def cached(m=m, slicing=False, base=base):
            m.final_row_slicing = slicing
            return m.scores(m.extend(base[slicing], ids[PREFIX_TOKENS:]))

        variants[f"tw {fmt} full"] = full
        if fmt == "f32":  # nf4 runs the same float32 arithmetic; its two ends suffice
            variants[f"tw {fmt} slice"] = lambda full=full: full(slicing=True)
            variants[f"tw {fmt} cache"] = cached
            for n in FIT_TOKENS:  # shorter prompts: the line time = fixed + per_token * n
                variants[f"tw f32 full n={n}"] = lambda m=m, n=n: m.scores(m.prefill(ids[:n]))
        variants[f"tw {fmt} slice+cache"] = lambda cached=cached: cached(slicing=True)

    scores = {k: fn() for k, fn in variants.items()}  # first call doubles as a warm-up
    for _ in range(warmup - 1):
        for fn in variants.values():
            fn()
    samples: dict[str, list[float]] = {k: [] for k in variants}
    order_rng = np.random.default_rng(2)
    for _ in range(repeats):
        for k in order_rng.permutation(list(variants)):
            t = time.perf_counter()
            variants[k]()
            samples[k].append((time.perf_counter() - t) * 1e3)
    stats = {k: summarize(v) for k, v in samples.items()}
    # the NF4 runs are checked against HF on the same (dequantized) weights
    ref = {"f32": scores["hf f32"]}
    ck4 = models["nf4"].checkpoint
    _assign(hf, {n: ck4.float32(n) for n in ck4.names()})
    ref["nf4"] = hf_decision()
    lines = [f"### {name}: hidden {cfg.hidden_size}, ffn {cfg.ffn_dim}, {cfg.num_layers} blocks "
             f"({len(cfg.attention_layers)} attention), vocab {cfg.vocab_size}; {PROMPT_TOKENS}-token prompt, "
             f"prefix {PREFIX_TOKENS}; {repeats} interleaved samples after {warmup} warm-up; setup {load_s:.0f} s; "
             f"load average after: {os.getloadavg()[0]:.1f}",
             "", "| variant | median ms | p20 ms | p80 ms | min ms | HF / this (medians) | HF / this (min) | "
             "max abs score diff vs HF, same weights |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    med = {k: s.median_ms for k, s in stats.items()}
    low = {k: float(np.min(v)) for k, v in samples.items()}
    for k, s in stats.items():
        if " n=" in k:  # a shorter prompt: HF's scores are of the whole one, so there is nothing to compare
            diff_text = "n/a (shorter prompt)"
        else:
            diff_text = f"{float(np.abs(scores[k] - ref['nf4' if 'nf4' in k else 'f32']).max()):.2e}"
        vs_hf = compare(stats["hf f32"], s).times() if k != "hf f32" else "1.00x"
        lines.append(f"| {k} | {s.median_ms:.1f} | {s.p20_ms:.1f} | {s.p80_ms:.1f} | {low[k]:.1f} | "
                     f"{vs_hf} | {low['hf f32'] / low[k]:.2f} | {diff_text} |")
    lines.append("")
    skipped = PREFIX_TOKENS / PROMPT_TOKENS

    def cmp(base: str, new: str) -> str:
        return compare(stats[base], stats[new], (base, new)).saving()

    lines.append(f"- medians, f32: final-row slicing: {cmp('tw f32 full', 'tw f32 slice')}; the prefix cache: "
                 f"{cmp('tw f32 full', 'tw f32 cache')} without slicing, {cmp('tw f32 slice', 'tw f32 slice+cache')} "
                 f"with it (it skips {skipped:.1%} of the tokens); vs HF: "
                 f"{compare(stats['hf f32'], stats['tw f32 full']).times()} with neither, "
                 f"{compare(stats['hf f32'], stats['tw f32 slice+cache']).times()} with both; nf4 vs HF: "
                 f"{compare(stats['hf f32'], stats['tw nf4 full']).times()} / "
                 f"{compare(stats['hf f32'], stats['tw nf4 slice+cache']).times()} (tie: 95% intervals overlap)")
    for label, t in (("min", low),):  # minimums have no interval: plain ratios, labelled as such
        lines.append(f"- {label}, f32: final-row slicing saves {1 - t['tw f32 slice'] / t['tw f32 full']:.1%}; the "
                     f"prefix cache saves {1 - t['tw f32 cache'] / t['tw f32 full']:.1%} without slicing and "
                     f"{1 - t['tw f32 slice+cache'] / t['tw f32 slice']:.1%} with it (it skips {skipped:.1%} of the "
                     f"tokens); vs HF: {t['hf f32'] / t['tw f32 full']:.2f}x with neither, "
                     f"{t['hf f32'] / t['tw f32 slice+cache']:.2f}x with both; nf4 vs HF: "
                     f"{t['hf f32'] / t['tw nf4 full']:.2f}x / {t['hf f32'] / t['tw nf4 slice+cache']:.2f}x")
    # every cost that grows with the prompt is `per_token * n`; what does not (each GEMM re-packs its whole weight
    # matrix, per-layer Python and norms of the last row) is `fixed`, and no prefix cache can skip it
    ns = np.array([*FIT_TOKENS, PROMPT_TOKENS], float)
    fit: dict[str, dict[str, float]] = {}
    for label, t in (("median", med), ("min", low)):
        per_token, fixed = np.polyfit(ns, [t[f"tw f32 full n={n}"] for n in FIT_TOKENS] + [t["tw f32 full"]], 1)
        share = per_token * PREFIX_TOKENS / t["tw f32 full"]
        saved = 1 - t["tw f32 cache"] / t["tw f32 full"]
        fit[label] = {"fixed_ms": float(fixed), "per_token_ms": float(per_token), "skipped_share": float(share),
                      "saved": float(saved)}
        lines.append(f"- {label}, f32, fit of time vs prompt length over n = {', '.join(map(str, FIT_TOKENS))}, "
                     f"{PROMPT_TOKENS} (no slicing): fixed {fixed:.1f} ms + {per_token:.3f} ms/token; the "
                     f"{PREFIX_TOKENS} skipped tokens' share of the token-proportional time is {share:.1%} of a "
                     f"decision and the cache saves {saved:.1%} ({saved / share:.2f}x that share)")
    lines.append("")
    out = {k: s.as_dict() for k, s in stats.items()}
    out["fit"] = fit
    return lines, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["seed-250m", "lfm2-350m"],
                   help="presets (seeded random weights), or default for the bundled model's weights")
    p.add_argument("--omp-default", action="store_true",
                   help="leave torch's OpenMP wait policy at its default (spinning) instead of PASSIVE")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None,
                   help="BLAS and torch threads (default: OMP/OPENBLAS/MKL_NUM_THREADS, else the physical cores)")
    p.add_argument("--out", default=None, help="results file (default bench/results/<date>-cpu-decision.md)")
    args = p.parse_args()
    import torch
    import transformers

    from tilewise.devices.cpu import match_torch_threads, set_threads

    blas = set_threads(args.threads)
    torch_line = match_torch_threads(torch)
    dev = tilewise.get_device("cpu").info
    now = datetime.datetime.now(datetime.UTC)
    header = [
        f"# CPU decision latency: tilewise CPU executor vs HF transformers Lfm2Model ({now:%Y-%m-%d %H:%M} UTC)", "",
        f"- device: {dev.name} ({platform.machine()}), {os.cpu_count()} logical CPUs; "
        f"{dev.driver}; torch {torch.__version__}, transformers {transformers.__version__}, tilewise "
        f"{tilewise.__version__}",
        f"- threads: {blas.line()}; {torch_line}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')} "
        "(PASSIVE: torch's OpenMP threads sleep between calls instead of spinning on the cores BLAS needs next)",
        f"- command: `python bench/cpu_decision.py {' '.join(sys.argv[1:])}`".replace("`python bench/cpu_decision.py `",
                                                                                      "`python bench/cpu_decision.py`"),
        f"- load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())} (other work on the machine "
        "shows up as spread between p20 and p80)",
        "- weights: " + ("the bundled model's (its NF4 checkpoint in float32) for `default`, " if "default" in
                         args.presets else "") +
        "seeded random (seed 0) for presets, scaled so activations stay O(1); NF4 = blocksize 64, dequantized once "
        "at load, so `tw nf4` does the same float32 arithmetic as `tw f32`; HF runs float32 (its equal-precision "
        "peer for both)", ""]
    print("\n".join(header), flush=True)
    body = []
    for name in args.presets:
        lines, _ = bench_preset(name, args.repeats, args.warmup)
        print("\n".join(lines), flush=True)
        body += lines
    default_out = Path(__file__).resolve().parent / "results" / f"{now:%Y-%m-%d}-cpu-decision.md"
    out = Path(args.out) if args.out else default_out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(header + body) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
