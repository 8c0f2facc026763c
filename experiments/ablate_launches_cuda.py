"""What the CUDA decision would cost without a class of its launches: an upper bound on what fusing them away saves.

The executor's decision is one graph replay. This builds the decision's plan once (on the dispatch table in force,
`TILEWISE_DISPATCH_DIR`), then captures one graph per variant of its launch list with a class of launches left
out (the split-K reductions with their fused prologues, the short convolutions, q/k norm + RoPE, attention,
everything that is not a matmul, ...) and replays the variants interleaved: each round times `--per-round`
decisions of every variant, in a fresh random order. A variant's scores are wrong by construction (its work is
missing); only its time is read. The table gives each variant's median over all its decisions, the bootstrap 95%
interval, and the difference from the full decision.

    PYTHONPATH=src python3 experiments/ablate_launches_cuda.py --preset lfm2-350m --seq 346 [--rounds 12] [--out DIR]
"""
from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tilewise.model.bench import PREFIX_TOKENS, prompts  # noqa: E402
from tilewise.model.runtime import from_checkpoint, open_checkpoint  # noqa: E402
from tilewise.tune.measure import summarize  # noqa: E402

# variant -> entry-name prefixes of the launches it leaves out
VARIANTS = {
    "full": (),
    "no reduce_prep": ("nf4_mm_reduce_prep",),
    "no splitk_reduce": ("nf4_mm_splitk_reduce",),
    "no prep": ("nf4_mm_prep",),
    "no shortconv": ("shortconv",),
    "no qknorm_rope": ("qknorm_rope",),
    "no attention": ("attention",),
    "no copies, embed, head": ("copy_", "embed", "head"),
}
MATMULS = ("nf4_mm_wgr", "nf4_mm_wg", "nf4_mm_ws", "nf4_mm_ring", "nf4_mm_pipe", "nf4_mm_mma", "nf4_mm_rows",
           "nf4_mm_splitk", "nf4_mm_tiled")


def entry(launch) -> str:
    return str(launch.program.meta.get("entry") or launch.program.name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="lfm2-350m")
    ap.add_argument("--seq", type=int, default=346)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    nf4 = open_checkpoint(args.preset, weights="f32", seed=0).converted("nf4").materialize()
    model = from_checkpoint(nf4, device="cuda", quiet=True)
    ex = model.executor
    _, full = prompts(nf4.config.vocab_size, args.seq, 4, PREFIX_TOKENS)
    model.scores(model.prefill(full[0]))  # builds and captures the decision's plan
    model.scores(model.prefill(full[1]))  # the caches went back to the pool: the same plan again
    if len(ex._plans) != 1:
        raise SystemExit(f"expected one cached plan, found {len(ex._plans)}: decisions did not reuse their caches")
    (plan,) = ex._plans.values()
    original = list(plan.launches), list(plan.labels)
    variants = dict(VARIANTS)
    variants["matmuls only"] = None  # everything whose entry is not a matmul left out

    graphs, counts = {}, {}
    for name, drop in variants.items():
        keep = [i for i, launch in enumerate(original[0])
                if (entry(launch).startswith(MATMULS) and not entry(launch).startswith("nf4_mm_splitk_reduce"))
                or (drop is not None and not entry(launch).startswith(drop))]
        plan.launches = [original[0][i] for i in keep]
        plan.labels = [original[1][i] for i in keep]
        plan.graph = None
        model.scores(model.prefill(full[1]))  # captures this variant's graph
        if plan.graph is None or len(ex._plans) != 1:
            raise SystemExit(f"{name}: the plan was not reused or not captured")
        graphs[name] = (plan.graph, plan.launches, plan.labels)
        counts[name] = len(plan.launches)

    samples: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    rng = random.Random(0)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for name in order:
            plan.graph, plan.launches, plan.labels = graphs[name]
            model.scores(model.prefill(full[2]))  # warm: this graph's first replay in the round is not timed
            for _ in range(args.per_round):
                t0 = time.perf_counter()
                model.scores(model.prefill(full[3]))
                samples[name].append((time.perf_counter() - t0) * 1e3)
    plan.graph, plan.launches, plan.labels = graphs["full"]

    base = float(np.median(samples["full"]))
    rows = []
    print(f"{args.preset}, {args.seq} tokens, on {model.device} ({ex.dev.info.name}); pdl={ex.pdl}, "
          f"fuse_preps={ex.fuse_preps}; {args.rounds} rounds x {args.per_round} decisions a variant")
    print(f"{'variant':26s} {'launches':>8s} {'p50 ms':>8s} {'95% CI':>17s} {'saves ms':>9s} {'share':>6s}")
    for name in variants:
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
            "command": " ".join(sys.argv), "preset": args.preset, "seq": args.seq, "gpu": ex.dev.info.name,
            "pdl": ex.pdl, "fuse_preps": ex.fuse_preps, "variants": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
