"""The bundled model's MODEL_CARD.md text, built from the numbers a training run measured (no number typed by hand).

`card(results, model_dir, play_quality, lineage, cpu_latency)` reads `results.json` of
`recipes/bundled_model/train_h200.sh`, optionally a `play_quality.py --json` measurement (other games, another
engine: the card then shows both) and a `train_shape_latency.py --json` table (from a quiet machine, in place of the
one the training run measured beside its other work), and the NF4 model folder it describes (architecture, size).
`recipes/bundled_model/write_model_card.py` is its command line.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

RECIPE = "recipes/bundled_model"  # the scripts the card names, as the repository root sees them


def _fmt_int(x: float) -> str:
    return f"{int(x):,}"


def _train_args(argv: list[str]) -> str:
    """The train command's arguments with machine-specific paths replaced by their role."""
    roles = {"--data": "DATA.npz", "--out": "HF_DIR", "--nf4": "NF4_DIR", "--results-json": "RESULTS.json",
             "--tokenizer": "TOKENIZER.json", "--init": "PREVIOUS_HF_DIR"}
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        out.append(a)
        if a == "--data":  # one or more files: the expert data, then DAgger's on-policy records
            files = []
            while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                files.append(argv[i + 1])
                i += 1
            out += ["DATA.npz", *(f"DAGGER_R{k}.npz" for k in range(1, len(files)))]
        elif a == "--init" and i + 1 < len(argv) and not argv[i + 1].startswith("/"):
            out.append(argv[i + 1])  # a folder of this repository (the bundled model): its name says what it is
            i += 1
        elif a in roles and i + 1 < len(argv):
            out.append(roles[a])
            i += 1
        i += 1
    return " ".join(out)


def heldout_expert(record: dict[str, Any]) -> float:
    """Held-out agreement on the expert data's games (the first data file) of a `tilewise train` record."""
    parts = record["result"].get("heldout_by_data") or []
    return float(parts[0]["accuracy"] if parts else record["result"]["heldout_accuracy"])


def _dagger_lines(res: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(Data lines, Training lines) for the DAgger rounds of a run (empty without any)."""
    dg = res.get("dagger") or {}
    rounds = [r for r in dg.get("rounds", []) if r.get("collector")]
    if not rounds:
        return [], []
    trains = res.get("train_rounds") or []
    mix = f", the expert's action played instead with probability {dg['beta']:g} per step" if dg.get("beta") else ""
    data = [f"- DAgger (dataset aggregation): {len(rounds)} round(s) after the first training. In each, the current "
            f"model played {dg['games']} games in lockstep on the training device (every 4th from the empty board, "
            "the others after an "
            f"expert roll-in of 1-{dg['prefix_pieces']} pieces; then the model for up to {dg['policy_pieces']} "
            f"pieces{mix}), and every position it reached was recorded with the expert's action as the label "
            "(`tilewise.train.collect.collect_on_policy`):"]
    for r in rounds:
        c = r["collector"]
        fe = c.get("from_empty") or {}
        empty = (f"; from the empty board it placed {fe['mean_pieces']:.1f} pieces and cleared "
                 f"{fe['mean_lines']:.1f} lines on average (cap {dg['policy_pieces']})" if fe.get("games") else "")
        data.append(f"  - round {r['round']}: {_fmt_int(c['positions'])} positions in {r.get('collect_s', '?')} s; "
                    f"the model agreed with the expert on {c['policy_agreement']:.3f} of the positions it reached"
                    f"{empty}.")
    train = []
    for r in rounds:
        t = r.get("train")
        if not t:
            train.append(f"- DAgger round {r['round']}: {r.get('status', 'not trained')}.")
            continue
        rec = trains[r["round"]] if r["round"] < len(trains) else {}
        st = rec.get("settings", {})
        which = "round 1's records" if r["round"] == 1 else f"rounds 1-{r['round']}'s records"
        train.append(f"- DAgger round {r['round']}: continued from the previous weights (`--init`) on the expert data "
                     f"plus {which} (on-policy files repeated {r.get('data_repeat', 1)}x, "
                     f"{_fmt_int(t['decisions'])} decisions): {t['steps']} steps ({t['epochs_done']:.2f} epochs) in "
                     f"{t['train_time_s']:.0f} s, peak lr {st.get('lr', float('nan')):g} (warm-up "
                     f"{st.get('warmup_steps', '?')}); held-out agreement: expert games {t['heldout_expert']:.3f}, "
                     "on-policy games " + ", ".join(f"{a:.3f}" for a in t["heldout_onpolicy"]) + ".")
    return data, train


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


def _train_agreement(result: dict[str, Any]) -> str:
    acc = result.get("train_accuracy")
    if acc is None or acc != acc:  # NaN: the run skipped it
        return "Training-set agreement not measured (`--train-eval-examples 0`)."
    return f"Training-set agreement {acc:.3f}."


def card(res: dict[str, Any], model_dir: Path, play_quality: dict[str, Any] | None, lineage: str = "",
         cpu_latency: dict[str, Any] | None = None) -> str:
    """The card's markdown text."""
    from tilewise.model.checkpoint import Checkpoint

    ck = Checkpoint.open(model_dir)
    cfg = ck.config
    tr, data = res["train"], res["data"]  # tr: the run that made the shipped model
    first = (res.get("train_rounds") or [tr])[0]  # the first training (behaviour cloning on the expert data)
    result, settings = first["result"], first["settings"]
    dagger_data, dagger_train = _dagger_lines(res)
    explore = data.get("explore")
    explore_text = (f"{explore:.0%} exploration steps (a random rotation or shift) whose label stays the expert's "
                    "action" if explore else "no exploration steps")
    detour = data.get("detour") or 0.0
    if detour:
        explore_text += (f"; {detour:.0%} of the pieces first took a detour of 1-3 random sideways steps, after which "
                         "the expert played on, every label staying the expert's action")
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
        f"{data.get('seed', 0) + data['rounds'] - 1}; {explore_text}).",
        *dagger_data,
        f"- Held out: {first['heldout_games']} whole expert games ({_fmt_int(first['heldout_decisions'])} decisions, "
        f"{first['heldout_fraction']:.0%} of the games{', detours included' if detour else ''}) for agreement "
        "numbers"
        + ("; each DAgger round's records are split the same way, and the expert games held out stay the same in "
           "every round." if dagger_data else "."), "",
        "## Training", "",
        f"- Command: `{RECIPE}/train_h200.sh OUT_DIR{''.join(' ' + shlex.quote(a) for a in res['argv'][1:])}`, "
        "which runs "
        f"`python -m tilewise.train {_train_args(first['argv'])}` (= `tilewise train ...`)"
        + (f", then per DAgger round `python -m tilewise.train {_train_args(tr['argv'])}`."
           if len(res.get("train_rounds") or []) > 1 else "."),
        *([f"- Starting point: {lineage}"] if lineage else []),
        f"- {result['steps']} AdamW steps ({result['epochs_done']:.2f} epochs) of batch {settings['batch_size']}, "
        f"peak lr {settings['lr']:g} (warm-up {settings['warmup_steps']}, cosine to 10% over the time budget), "
        f"weight decay {settings['weight_decay']:g}, bf16 autocast, seed {settings['seed']}.",
        f"- {result['train_time_s']:.0f} s on {res['gpu'] if res.get('gpu', 'none') != 'none' else result['device']} "
        f"({result['tokens_per_s']:,.0f} tokens/s); torch {res.get('torch', '?')}; held-out agreement after it "
        f"{heldout_expert(first):.3f}.",
        *dagger_train, "",
        "## Quality", "",
        f"- Agreement with the expert's action on the held-out expert games: {heldout_expert(tr):.3f} (float32), "
        f"{res.get('nf4_heldout_agreement', float('nan')):.3f} (this NF4 model). "
        + _train_agreement(tr["result"]),
    ]
    per_action = res.get("nf4_heldout_per_action") or tr["result"].get("heldout_per_action") or {}
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
        title = f"Played over the same seeded games (engine seeds {min(seeds)}-{max(seeds)}; `{RECIPE}/train_h200.sh`):"
        out += ["", *_play_rows(title, play)]
    extra = res.get("model_play_extra")
    if extra:
        seeds = [g["seed"] for g in extra["per_game"]]
        out += ["", f"The model also played {extra['games']} more games (engine seeds {min(seeds)}-{max(seeds)}, cap "
                    f"{extra['max_pieces']} pieces, `--extra-play-games`): mean {extra['mean_lines']:.1f} lines, "
                    f"{extra['mean_pieces']:.1f} pieces"
                    + (" (stopped by the time budget)." if extra.get("stopped_by_time") else ".")]
    if play_quality:
        cmd = play_quality.get("command", f"python {RECIPE}/play_quality.py")
        out += ["", *_play_rows(f"Also played with `{cmd}`:", play_quality["results"])]
    lat = cpu_latency or res.get("cpu_latency")
    if lat:
        out += ["", f"CPU decision latency (tilewise CPU executor, {lat['usable_cores']} of the machine's "
                    f"{lat['cpus']} cores, "
                    f"{lat['blas_threads']} BLAS threads, cached 42-token prefix + the rest of a 348-token prompt, "
                    f"random weights of the same shape; `{RECIPE}/train_shape_latency.py`):", "",
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
