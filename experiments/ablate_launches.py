"""What a GPU decision would cost without a class of its launches: an upper bound on what fusing them away saves.

The executor's decision is one launch list (on CUDA one graph replay, on WebGPU one submission). This builds the
decision's plan once (on the dispatch table in force), then makes one plan per variant with a class of launches
left out (split-K reductions, f16 prologues, the short convolutions, q/k norm + RoPE, attention, everything that
is not a matmul, ...), each its own object so that its graph or pre-encoded commands are its own, and times the
variants interleaved: each round times `--per-round` decisions of every variant, in a fresh random order, after
one untimed decision of it. A variant's scores are wrong by construction (its work is missing); only its time is
read, on the host clock around `prefill` and reading the scores, as `tilewise bench` times a decision. The table
gives each variant's median, the bootstrap 95% interval, and the difference from the full decision.

    PYTHONPATH=src python3 experiments/ablate_launches.py --device cuda --preset lfm2-350m --seq 346 [--rounds 12]
        [--out DIR]     (--device webgpu / dawn for the WGSL executors)
"""
from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tilewise.model.bench import PREFIX_TOKENS, prompts  # noqa: E402
from tilewise.model.dispatch import CUDA_SETTINGS  # noqa: E402
from tilewise.model.gpu_state import Plan  # noqa: E402
from tilewise.model.runtime import from_checkpoint, open_checkpoint  # noqa: E402
from tilewise.model.tune import model_matmuls  # noqa: E402
from tilewise.tune.measure import summarize  # noqa: E402


def is_reduction(launch) -> bool:  # CUDA: nf4_mm_splitk_reduce, nf4_mm_reduce_prep; WGSL: NAME.reduce[KS=..]
    return "reduce" in f"{launch.program.name} {launch.program.meta.get('entry', '')}"


def is_prep(launch) -> bool:  # CUDA's f16 prologue launch (nf4_mm_prep)
    return str(launch.program.meta.get("entry", "")).startswith("nf4_mm_prep")


def variants(matmul_ops: set[str]) -> dict[str, Callable[[str, Any], bool]]:
    """variant -> what it leaves out: (op label, launch) -> True; `matmul_ops`: the model's matmul op labels."""
    return {
        "full": lambda label, launch: False,
        "no split-K reductions": lambda label, launch: is_reduction(launch),
        "no f16 prologues": lambda label, launch: is_prep(launch),
        "no shortconv": lambda label, launch: label == "conv",
        "no qknorm_rope": lambda label, launch: label.endswith("qknorm_rope"),
        "no attention": lambda label, launch: label == "attention",
        "no copies, embed, head": lambda label, launch: label.startswith("copy") or label in ("embed", "head"),
        "matmuls only": lambda label, launch: label not in matmul_ops or is_reduction(launch) or is_prep(launch),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, webgpu, dawn, ...")
    ap.add_argument("--preset", default="lfm2-350m")
    ap.add_argument("--seq", type=int, default=346)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    nf4 = open_checkpoint(args.preset, weights="f32", seed=0).converted("nf4").materialize()
    model = from_checkpoint(nf4, device=args.device, quiet=True)
    ex = model.executor
    chosen = variants(set(model_matmuls(nf4.config)))
    _, full = prompts(nf4.config.vocab_size, args.seq, 4, min(PREFIX_TOKENS, args.seq - 1))
    model.scores(model.prefill(full[0]))  # builds the decision's plan
    model.scores(model.prefill(full[1]))  # the caches went back to the pool: the same plan again
    if len(ex._plans) != 1:
        raise SystemExit(f"expected one cached plan, found {len(ex._plans)}: decisions did not reuse their caches")
    (base_plan,) = ex._plans.values()
    plans, counts = {}, {}
    for name, drop in chosen.items():
        keep = [i for i, (label, launch) in enumerate(zip(base_plan.labels, base_plan.launches))
                if not drop(label, launch)]
        plan = Plan(base_plan.tokens)
        plan.launches = [base_plan.launches[i] for i in keep]
        plan.labels = [base_plan.labels[i] for i in keep]
        plans[name], counts[name] = plan, len(keep)

    current = {"plan": base_plan}
    build = ex.plan

    def planned(*a, **kw):  # the decision's caches and ids as before, the variant's launches
        _, new = build(*a, **kw)
        return current["plan"], new

    ex.plan = planned
    samples: dict[str, list[float]] = {name: [] for name in chosen}
    order = list(chosen)
    rng = random.Random(0)
    try:
        for _ in range(args.rounds):
            rng.shuffle(order)
            for name in order:
                current["plan"] = plans[name]
                model.scores(model.prefill(full[2]))  # untimed: the variant's first run captures or encodes it
                for _ in range(args.per_round):
                    t0 = time.perf_counter()
                    model.scores(model.prefill(full[3]))
                    samples[name].append((time.perf_counter() - t0) * 1e3)
    finally:
        del ex.plan
    gpu = ex.dev.info.name
    base = float(np.median(samples["full"]))
    rows = []
    settings = {k: getattr(ex, k) for k in CUDA_SETTINGS if hasattr(ex, k)}  # the CUDA executor's (none on WGSL)
    print(f"{args.preset}, {args.seq} tokens, on {model.device} ({gpu}); {settings}; {args.rounds} rounds x "
          f"{args.per_round} decisions a variant")
    print(f"{'variant':26s} {'launches':>8s} {'p50 ms':>8s} {'95% CI':>17s} {'saves ms':>9s} {'share':>6s}")
    for name in chosen:
        st = summarize(samples[name])
        saved = base - st.median_ms
        rows.append({"variant": name, "launches": counts[name], "p50_ms": st.median_ms, "ci95_ms": list(st.ci95_ms),
                     "p20_ms": st.p20_ms, "p80_ms": st.p80_ms, "saves_ms": saved, "samples_ms": samples[name]})
        print(f"{name:26s} {counts[name]:8d} {st.median_ms:8.3f} {st.ci95_ms[0]:8.3f}-{st.ci95_ms[1]:.3f} "
              f"{saved:9.3f} {saved / base:6.1%}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ablate.json").write_text(json.dumps({
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv), "preset": args.preset, "seq": args.seq, "device": model.device,
            "gpu": gpu, "settings": settings, "variants": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
