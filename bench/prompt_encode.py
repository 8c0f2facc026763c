"""The host's share of a decision before the model runs: rendering a board's prompt and encoding it to token ids.

Why: `tilewise play` times a decision from the board to the action, so the prompt and the tokenizer are part of
every figure it reports. For a model that decides in a fraction of a millisecond on a GPU, a few hundred
microseconds of encoding would be a visible share. This times, on the same positions in one run:
- `render`: `render_prompt(game)`;
- `library`: `encode_prompt` (the tokenizers library on the whole prompt);
- `lines`: `PromptEncoder`, the play loop's encoder (each line's ids kept, only new lines encoded), after a warm-up
  over the same positions;
and checks that both encoders give the same ids on every position. Positions come from seeded random games; each
round times every method on every position in a fresh random order. Prints p50 / p90 microseconds per prompt and
each encoder's ratio to `library`; writes `prompt_encode.json` into `--out`.

    PYTHONPATH=src python3 bench/prompt_encode.py --out OUT_DIR [--positions 200] [--rounds 7]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import random
import sys
import time
from pathlib import Path


def positions(n: int, seed: int) -> list:
    """n game positions from seeded games with random moves (a finished game is replaced by a new one)."""
    from tilewise.game.engine import Game

    rng = random.Random(seed)
    out, game = [], Game(seed)
    while len(out) < n:
        if game.game_over:
            game = Game(rng.randrange(1 << 30))
        out.append(copy.deepcopy(game))
        game.step(rng.randrange(6))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for prompt_encode.json")
    ap.add_argument("--positions", type=int, default=200, help="game positions encoded per round")
    ap.add_argument("--rounds", type=int, default=7, help="rounds; each times every method on every position")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.positions < 1 or args.rounds < 1:
        ap.error("--positions and --rounds must be at least 1")

    import numpy as np

    from tilewise.game.prompt import render_prompt
    from tilewise.game.tokenizer import PromptEncoder, encode_prompt, load_tokenizer

    tok = load_tokenizer()
    games = positions(args.positions, args.seed)
    texts = [render_prompt(g) for g in games]
    enc = PromptEncoder(tok)
    wrong = sum(enc(t) != encode_prompt(tok, t) for t in texts)  # also the warm-up of the line store
    if wrong:
        print(f"error: the line encoder differs from the library on {wrong} of {len(texts)} prompts")
        return 1
    methods = {"render": lambda i: render_prompt(games[i]), "library": lambda i: encode_prompt(tok, texts[i]),
               "lines": lambda i: enc(texts[i])}
    us: dict[str, list[float]] = {k: [] for k in methods}
    rng = random.Random(args.seed + 1)
    for _ in range(args.rounds):
        work = [(k, i) for k in methods for i in range(len(texts))]
        rng.shuffle(work)
        for k, i in work:
            t0 = time.perf_counter()
            methods[k](i)
            us[k].append((time.perf_counter() - t0) * 1e6)
    stats = {k: {"p50_us": float(np.percentile(v, 50)), "p90_us": float(np.percentile(v, 90)), "samples": len(v)}
             for k, v in us.items()}
    lib = stats["library"]["p50_us"]
    print(f"{'method':8} {'p50 us':>9} {'p90 us':>9} {'library / this (p50)':>22}")
    for k, s in stats.items():
        ratio = f"{lib / s['p50_us']:.1f}x" if k != "render" else ""
        print(f"{k:8} {s['p50_us']:9.1f} {s['p90_us']:9.1f} {ratio:>22}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "host": platform.processor() or platform.machine(), "python": platform.python_version(),
              "positions": len(texts), "rounds": args.rounds, "prompt_tokens": len(encode_prompt(tok, texts[0])),
              "line_by_line": enc.line_by_line, "stats": stats}
    (out / "prompt_encode.json").write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
