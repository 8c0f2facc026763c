"""CPU decision latency of candidate classifier shapes on the tilewise CPU executor (random NF4 weights).

A decision is what `tilewise play --policy model` does per step: extend the cached 42-token shared prefix with
the rest of a real 348-token game prompt, then read the 8 scores. Timed with perf_counter around each
decision, interleaved across shapes (round-robin) so that load drift hits all of them; prints median, p20/p80.

    PYTHONPATH=src python recipes/bundled_model/train_shape_latency.py [--repeats 30] [--shapes default,small]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from tilewise.game.engine import Game
from tilewise.game.expert import Expert
from tilewise.game.prompt import render_prompt
from tilewise.game.tokenizer import encode_prompt, load_tokenizer, shared_prefix_length
from tilewise.model.checkpoint import random_checkpoint
from tilewise.model.cpu import CPUExecutor
from tilewise.model.runtime import Model
from tilewise.train.shapes import SHAPES, model_config


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--shapes", default="default,small")
    ap.add_argument("--json", default=None, help="write the table as JSON here")
    args = ap.parse_args()
    tok = load_tokenizer()
    game, expert = Game(7), Expert()
    prompts = []
    for _ in range(args.repeats):
        prompts.append(encode_prompt(tok, render_prompt(game)))
        game.step(expert.act(game))
    p = shared_prefix_length(tok)
    models = {}
    for name in args.shapes.split(","):
        cfg = model_config(tok, name)
        ck = random_checkpoint(cfg, seed=0, weights="nf4")
        model = Model(ck, CPUExecutor(ck), ck.float32("score.weight"), tok)
        base = model.prefill(prompts[0][:p])
        model.scores(model.extend(base, prompts[0][p:]))  # warm-up
        models[name] = (cfg, model, base)
    times: dict[str, list[float]] = {n: [] for n in models}
    for ids in prompts:
        for name, (_, model, base) in models.items():
            t0 = time.perf_counter()
            model.scores(model.extend(base, ids[p:]))
            times[name].append((time.perf_counter() - t0) * 1e3)
    rows = []
    for name, (cfg, _, _) in models.items():
        t = np.array(times[name])
        rows.append({"shape": name, **{k: v for k, v in SHAPES[name].items()}, "parameters": cfg.parameter_count(),
                     "prompt_tokens": len(prompts[0]), "prefix_tokens": p, "decisions": len(t),
                     "decision_ms_p50": round(float(np.median(t)), 2),
                     "decision_ms_p20": round(float(np.percentile(t, 20)), 2),
                     "decision_ms_p80": round(float(np.percentile(t, 80)), 2)})
    load = os.getloadavg()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    print(f"CPU: {cores} usable cores of {os.cpu_count()}, BLAS threads {threads}, load average {load[0]:.2f} "
          "(the whole machine's, other processes included)")
    print(f"{'shape':8} {'params':>10} {'p20 ms':>8} {'p50 ms':>8} {'p80 ms':>8}")
    for r in rows:
        print(f"{r['shape']:8} {r['parameters']:>10,} {r['decision_ms_p20']:>8} {r['decision_ms_p50']:>8} "
              f"{r['decision_ms_p80']:>8}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"usable_cores": cores, "cpus": os.cpu_count(), "blas_threads": threads,
                       "load_average_1min": load[0], "rows": rows}, f, indent=2, default=list)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
