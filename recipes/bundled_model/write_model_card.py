"""Write the bundled model's MODEL_CARD.md from the numbers a training run measured (no number typed by hand).

    PYTHONPATH=src python recipes/bundled_model/write_model_card.py RESULTS_JSON [--play-quality JSON]
        [--cpu-latency JSON] [--model DIR] [--out FILE]

RESULTS_JSON is `results.json` of `train_h200.sh` (this folder); `--play-quality` adds a `play_quality.py --json`
measurement (other games, another engine: the card then shows both); `--cpu-latency` takes the CPU latency table
from a `train_shape_latency.py --json` run on a quiet machine instead of the one the training run measured beside
its other work; `--model` is the NF4 folder described (default: src/tilewise/model/default). The text is built by
`tilewise.train.card.card`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tilewise.train.card import RECIPE, card

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help=f"results.json of {RECIPE}/train_h200.sh")
    ap.add_argument("--play-quality", default=None, help=f"JSON of {RECIPE}/play_quality.py --json")
    ap.add_argument("--cpu-latency", default=None, help=f"JSON of {RECIPE}/train_shape_latency.py --json (replaces "
                    "the run's own CPU latency table)")
    ap.add_argument("--model", default=str(ROOT / "src" / "tilewise" / "model" / "default"))
    ap.add_argument("--out", default=None, help="default: MODEL_CARD.md in the model folder")
    ap.add_argument("--lineage", default="", help="where the first training started (when it used --init)")
    args = ap.parse_args()
    res = json.loads(Path(args.results).read_text())
    pq = json.loads(Path(args.play_quality).read_text()) if args.play_quality else None
    model_dir = Path(args.model)
    lat = json.loads(Path(args.cpu_latency).read_text()) if args.cpu_latency else None
    text = card(res, model_dir, pq, args.lineage, lat)
    out = Path(args.out) if args.out else model_dir / "MODEL_CARD.md"
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
