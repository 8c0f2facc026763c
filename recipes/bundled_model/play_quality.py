"""Play quality of the model, the expert and the random policy over the same seeded games, as one table.

Each policy plays games with engine seeds `seed .. seed + games - 1` up to `--max-pieces` pieces (game over ends a
game earlier), exactly as `tilewise game eval` does (`tilewise.game.play.evaluate_policy`); games run in parallel
worker processes (one BLAS thread each). The model is played by:

- `--engine runtime` (default): `tilewise play --policy model`'s path (the tilewise runtime on `--device`, with
  the cached shared prefix), one decision at a time;
- `--engine torch`: all games in lockstep with one batched torch forward per step on the weights the model folder
  holds (NF4 dequantized), float32 with TF32 off (`tilewise.train.evaluate.play_batched`); for GPUs.

    PYTHONPATH=src python recipes/bundled_model/play_quality.py [--model default] [--games 20] [--max-pieces 1000]
        [--policies model,expert,random] [--engine runtime|torch] [--device cpu] [--workers N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def _one_game(job: tuple[str, str, str, int, int]) -> dict[str, Any]:
    policy, model, device, seed, max_pieces = job
    from tilewise.game.play import ExpertPolicy, RandomPolicy, evaluate_policy, load_model_policy

    if policy == "model":
        made = load_model_policy(model, device)
    elif policy == "expert":
        made = ExpertPolicy()
    else:
        made = RandomPolicy(seed)
    t0 = time.perf_counter()
    r = evaluate_policy(lambda s: made, games=1, max_pieces=max_pieces, seed=seed)["per_game"][0]
    r["wall_s"] = time.perf_counter() - t0
    return {"policy": policy, **r}


def _summary(policy: str, rows: list[dict[str, Any]], max_pieces: int, engine: str) -> dict[str, Any]:
    rows = sorted(rows, key=lambda r: r["seed"])
    n = len(rows)
    return {"policy": policy, "engine": engine if policy == "model" else "cpu", "games": n, "max_pieces": max_pieces,
            "mean_lines": sum(r["lines"] for r in rows) / n, "mean_pieces": sum(r["pieces"] for r in rows) / n,
            "min_pieces": min(r["pieces"] for r in rows), "games_at_cap": sum(r["pieces"] >= max_pieces for r in rows),
            "decisions": sum(r["steps"] for r in rows), "per_game": rows}


def measure(policies: list[str], model: str = "default", games: int = 20, max_pieces: int = 1000, seed: int = 0,
            engine: str = "runtime", device: str = "cpu", workers: int | None = None,
            log: Any = print) -> dict[str, dict[str, Any]]:
    """Mean lines and pieces per policy over the same seeded games.

    Args:
        policies: any of model, expert, random.
        model: `default` or a model folder, for the model policy.
        games: games per policy.
        max_pieces: piece cap per game.
        seed: first engine seed.
        engine: runtime or torch (model policy only).
        device: device for the model.
        workers: processes for the per-game jobs (default: CPU count).
        log: progress output.

    Returns:
        policy -> summary dict (mean_lines, mean_pieces, per_game, ...).
    """
    import multiprocessing as mp

    out: dict[str, dict[str, Any]] = {}
    seeds = list(range(seed, seed + games))
    jobs = [(p, model, device, s, max_pieces) for p in policies if not (p == "model" and engine == "torch")
            for s in seeds]
    t0 = time.perf_counter()
    if jobs:
        workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
        rows: list[dict[str, Any]] = []
        if workers == 1:
            rows = [_one_game(j) for j in jobs]
        else:
            with mp.get_context("spawn").Pool(workers) as pool:
                for r in pool.imap_unordered(_one_game, jobs):
                    rows.append(r)
        for p in policies:
            mine = [r for r in rows if r["policy"] == p]
            if mine:
                out[p] = _summary(p, mine, max_pieces, engine)
        log(f"per-game jobs: {len(jobs)} in {time.perf_counter() - t0:.1f} s on {workers} processes")
    if "model" in policies and engine == "torch":
        from tilewise.model.runtime import DEFAULT_MODEL_DIR
        from tilewise.train.evaluate import play_batched
        from tilewise.train.export import load_torch_model

        path = DEFAULT_MODEL_DIR if model == "default" else model
        torch_model = load_torch_model(path)
        res = play_batched(torch_model, seeds, max_pieces=max_pieces, device=device, log=log)
        out["model"] = _summary("model", res["per_game"], max_pieces, f"torch-{device}")
        log(f"model (torch, {device}): {res['decisions']} decisions in {res['wall_s']} s")
    return {p: out[p] for p in policies if p in out}


def print_table(results: dict[str, dict[str, Any]]) -> None:
    """One row per policy, plus the model's share of the expert's lines when both are there."""
    print(f"{'policy':8} {'engine':12} {'games':>5} {'cap':>5} {'mean lines':>11} {'mean pieces':>12} {'at cap':>6}")
    for r in results.values():
        print(f"{r['policy']:8} {r['engine']:12} {r['games']:>5} {r['max_pieces']:>5} {r['mean_lines']:>11.1f} "
              f"{r['mean_pieces']:>12.1f} {r['games_at_cap']:>6}")
    if "model" in results and "expert" in results and results["expert"]["mean_lines"] > 0:
        share = results["model"]["mean_lines"] / results["expert"]["mean_lines"]
        print(f"model / expert lines: {share:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="default (bundled) or a model folder")
    ap.add_argument("--policies", default="model,expert,random")
    ap.add_argument("--games", type=int, default=20)
    ap.add_argument("--max-pieces", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine", choices=("runtime", "torch"), default="runtime")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one BLAS thread per worker process
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    policies = [p for p in args.policies.split(",") if p]
    bad = [p for p in policies if p not in ("model", "expert", "random")]
    if bad:
        print(f"error: unknown policy {bad[0]!r}; use model, expert, random", file=sys.stderr)
        return 2
    results = measure(policies, args.model, args.games, args.max_pieces, args.seed, args.engine, args.device,
                      args.workers)
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python recipes/bundled_model/play_quality.py " + " ".join(argv or sys.argv[1:]),
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
