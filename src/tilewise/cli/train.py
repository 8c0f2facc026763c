"""`tilewise train`: imitate the expert player with an LFM2 classifier; write an HF folder (and NF4 with --nf4).

    tilewise train --data games.npz [more.npz ...] --out runs/m [--shape default] [--steps N | --epochs E]
                   [--time-budget-s S] [--batch B] [--lr LR] [--seed S] [--device auto|cpu|cuda] [--nf4 DIR]
                   [--init HF_DIR]

Several `--data` files train on all their records; each file is split into training and held-out games on its own
(`tilewise.train.data.load_split`), and the agreement on each file's held-out games is reported too. `--init`
starts from a saved model's weights (its shape; e.g. a DAgger round continuing the previous round's model).

Needs the `train` extra (torch).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tilewise.cli import common
from tilewise.errors import ConfigError, DeviceUnavailable


def _attn_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--attn takes comma-separated block indices, got {text!r}") from None


def register(sub: Any) -> None:
    """Add the `train` subcommand to the CLI's subparsers."""
    p = sub.add_parser("train", help="train an LFM2 classifier to imitate the expert player (needs torch)",
                       description="Train an LFM2-architecture classifier (conv + attention blocks, SwiGLU, 8-way "
                                   "head on the last position) on `tilewise game dataset` records. Writes an HF "
                                   "folder (config.json, model.safetensors, tokenizer.json, training.json).",
                       epilog="examples:\n  tilewise game dataset --games 50 --seed 1 --out games.npz\n"
                              "  tilewise train --data games.npz --out runs/m --shape tiny --steps 200 "
                              "--nf4 runs/m-nf4")
    p.add_argument("--data", required=True, nargs="+", metavar="FILE",
                   help="dataset file(s) from `tilewise game dataset` (or DAgger's on-policy records); each file is "
                        "split into training and held-out games on its own")
    p.add_argument("--out", required=True, help="output folder for the HF-style model")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json the dataset was made with (default: the game's)")
    p.add_argument("--shape", default=None,
                   help="model shape: default, small or tiny (default: default, or the --init model's shape)")
    p.add_argument("--hidden", type=common.int_at_least(8, 65536), help="override the shape's hidden size")
    p.add_argument("--layers", type=common.int_at_least(1, 256), help="override the number of blocks")
    p.add_argument("--attn", type=_attn_list, help="attention block indices, e.g. 2,5,7")
    p.add_argument("--ffn", type=common.int_at_least(8, 262144), help="override the SwiGLU width")
    p.add_argument("--heads", type=common.int_at_least(1, 1024), help="override the query heads")
    p.add_argument("--kv-heads", type=common.int_at_least(1, 1024), help="override the key/value heads")
    p.add_argument("--epochs", type=common.float_in(0.0, 1e6, low_open=True), default=1.0,
                   help="passes over the training games (default 1)")
    p.add_argument("--steps", type=common.non_negative, default=0, help="cap on optimizer steps (default: none)")
    p.add_argument("--time-budget-s", type=common.float_in(0.0), default=0.0,
                   help="stop training after this many seconds (anneals to it) and still write the model")
    p.add_argument("--batch", type=common.int_at_least(1, 1 << 20), default=64, help="decisions per step (default 64)")
    p.add_argument("--lr", type=common.float_in(0.0, 10.0), default=1e-3,
                   help="peak learning rate (default 1e-3)")
    p.add_argument("--warmup", type=common.non_negative, default=100, help="warm-up steps (default 100)")
    p.add_argument("--weight-decay", type=common.float_in(0.0, 10.0), default=0.05,
                   help="AdamW weight decay on matrices")
    p.add_argument("--heldout", type=common.float_in(0.0, 0.9), default=0.05,
                   help="share of games held out for agreement (default 0.05)")
    p.add_argument("--seed", type=common.seed, default=0, help="seed of init, shuffles and the held-out split")
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cpu or cuda[:N]")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (faster on a GPU after warm-up)")
    p.add_argument("--log-every", type=common.positive, default=50, help="steps between progress lines")
    p.add_argument("--eval-every-s", type=common.float_in(0.0), default=30.0,
                   help="seconds between held-out evaluations")
    p.add_argument("--train-eval-examples", type=common.non_negative, default=20_000,
                   help="training decisions whose agreement is reported at the end (0: skip; slow on a CPU)")
    p.add_argument("--nf4", default=None, metavar="DIR", help="also convert the result to NF4 into DIR")
    p.add_argument("--data-repeat", type=common.int_at_least(1, 1000), nargs="+", default=None, metavar="N",
                   help="per --data file, how many times its training decisions are in an epoch (oversampling, e.g. "
                        "DAgger's on-policy files; default 1 each)")
    p.add_argument("--init", default=None, metavar="HF_DIR",
                   help="start from this model folder's weights (e.g. an earlier `tilewise train --out`) instead of a "
                        "fresh initialisation; the shape is the folder's")
    p.add_argument("--aux-target-weight", type=common.float_in(0.0, 100.0), default=0.0, metavar="W",
                   help="weight of a training-only loss on the expert's target placement (rotation state and pivot "
                        "column, recorded in the dataset), predicted from the head's hidden state; 0: off")
    p.add_argument("--json", "--results-json", dest="results_json", default=None, type=common.output_file,
                   metavar="FILE", help="write the run's results as JSON to FILE ('-' for stdout)")
    p.set_defaults(func=_cmd_train)


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise DeviceUnavailable("`tilewise train` needs torch, which is not installed",
                                "pip install 'tilewise[train]'") from None


def _cmd_train(args: argparse.Namespace) -> int:
    _need_torch()
    import numpy as np

    from tilewise.game.tokenizer import TOKENIZER_PATH, load_tokenizer
    from tilewise.train.data import load_split
    from tilewise.train.shapes import model_config
    from tilewise.train.trainer import TrainSettings, save_hf_folder, shape_key, train

    def log(line: str) -> None:
        print(line, flush=True)

    tok_path = Path(args.tokenizer) if args.tokenizer else TOKENIZER_PATH
    if tok_path.is_dir():
        tok_path = tok_path / "tokenizer.json"
    tok = load_tokenizer(tok_path)
    overrides = dict(hidden=args.hidden, layers=args.layers, attn=args.attn, ffn=args.ffn, heads=args.heads,
                     kv_heads=args.kv_heads)
    cfg = model_config(tok, args.shape or "default", **overrides)
    if args.init:
        from tilewise.train.export import checkpoint_weights

        init_cfg = checkpoint_weights(args.init)[0]
        asked = args.shape is not None or any(v is not None for v in overrides.values())
        if asked and shape_key(init_cfg) != shape_key(cfg):
            raise ConfigError(f"--init {args.init} holds a model of shape {shape_key(init_cfg)}, but --shape and its "
                              f"overrides ask for {shape_key(cfg)}",
                              "leave out --shape and its overrides with --init (the model's shape is used)")
        cfg = init_cfg  # the saved model's own config (its shape, numerics and special ids)
        if cfg.vocab_size != tok.get_vocab_size(with_added_tokens=True):
            raise ConfigError(f"--init {args.init} has a vocabulary of {cfg.vocab_size} tokens, the tokenizer "
                              f"{tok.get_vocab_size(with_added_tokens=True)}",
                              "train with the tokenizer the model was trained with (--tokenizer)")
    t0 = time.perf_counter()
    data_paths = list(args.data)
    if args.data_repeat is not None and (len(args.data_repeat) != len(data_paths)
                                         or min(args.data_repeat) < 0 or max(args.data_repeat) < 1):
        raise ConfigError(f"--data-repeat {args.data_repeat} needs one count >= 0 per --data file "
                          f"({len(data_paths)}), at least one of them >= 1",
                          "e.g. --data a.npz b.npz --data-repeat 1 3")
    train_ex, held_ex, held_parts, train_sizes = load_split(data_paths, args.heldout, args.seed, tokenizer=tok,
                                                            pad_id=cfg.pad_token_id or 0)
    repeats = None
    if args.data_repeat is not None and any(r != 1 for r in args.data_repeat):
        repeats = np.repeat(np.array(args.data_repeat, dtype=np.int64), train_sizes)
        log(f"data: each file's training decisions repeated {args.data_repeat} times per epoch")
    n_all = len(train_ex) + len(held_ex)
    lengths = [x.lengths for x in (train_ex, held_ex) if len(x)]
    log(f"data: {n_all} decisions from {', '.join(data_paths)} in {time.perf_counter() - t0:.1f} s; "
        f"prompt length {min(int(x.min()) for x in lengths)}..{max(int(x.max()) for x in lengths)} tokens")
    settings = TrainSettings(epochs=args.epochs, max_steps=args.steps, time_budget_s=args.time_budget_s,
                             batch_size=args.batch, lr=args.lr, weight_decay=args.weight_decay,
                             warmup_steps=args.warmup, seed=args.seed, device=args.device,
                             eval_every_s=args.eval_every_s, log_every=args.log_every, compile=args.compile,
                             init=str(args.init or ""), aux_target_weight=args.aux_target_weight,
                             train_eval_examples=args.train_eval_examples)
    model, result = train(cfg, train_ex, held_ex, settings, log=log, heldout_parts=held_parts, repeats=repeats)
    record = {
        "argv": sys.argv[1:],
        "data": data_paths[0] if len(data_paths) == 1 else data_paths,
        "data_train_decisions": train_sizes,
        "data_repeat": args.data_repeat,
        "decisions": n_all,
        "train_decisions": len(train_ex),
        "heldout_decisions": len(held_ex),
        "heldout_fraction": args.heldout,
        "heldout_games": len(set(held_ex.games.tolist())),
        "parameters": cfg.parameter_count(),
        "shape": {"hidden": cfg.hidden_size, "layers": cfg.num_layers, "attention_layers": cfg.attention_layers,
                  "ffn": cfg.ffn_dim, "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
                  "vocab": cfg.vocab_size},
        "settings": settings,
        "result": result,
    }
    out = save_hf_folder(model, cfg, args.out, tok_path, training=record)
    log(f"wrote {out} (config.json, model.safetensors, tokenizer.json, training.json)")
    if args.nf4:
        from tilewise.train.export import convert_to_nf4

        nf4_dir = convert_to_nf4(out, args.nf4)
        log(f"wrote NF4 model {nf4_dir}")
    if args.results_json:
        common.emit_json(args.results_json, json.loads(json.dumps(record, default=_default)))
    return 0


def _default(x: Any) -> Any:
    from tilewise.train.trainer import _jsonable

    return _jsonable(x)

