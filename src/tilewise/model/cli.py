"""`tilewise convert SRC DST --format nf4|f16|f32`: re-store an LFM2 checkpoint in tilewise's format."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    """Add the `convert` subcommand."""
    p = sub.add_parser("convert", help="convert an HF LFM2 folder (or a preset) to a tilewise nf4/f16/f32 checkpoint",
                       description="Convert an HF LFM2 folder, a tilewise checkpoint or a preset (seeded random "
                                   "weights) into a tilewise checkpoint folder. Projections, FFN and embeddings take "
                                   "the chosen format; norms, conv taps and the classifier head stay float32.")
    p.add_argument("src", help="HF LFM2 folder, tilewise checkpoint, or preset name (lfm2-350m, seed-250m, tiny)")
    p.add_argument("dst", help="output folder (model.safetensors, config.json, tokenizer.json if the source has one)")
    p.add_argument("--format", choices=("nf4", "f16", "f32"), default="nf4", help="weight format (default nf4)")
    p.add_argument("--blocksize", type=int, default=64, help="NF4 weights per absmax block, 32..4096 (default 64)")
    p.add_argument("--double-quant", action="store_true", help="NF4: store absmax 8-bit (blocks of 256)")
    p.add_argument("--seed", type=int, default=0, help="seed of a preset's random weights (default 0)")
    p.set_defaults(func=_cmd_convert)


def _cmd_convert(args: argparse.Namespace) -> int:
    from tilewise.errors import ConfigError
    from tilewise.model.checkpoint import Checkpoint, is_matrix, random_checkpoint
    from tilewise.model.config import PRESETS
    from tilewise.quant.nf4 import BLOCKSIZES, NF4Tensor, decode, roundtrip_stats

    if args.blocksize not in BLOCKSIZES:
        raise ConfigError(f"--blocksize {args.blocksize} is not supported", f"use one of {BLOCKSIZES}")
    src = str(args.src)
    if src in PRESETS and not Path(src).exists():
        ck = random_checkpoint(PRESETS[src], seed=args.seed)
    else:
        ck = Checkpoint.open(src)
    dst = Path(args.dst)
    if dst.exists() and any(dst.iterdir()) and not (dst / "model.safetensors").exists():
        raise ConfigError(f"{dst} exists and is not a tilewise checkpoint folder", "choose a new or empty folder")
    out = ck.converted(args.format, args.blocksize, args.double_quant)
    worst = 0.0
    if args.format == "nf4":
        for name in out.names():
            t = out.get(name)
            if isinstance(t, NF4Tensor) and is_matrix(name):
                worst = max(worst, roundtrip_stats(decode(ck.get(name)), t)["rel_frobenius"])
    out.save(dst)
    size_mb = (dst / "model.safetensors").stat().st_size / 1e6
    n_params = ck.config.parameter_count()
    print(f"wrote {dst}: {ck.config.name}, {len(out.names())} tensors, {n_params / 1e6:.1f}M weights, "
          f"{size_mb:.1f} MB ({8e6 * size_mb / n_params:.2f} bits/weight), format {args.format}"
          + (f", blocksize {args.blocksize}{', double-quant' if args.double_quant else ''}" if args.format == "nf4"
             else ""))
    if args.format == "nf4":
        print(f"worst NF4 round-trip relative Frobenius error over the matrices: {worst:.4f}")
    print(f"head: {'score.weight present' if out.has_head else 'none (hidden() works, scores() will not)'}; "
          f"tokenizer: {'copied' if ck.tokenizer_path else 'none'}")
    return 0
