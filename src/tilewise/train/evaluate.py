"""Play quality of a trained classifier with many games in lockstep: one batched torch forward per step.

`tilewise play --policy model` runs one game at a time on tilewise's executors; scoring 20 games of up to 1000
pieces that way takes CPU-hours on a small machine. Here the same policy (render the prompt, tokenize it, argmax
of the first 6 of the 8 scores) plays every game at once, so a GPU scores them in a minute. The games, seeds,
caps and statistics are those of `tilewise.game.play.evaluate_policy` (game g uses engine seed `seed + g`), and
the weights are the shipped ones when the model is read from the NF4 folder (`load_torch_model`), so the numbers
describe the shipped model; only float rounding differs from the CPU executor (matmuls run in float32 with TF32
off), which can flip a near-tie decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def play_batched(model: Any, seeds: list[int], max_pieces: int = 1000, max_steps: int = 100_000,
                 device: Any = "cpu", tokenizer: Any = None, log: Callable[[str], None] | None = None,
                 time_budget_s: float = 0.0) -> dict[str, Any]:
    """Play one game per seed with the classifier, all games advancing together.

    Args:
        model: an `Lfm2Classifier` (float32).
        seeds: engine seeds, one game each.
        max_pieces: a game stops after this many pieces (as `evaluate_policy`).
        max_steps: a game also stops after this many decisions.
        device: torch device for the forward passes.
        tokenizer: the model's tokenizer (default: the game's shipped one).
        log: gets a progress line every 500 steps.
        time_budget_s: when > 0, stop every game once this much wall time has passed; the result then says
            `stopped_by_time` and the games still running count with what they reached.

    Returns:
        `evaluate_policy`'s dict: games, max_pieces, seed, mean_pieces, mean_lines, min_pieces, games_at_cap,
        per_game (seed, pieces, lines, steps, game_over), plus decisions and wall_s.
    """
    import torch

    from tilewise.game.dataset import PromptEncoder
    from tilewise.game.engine import Game
    from tilewise.game.prompt import render_prompt
    from tilewise.game.tokenizer import load_tokenizer

    tok = load_tokenizer() if tokenizer is None else tokenizer
    enc = PromptEncoder(tok)  # the tokenizer's exact ids, one cached encode per prompt line
    games = [Game(s) for s in seeds]
    steps = [0] * len(games)
    model = model.to(device).eval()
    if getattr(torch.device(device), "type", "cpu") == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 like the shipped CPU executor
        torch.backends.cudnn.allow_tf32 = False
    t0 = time.perf_counter()
    decisions = 0
    tick = 0

    def running(i: int) -> bool:
        g = games[i]
        return not g.game_over and g.pieces < max_pieces and steps[i] < max_steps

    active = [i for i in range(len(games)) if running(i)]
    stopped_by_time = False
    with torch.no_grad():
        while active:
            if time_budget_s and time.perf_counter() - t0 > time_budget_s:
                stopped_by_time = True
                break
            ids = enc.encode_many([render_prompt(games[i]) for i in active])
            lengths = np.array([len(t) for t in ids])
            batch = np.zeros((len(ids), int(lengths.max())), dtype=np.int64)
            for r, t in enumerate(ids):
                batch[r, : len(t)] = t
            scores = model(torch.from_numpy(batch).to(device), torch.from_numpy(lengths).to(device))  # (b, 8)
            actions = scores[:, :6].argmax(-1).tolist()
            for i, a in zip(active, actions):
                games[i].step(int(a))
                steps[i] += 1
            decisions += len(active)
            active = [i for i in active if running(i)]
            tick += 1
            if log and tick % 500 == 0:
                log(f"play: step {tick}, {len(active)} games running, mean pieces "
                    f"{np.mean([g.pieces for g in games]):.1f}, {time.perf_counter() - t0:.1f} s")
    per_game = [{"seed": s, "pieces": g.pieces, "lines": g.lines, "steps": n, "game_over": g.game_over}
                for s, g, n in zip(seeds, games, steps)]
    pieces = np.array([r["pieces"] for r in per_game], dtype=np.float64)
    lines = np.array([r["lines"] for r in per_game], dtype=np.float64)
    return {"games": len(seeds), "max_pieces": max_pieces, "seed": seeds[0] if seeds else 0,
            "mean_pieces": float(pieces.mean()), "mean_lines": float(lines.mean()),
            "min_pieces": int(pieces.min()), "games_at_cap": int((pieces >= max_pieces).sum()),
            "per_game": per_game, "decisions": decisions, "wall_s": round(time.perf_counter() - t0, 2),
            "stopped_by_time": stopped_by_time}
