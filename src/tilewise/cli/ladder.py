"""`tilewise ladder PRIMITIVE`: seed 000's optimization ladder for one primitive, measured (see `tilewise.ladder`)."""

from __future__ import annotations

import argparse
from typing import Any

from tilewise.cli import common

PRIMITIVES = ("conv1d-cpu", "conv1d-gpu", "gemm-gpu", "dwsep-conv2d-gpu")
TVM_FIX = ("in a clone: bash scripts/run extras tvm; installed from an index: pip install 'tilewise[tvm]'; "
           "the GPU ladders need no TVM: tilewise ladder gemm-gpu --small")


def register(sub: Any) -> None:
    """Add the `ladder` subcommand."""
    p = sub.add_parser("ladder", help="a primitive from its baseline schedule through each optimization, measured "
                                      "(seed 000), with the tuned best, the numpy/torch reference and the "
                                      "workgroup-vs-private staging verdict",
                       epilog="examples:\n  tilewise ladder gemm-gpu --small --tune 2\n"
                              "  tilewise ladder conv1d-cpu --json conv1d.json --plot conv1d.png   (needs TVM)")
    p.add_argument("primitive", choices=PRIMITIVES,
                   help="which ladder (conv1d-cpu is the CPU one and needs TVM; the others run on a GPU)")
    p.add_argument("--device", help="conv1d-cpu: tvm-llvm (default); GPU ladders: webgpu (default) or webgpu:N; "
                                    "conv1d-gpu, gemm-gpu and dwsep-conv2d-gpu also cuda or cuda:N (TVM-emitted CUDA "
                                    "kernels; without TVM read from the store named by TILEWISE_TVM_CUDA_SOURCES)")
    p.add_argument("--shape", help="problem shape: conv1d M,N (16384,64); gemm M,N,K (1024,1024,1024); "
                                   "dwsep-conv2d B,C,H,W,O,K,P (1,64,56,56,128,3,1)")
    p.add_argument("--small", action="store_true", help="use the ladder's CI-sized shape")
    p.add_argument("--tune", type=common.non_negative, default=24, metavar="N",
                   help="configs a search adds to the rungs for the 'tuned best' rung (0: none; default 24)")
    p.add_argument("--tune-s", type=common.float_in(0, low_open=True), default=60.0, metavar="S",
                   help="seconds for that search (default 60)")
    p.add_argument("--rounds", type=common.positive, default=None, metavar="N",
                   help="most interleaved timing rounds (default 100)")
    p.add_argument("--budget-s", type=common.float_in(0, low_open=True), default=None, metavar="S",
                   help="seconds after which no new timing round starts (default 8)")
    p.add_argument("--seed", type=common.seed, default=0, help="inputs, search order and bootstrap (default 0)")
    p.add_argument("--wide", action="store_true", help="put each rung's config in the table (wider than 80 columns)")
    common.add_json(p, "{primitive, device, shape, reference_ms, rungs, staging}")
    p.add_argument("--plot", metavar="FILE.png", help="PNG of the rungs' medians with 95%% intervals (extra plot; "
                                                      "checked before anything is measured)")
    p.set_defaults(func=_cmd_ladder)


def _cmd_ladder(args: argparse.Namespace) -> int:
    from tilewise.devices.cpu import quiet_torch_threads

    quiet_torch_threads()  # before anything imports torch: its references are timed next to numpy's BLAS
    from tilewise.errors import ConfigError, DeviceUnavailable
    from tilewise.kernels.base import parse_shape
    from tilewise.ladder import get_ladder, plot, resolve_ladder_device, run_ladder, validate_shape
    from tilewise.tune.plot import require_plot

    spec = get_ladder(args.primitive, args.device)  # --device cuda picks the TVM-emitted CUDA variant
    tpl = spec.template()
    if args.shape and args.small:
        raise ConfigError("--shape and --small both give a shape", "pass only one of them")
    shape = parse_shape(args.shape, tpl.shape_names) if args.shape else (spec.small_shape if args.small else spec.shape)
    shape = validate_shape(spec, shape)  # refuse bad shapes before a device starts
    if args.plot:
        require_plot(args.plot)  # a missing matplotlib or a bad path is said now, not after the measuring
    mkw: dict[str, Any] = {}
    if args.rounds is not None:
        mkw.update(max_rounds=args.rounds, min_rounds=min(args.rounds, 20))
    if args.budget_s is not None:
        mkw["budget_s"] = args.budget_s
    con = common.console(args)
    try:
        choice = resolve_ladder_device(spec, args.device)
    except DeviceUnavailable as exc:
        if spec.device == "tvm-llvm" and "TVM" in exc.problem:
            raise DeviceUnavailable(exc.problem, TVM_FIX) from exc
        raise
    say = lambda text: con.print(text, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    say(choice.line())

    from rich.console import Console

    err = Console(stderr=True)

    def progress(msg: str) -> None:
        err.print(f"  .. {msg}", markup=False, highlight=False, soft_wrap=True, style="dim")

    result = run_ladder(args.primitive, choice.device, shape, tune_count=args.tune, tune_seconds=args.tune_s,
                        measure_kw=mkw, seed=args.seed, progress=progress)
    say(result.table(wide=args.wide))
    common.emit_json(args.json, result.as_json(), say)
    if args.plot:
        plot(result, args.plot)
        say(f"wrote {args.plot}")
    return 0
