"""Write the bundled model's MODEL_CARD.md from the numbers a training run measured (no number typed by hand).

    PYTHONPATH=src python bench/write_model_card.py RESULTS_JSON [--play-quality JSON] [--model DIR] [--out FILE]

RESULTS_JSON is `results.json` of `bench/train_h200.sh`; `--play-quality` adds a `bench/play_quality.py --json`
measurement made with tilewise's own runtime (the card then shows both); `--model` is the NF4 folder described
(default: src/tilewise/model/default).
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _fmt_int(x: float) -> str:
    return f"{int(x):,}"


def _train_args(argv: list[str]) -> str:
    """The train command's arguments with machine-specific paths replaced by their role."""
    roles = {"--data": "DATA.npz", "--out": "HF_DIR", "--nf4": "NF4_DIR", "--results-json": "RESULTS.json",
             "--tokenizer": "TOKENIZER.json"}
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        out.append(a)
        if a in roles and i + 1 < len(argv):
            out.append(roles[a])
            i += 1
        i += 1
    return " ".join(out)


def _play_rows(title: str, results: dict[str, Any]) -> list[str]:
    lines = [title, "", "| policy | engine | games | piece cap | mean lines | mean pieces | games at cap |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for name in ("model", "expert", "random"):
        r = results.get(name)
        if r:
            lines.append(f"| {name} | {r.get('engine', '')} | {r['games']} | {r['max_pieces']} | "
                         f"{r['mean_lines']:.1f} | {r['mean_pieces']:.1f} | {r['games_at_cap']} |")
    if results.get("model") and results.get("expert") and results["expert"]["mean_lines"]:
        share = results["model"]["mean_lines"] / results["expert"]["mean_lines"]
        lines += ["", f"Model lines / expert lines: {share:.2f}."]
    return lines


def card(res: dict[str, Any], model_dir: Path, play_quality: dict[str, Any] | None) -> str:
    """The card's markdown text."""
    from tilewise.model.checkpoint import Checkpoint

    ck = Checkpoint.open(model_dir)
    cfg = ck.config
    tr, result, data = res["train"], res["train"]["result"], res["data"]
    settings = tr["settings"]
    size_mib = (model_dir / "model.safetensors").stat().st_size / 2**20
    attn = ", ".join(str(i) for i in cfg.attention_layers)
    out = [
        "# tilewise default classifier", "",
        "A small LFM2-architecture classifier that plays tilewise's polyomino game by imitating the game's expert "
        "player. It reads the game's ~350-token prompt and scores 8 outputs (6 actions, 2 reserved). It ships inside "
        "the package as NF4 weights and is what `tilewise play --policy model` uses by default.", "",
        "License: Apache-2.0 (weights and code).", "",
        "## Architecture", "",
        f"- LFM2 blocks: {cfg.num_layers} (short-conv blocks, attention at {attn}), hidden {cfg.hidden_size}, "
        f"SwiGLU FFN {cfg.ffn_dim}, {cfg.num_attention_heads} query heads / {cfg.num_key_value_heads} KV heads of "
        f"{cfg.head_dim}, RoPE theta {cfg.rope_theta:g}, RMSNorm eps {cfg.norm_eps:g}, conv kernel {cfg.conv_L_cache}.",
        f"- Head: `score.weight` ({cfg.num_labels} x {cfg.hidden_size}) on the last position's final hidden state.",
        f"- Vocabulary: {cfg.vocab_size} tokens (the game's byte-level BPE tokenizer, `tokenizer.json` here).",
        f"- Parameters: {_fmt_int(cfg.parameter_count())} "
        f"({_fmt_int(cfg.parameter_count(with_embeddings=False))} without the embedding).",
        f"- Weights: NF4 (bitsandbytes layout, blocks of 64 with float32 absmax) for the projections, FFN "
        f"matrices and the embedding; norms, conv taps and the 8-row head in float32. `model.safetensors` is "
        f"{size_mib:.2f} MiB.", "",
        "## Data", "",
        f"- {_fmt_int(data['decisions'])} decisions from {data['games']} expert games (at most {data['max_pieces']} "
        f"pieces each; expert mean {data['expert_mean_lines_per_game']:.0f} lines / "
        f"{data['expert_mean_pieces_per_game']:.0f} pieces per game), generated with `tilewise.game.dataset.generate` "
        f"in {data['rounds']} rounds (dataset seeds {data.get('seed', '?')} to "
        f"{data.get('seed', 0) + data['rounds'] - 1}; 2% exploration steps whose label stays the expert's action).",
        f"- Held out: {tr['heldout_games']} whole games ({_fmt_int(tr['heldout_decisions'])} decisions, "
        f"{tr['heldout_fraction']:.0%} of the games) for agreement numbers.", "",
        "## Training", "",
        f"- Command: `bench/train_h200.sh OUT_DIR{''.join(' ' + shlex.quote(a) for a in res['argv'][1:])}`, which runs "
        f"`python -m tilewise.train {_train_args(tr['argv'])}` (= `tilewise train ...`).",
        f"- {result['steps']} AdamW steps ({result['epochs_done']:.2f} epochs) of batch {settings['batch_size']}, "
        f"peak lr {settings['lr']:g} (warm-up {settings['warmup_steps']}, cosine to 10% over the time budget), "
        f"weight decay {settings['weight_decay']:g}, bf16 autocast, seed {settings['seed']}.",
        f"- {result['train_time_s']:.0f} s on {res['gpu'] if res.get('gpu', 'none') != 'none' else result['device']} "
        f"({result['tokens_per_s']:,.0f} tokens/s); torch {res.get('torch', '?')}.", "",
        "## Quality", "",
        f"- Agreement with the expert's action on the held-out games: {result['heldout_accuracy']:.3f} (float32), "
        f"{res.get('nf4_heldout_agreement', float('nan')):.3f} (this NF4 model). Training-set agreement "
        f"{result['train_accuracy']:.3f}.",
    ]
    per_action = res.get("nf4_heldout_per_action") or result.get("heldout_per_action") or {}
    if per_action:
        out.append("- NF4 agreement per expert action: "
                   + ", ".join(f"{k} {v:.3f}" for k, v in per_action.items()) + ".")
    play: dict[str, Any] = {}
    if res.get("model_play"):
        mp = res["model_play"]
        play["model"] = {**mp, "engine": "torch, NF4 weights" + (" (stopped by time)" if mp.get("stopped_by_time")
                                                                else "")}
    for name, b in (res.get("baselines") or {}).items():
        play[name] = b
    if play:
        seeds = [g["seed"] for g in next(iter(play.values()))["per_game"]]
        title = f"Played over the same seeded games (engine seeds {min(seeds)}-{max(seeds)}; `bench/train_h200.sh`):"
        out += ["", *_play_rows(title, play)]
    if play_quality:
        cmd = play_quality.get("command", "python bench/play_quality.py")
        out += ["", *_play_rows(f"With tilewise's runtime (`{cmd}`):", play_quality["results"])]
    lat = res.get("cpu_latency")
    if lat:
        out += ["", f"CPU decision latency (tilewise CPU executor, {lat['usable_cores']} pinned cores, "
                    f"{lat['blas_threads']} BLAS threads, cached 42-token prefix + the rest of a 348-token prompt, "
                    "random weights of the same shape; `bench/train_shape_latency.py`):", "",
                "| shape | parameters | p20 ms | p50 ms | p80 ms |", "| --- | ---: | ---: | ---: | ---: |"]
        for row in lat["rows"]:
            out.append(f"| {row['shape']} | {_fmt_int(row['parameters'])} | {row['decision_ms_p20']} | "
                       f"{row['decision_ms_p50']} | {row['decision_ms_p80']} |")
    out += ["", "## Intended use and limits", "",
            "A demonstration workload for tilewise's kernels and runtime: it plays the game's 11x21 board with the "
            "game's prompt format and tokenizer only. It imitates one fixed expert (a one-piece placement search "
            "with El-Tetris weights and a fixed action order) and inherits its choices, including never using soft "
            "drop and ignoring the preview piece. Outputs 6 and 7 are reserved and untrained.", ""]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="results.json of bench/train_h200.sh")
    ap.add_argument("--play-quality", default=None, help="JSON of bench/play_quality.py --json")
    ap.add_argument("--model", default=str(ROOT / "src" / "tilewise" / "model" / "default"))
    ap.add_argument("--out", default=None, help="default: MODEL_CARD.md in the model folder")
    args = ap.parse_args()
    res = json.loads(Path(args.results).read_text())
    pq = json.loads(Path(args.play_quality).read_text()) if args.play_quality else None
    model_dir = Path(args.model)
    text = card(res, model_dir, pq)
    out = Path(args.out) if args.out else model_dir / "MODEL_CARD.md"
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
