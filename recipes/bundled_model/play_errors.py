"""Where the model departs from the expert on the boards it reaches itself: agreement by the expert's action,
by a piece's first decision against the later ones, the most frequent (expert -> model) confusions, and how
many pieces the model hard-drops exactly at the expert's target placement.

The model plays (`tilewise play --policy model`'s runtime path, one decision at a time); at every position the
expert's action is computed too but never played, so the boards are the model's own. The expert's target for a
piece is its search from the spawn position (`Expert.target`), the same target its actions steer toward.

    PYTHONPATH=src python recipes/bundled_model/play_errors.py [--model default] [--games 6] [--seed 200]
        [--max-pieces 200] [--device cpu] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))


def analyse(model: str, games: int, seed: int, max_pieces: int, device: str) -> dict[str, Any]:
    """Play `games` seeded games with the model and compare every decision with the expert's."""
    from tilewise.game.engine import ACTION_NAMES, Action, Game
    from tilewise.game.expert import Expert
    from tilewise.game.play import load_model_policy

    policy = load_model_policy(model, device=device)
    expert = Expert()
    by_label = {a: [0, 0] for a in ACTION_NAMES}  # expert action -> [decisions, agreed]
    by_step = {"first": [0, 0], "later": [0, 0]}  # a piece's first decision (at spawn) against the rest
    confusions: collections.Counter[tuple[str, str]] = collections.Counter()
    pieces = at_target = lines = 0
    t0 = time.perf_counter()
    for s in range(seed, seed + games):
        game = Game(seed=s)
        step_in_piece, target = 0, None
        while not game.game_over and game.pieces < max_pieces:
            if step_in_piece == 0:
                target = expert.target(game.board, game.piece)
            want, got = expert.act(game), policy.decide(game)
            for counts in (by_label[ACTION_NAMES[want]], by_step["first" if step_in_piece == 0 else "later"]):
                counts[0] += 1
                counts[1] += want == got
            if want != got:
                confusions[(ACTION_NAMES[want], ACTION_NAMES[got])] += 1
            rot, x = game.rot, game.x
            result = game.step(got)
            step_in_piece += 1
            if result.locked:
                pieces += 1
                at_target += target is not None and got == Action.HARD_DROP and (rot, x) == target
                step_in_piece = 0
        lines += game.lines
    decisions = sum(n for n, _ in by_step.values())
    return {"model": model, "games": games, "seed": seed, "max_pieces": max_pieces, "device": device,
            "decisions": decisions, "agreement": sum(a for _, a in by_step.values()) / max(1, decisions),
            "by_step": {k: {"decisions": n, "agreement": a / max(1, n)} for k, (n, a) in by_step.items()},
            "by_expert_action": {k: {"decisions": n, "agreement": a / max(1, n)} for k, (n, a) in by_label.items()
                                 if n},
            "confusions": [{"expert": e, "model": m, "count": c} for (e, m), c in confusions.most_common(10)],
            "pieces": pieces, "hard_dropped_at_expert_target": at_target, "lines": lines,
            "seconds": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="default (bundled) or a model folder")
    ap.add_argument("--games", type=int, default=6)
    ap.add_argument("--seed", type=int, default=200, help="first engine seed")
    ap.add_argument("--max-pieces", type=int, default=200)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    r = analyse(args.model, args.games, args.seed, args.max_pieces, args.device)
    print(f"{r['decisions']} decisions over {r['games']} games (seeds {r['seed']}..), {r['pieces']} pieces, "
          f"{r['lines']} lines, {r['seconds']:.0f} s; agreement with the expert on the model's own boards "
          f"{r['agreement']:.3f}")
    for k, v in r["by_step"].items():
        print(f"  {k:5s} decision of a piece  {v['decisions']:6d}  agreement {v['agreement']:.3f}")
    for k, v in r["by_expert_action"].items():
        print(f"  expert {k:10s}        {v['decisions']:6d}  agreement {v['agreement']:.3f}")
    print("  confusions (expert -> model): " + ", ".join(f"{c['expert']}->{c['model']} {c['count']}"
                                                         for c in r["confusions"]))
    print(f"  pieces hard-dropped at the expert's target: {r['hard_dropped_at_expert_target']} of {r['pieces']} "
          f"({r['hard_dropped_at_expert_target'] / max(1, r['pieces']):.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
