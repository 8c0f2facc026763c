"""Agreement with the expert on freshly generated expert games, for one or more models, on the same decisions.

    PYTHONPATH=src python recipes/bundled_model/heldout_agreement.py --models default OTHER_DIR
        [--games 8 --seed 5000 --json F]

The games use dataset seeds no training run has used (training used 1-52, 200-255, 400-455, 600-655 and DAgger
1000 and up), with the training data's 5% exploration steps and no detours, so the number is comparable across
models trained on plain or detour data. Each model is read as `tilewise train` reads it (NF4 folders dequantized),
scored in float32 with torch, and compared with the expert's label on every decision.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def agreement(models: list[str], games: int, seed: int, max_pieces: int, explore: float, workers: int | None,
              device: str = "cpu") -> dict[str, Any]:
    """Generate the games once, then score every model on all their decisions."""
    import torch

    from tilewise.game.dataset import generate
    from tilewise.model.runtime import DEFAULT_MODEL_DIR
    from tilewise.train.data import from_arrays
    from tilewise.train.export import load_torch_model
    from tilewise.train.trainer import evaluate

    t0 = time.perf_counter()
    data = generate(games, seed, max_pieces=max_pieces, explore=explore, workers=workers)
    examples = from_arrays(data.tokens, data.lengths, data.actions, data.game_ids, data.steps)
    gen_s = time.perf_counter() - t0
    print(f"{len(examples)} decisions from {games} expert games (dataset seeds {seed}..; explore {explore}, "
          f"at most {max_pieces} pieces), {gen_s:.1f} s", flush=True)
    rows = []
    dev = torch.device(device)
    for m in models:
        folder = DEFAULT_MODEL_DIR if m == "default" else Path(m)
        t = time.perf_counter()
        ev = evaluate(load_torch_model(folder).to(dev), examples, dev)
        rows.append({"model": m, "accuracy": ev["accuracy"], "loss": ev["loss"], "examples": ev["examples"],
                     "per_action": ev["per_action"], "eval_s": round(time.perf_counter() - t, 1)})
        print(f"{m}: agreement {ev['accuracy']:.4f}, loss {ev['loss']:.4f} on {ev['examples']} decisions; "
              + ", ".join(f"{k} {v:.3f}" for k, v in ev["per_action"].items()), flush=True)
    return {"games": games, "seed": seed, "max_pieces": max_pieces, "explore": explore,
            "decisions": len(examples), "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["default"], help="'default' (bundled) or model folders")
    ap.add_argument("--games", type=int, default=8)
    ap.add_argument("--seed", type=int, default=5000, help="first dataset seed")
    ap.add_argument("--max-pieces", type=int, default=400, help="pieces per game at most (training used 400)")
    ap.add_argument("--explore", type=float, default=0.05, help="share of random steps (training used 0.05)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    res = agreement(args.models, args.games, args.seed, args.max_pieces, args.explore, args.workers, args.device)
    res["command"] = "python recipes/bundled_model/heldout_agreement.py " + " ".join(sys.argv[1:])
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
