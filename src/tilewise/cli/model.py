"""`tilewise convert SRC DST --format nf4|f16|f32` (re-store an LFM2 checkpoint in tilewise's format) and
`tilewise bench` (decision latency of the classifier on a device; the measuring is `tilewise.model.bench`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tilewise.cli import common


def register(sub: Any) -> None:
    """Add the `convert` and `bench` subcommands."""
    register_bench(sub)
    p = sub.add_parser("convert", help="convert an HF LFM2 folder (or a preset) to a tilewise nf4/f16/f32 checkpoint",
                       description="Convert an HF LFM2 folder, a tilewise checkpoint or a preset (seeded random "
                                   "weights) into a tilewise checkpoint folder. Projections, FFN and embeddings take "
                                   "the chosen format; norms, conv taps and the classifier head stay float32.",
                       epilog="examples:\n  tilewise convert lfm2-350m models/lfm2-350m-nf4\n"
                              "  tilewise convert path/to/hf-lfm2 models/mine-f16 --format f16")
    p.add_argument("src", help="HF LFM2 folder, tilewise checkpoint, or preset name (lfm2-350m, seed-250m, tiny)")
    p.add_argument("dst", help="output folder (model.safetensors, config.json, tokenizer.json if the source has one)")
    p.add_argument("--format", choices=("nf4", "f16", "f32"), default="nf4", help="weight format (default nf4)")
    p.add_argument("--blocksize", type=common.int_at_least(32, 4096), default=64,
                   help="NF4 weights per absmax block, 32..4096 (default 64)")
    p.add_argument("--double-quant", action="store_true", help="NF4: store absmax 8-bit (blocks of 256)")
    p.add_argument("--seed", type=common.seed, default=0, help="seed of a preset's random weights (default 0)")
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


def _cmd_bench(args: argparse.Namespace) -> int:
    import os
    import warnings

    import tilewise
    from tilewise.devices.cpu import set_threads
    from tilewise.errors import ConfigError
    from tilewise.model.bench import PREFIX_TOKENS, bench_model, print_result

    if args.seq < 2:
        raise ConfigError(f"--seq {args.seq} is too short for a decision", "use --seq 2 or more (the game uses 346)")
    if args.prefix is not None and args.prefix >= args.seq:
        raise ConfigError(f"--prefix {args.prefix} must be shorter than --seq {args.seq}",
                          f"use --prefix 1..{args.seq - 1} (the game shares {PREFIX_TOKENS} tokens)")
    prefix = args.prefix or (PREFIX_TOKENS if args.seq > PREFIX_TOKENS else max(1, args.seq // 7))
    con = common.console(args)
    setup = set_threads(args.threads)  # before the model loads: the CPU executor and reference use this pool
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = tilewise.load(args.preset, device=args.device, weights=args.weights, seed=args.seed)
    say = lambda text: con.print(text, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    say(model.device_choice.line())
    say(setup.line())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > setup.threads and setup.threads > 1:
        say(f"note: load average {load:.1f} with {setup.threads} BLAS threads: other work competes for the cores; "
            "--threads 1 may time faster and steadier")
    for w in caught:
        say(f"note: {w.message}")
    cpu = None
    if not args.no_reference and not str(args.device).startswith("cpu"):
        cpu = tilewise.load(args.preset, device="cpu", weights=args.weights, seed=args.seed)
    res = bench_model(model, args.seq, args.decisions, prefix=prefix, cpu_model=cpu, log=say)
    res["threads"] = setup.line()
    res["blas_threads"] = setup.threads
    info = model.device_choice.device.info
    if info.backend == "webgpu" and res.get("latency_samples_ms"):
        from tilewise.model.measured import record_decision

        # kept per device, so that `auto` can take whichever WebGPU runtime decided faster on this GPU
        record_decision(info.fingerprint, model.config.name, model.weights, args.seq, res["latency_samples_ms"])
    print_result(res, con)
    common.emit_json(args.json, res, say)
    return 0


def register_bench(sub: Any) -> None:
    """Add `tilewise bench`."""
    from tilewise.model.bench import PREFIX_TOKENS

    p = sub.add_parser("bench", help="decision latency of the classifier on a device (per-op GPU time, p50/p99, "
                                     "APM, score agreement with the CPU)",
                       description="Time decisions of the classifier (one prompt of --seq tokens, batch 1) on a "
                                   "device: latency percentiles, the prefix cache's and final-row slicing's savings "
                                   "(a tie or 'too noisy to compare' when the samples cannot rank them), per-op GPU "
                                   "time, and agreement with the CPU executor.",
                       epilog="examples:\n  tilewise bench --preset tiny --seq 40 --decisions 5 --device webgpu\n"
                              "  tilewise bench --device cpu --preset tiny --threads 1 --json bench.json")
    p.add_argument("--device", default="auto", help="auto (the fastest with a classifier executor), webgpu, webgpu:N, "
                                                   "cuda, cuda:N or cpu (default auto)")
    p.add_argument("--preset", default="seed-250m", help="model preset or path (default seed-250m)")
    p.add_argument("--seq", type=common.int_at_least(2), default=346, help="prompt tokens per decision (default 346)")
    p.add_argument("--decisions", type=common.positive, default=50, help="timed decisions (default 50)")
    p.add_argument("--weights", default="nf4", choices=("nf4", "f16", "f32"), help="weight format (default nf4)")
    p.add_argument("--prefix", type=common.positive, default=None, metavar="N",
                   help=f"shared prefix tokens for the cached run (default: {PREFIX_TOKENS}, or --seq / 7 when "
                        "--seq is that short)")
    p.add_argument("--seed", type=common.seed, default=0, help="seed of a preset's random weights (default 0)")
    p.add_argument("--threads", type=common.positive, default=None, metavar="N",
                   help="BLAS threads of the CPU executor and reference (default: OPENBLAS_NUM_THREADS, "
                        "MKL_NUM_THREADS or OMP_NUM_THREADS when set, else the physical cores available)")
    p.add_argument("--no-reference", action="store_true", help="skip the CPU score comparison")
    common.add_json(p, "the result")
    p.set_defaults(func=_cmd_bench)
