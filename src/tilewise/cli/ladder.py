"""`tilewise ladder PRIMITIVE`: seed 000's optimization ladder for one primitive, measured (see `tilewise.ladder`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

PRIMITIVES = ("conv1d-cpu", "conv1d-gpu", "gemm-gpu", "dwsep-conv2d-gpu")


def register(sub: Any) -> None:
    """Add the `ladder` subcommand."""
    p = sub.add_parser("ladder", help="a primitive from its baseline schedule through each optimization, measured "
                                      "(seed 000), with the tuned best, the numpy/torch reference and the "
                                      "workgroup-vs-private staging verdict")
    p.add_argument("primitive", choices=PRIMITIVES, help="which ladder")
    p.add_argument("--device", help="conv1d-cpu: tvm-llvm (default); GPU ladders: webgpu (default) or webgpu:N; "
                                    "conv1d-gpu, gemm-gpu and dwsep-conv2d-gpu also cuda or cuda:N (TVM-emitted CUDA "
                                    "kernels; without TVM read from the store named by TILEWISE_TVM_CUDA_SOURCES)")
    p.add_argument("--shape", help="problem shape: conv1d M,N (16384,64); gemm M,N,K (1024,1024,1024); "
                                   "dwsep-conv2d B,C,H,W,O,K,P (1,64,56,56,128,3,1)")
    p.add_argument("--small", action="store_true", help="use the ladder's CI-sized shape")
    p.add_argument("--tune", type=int, default=24, metavar="N", help="configs a search adds to the rungs for "
                                                                      "the 'tuned best' rung (0: none; default 24)")
    p.add_argument("--tune-s", type=float, default=60.0, metavar="S", help="seconds for that search (default 60)")
    p.add_argument("--rounds", type=int, default=None, metavar="N", help="most interleaved timing rounds (default 100)")
    p.add_argument("--budget-s", type=float, default=None, metavar="S",
                   help="seconds after which no new timing round starts (default 8)")
    p.add_argument("--seed", type=int, default=0, help="inputs, search order and bootstrap")
    p.add_argument("--json", metavar="FILE", help="write {primitive, device, shape, reference_ms, rungs, staging}")
    p.add_argument("--plot", metavar="FILE", help="PNG of the rungs' medians with 95%% intervals")
    p.set_defaults(func=_cmd_ladder)


def _cmd_ladder(args: argparse.Namespace) -> int:
    from tilewise.errors import ConfigError
    from tilewise.kernels.base import parse_shape
    from tilewise.ladder import get_ladder, plot, resolve_ladder_device, run_ladder, validate_shape, write_json

    spec = get_ladder(args.primitive, args.device)  # --device cuda picks the TVM-emitted CUDA variant
    tpl = spec.template()
    if args.shape and args.small:
        raise ConfigError("--shape and --small both give a shape", "pass only one of them")
    shape = parse_shape(args.shape, tpl.shape_names) if args.shape else (spec.small_shape if args.small else spec.shape)
    shape = validate_shape(spec, shape)  # refuse bad shapes before a device starts
    mkw: dict[str, Any] = {}
    if args.rounds is not None:
        if args.rounds < 1:
            raise ConfigError(f"--rounds {args.rounds} times nothing", "give --rounds N with N >= 1")
        mkw.update(max_rounds=args.rounds, min_rounds=min(args.rounds, 20))
    if args.budget_s is not None:
        mkw["budget_s"] = args.budget_s
    if args.tune < 0:
        raise ConfigError(f"--tune {args.tune} is negative", "give --tune 0 (no tuned rung) or a positive count")
    choice = resolve_ladder_device(spec, args.device)
    print(choice.line(), file=sys.stderr, flush=True)
    device = choice.device

    def say(msg: str) -> None:
        print(f"  .. {msg}", file=sys.stderr, flush=True)

    result = run_ladder(args.primitive, device, shape, tune_count=args.tune, tune_seconds=args.tune_s,
                        measure_kw=mkw, seed=args.seed, progress=say)
    print(result.table())
    if args.json:
        write_json(result, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0
