"""`tilewise tune FAMILY ...` (one kernel family at one shape) and `tilewise tune model ...` (the classifier's kernels).

    tilewise tune gemm --device webgpu --shape 256,256,256 [--space seed|full|large]
                  [--strategy exhaustive|random] [--budget N] [--budget-s S] [--json FILE] [--plot FILE]
                  [--force] [--store PATH] [--show-source CONFIG] [--dry-run] [--target PROFILE] [--no-peer]
    tilewise tune model [--preset default] [--seq 346] [--device auto] [--weights nf4] [--budget N]
                  [--budget-s S] [--json FILE] [--force]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tilewise.errors import ConfigError


def register(sub: Any) -> None:
    """Add `tune`, with one subcommand per kernel family and `model`."""
    from tilewise.kernels.registry import backends, kernels

    p = sub.add_parser("tune", help="measure every legal config of a kernel at one shape and rank them, or tune the "
                                    "classifier's kernels (tune model)",
                       description="Tune one kernel family at one shape, or (tune model) every kernel the "
                                   "classifier runs. Families: " + ", ".join(kernels()) + ".")
    fam = p.add_subparsers(dest="kernel", metavar="FAMILY")
    fam.required = True
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--device", default="auto", help="auto, webgpu, webgpu:N, cuda, cuda:N (default auto: the "
                                                         "fastest device the family has an implementation for)")
    common.add_argument("--budget", type=int, default=None, help="most configs to measure")
    common.add_argument("--force", action="store_true", help="re-measure what the store already holds")
    common.add_argument("--store", metavar="PATH", help="results store (default: the user cache dir)")
    common.add_argument("--json", metavar="FILE", help="also write the result as JSON here")
    common.add_argument("--seed", type=int, default=0, help="random seed (inputs, search order, bootstrap)")
    for name in kernels():
        k = fam.add_parser(name, parents=[common], help=f"{name} ({', '.join(backends(name))})")
        k.add_argument("--shape", help="problem shape, e.g. M,N,K = 256,256,256")
        k.add_argument("--space", default=None,
                       help="named space: seed (hand-picked points; the default where the family has it), full, ...")
        k.add_argument("--strategy", default="exhaustive", help="exhaustive | random")
        k.add_argument("--budget-s", type=float, default=None, help="most seconds to spend")
        k.add_argument("--plot", metavar="FILE", help="PNG of medians and intervals per config")
        k.add_argument("--show-source", metavar="CONFIG", help="print the source of one config (NAME=V,... ; "
                       "names left out take the template's base config) and exit")
        k.add_argument("--dry-run", action="store_true", help="list legal/illegal configs with reasons; no device")
        k.add_argument("--target", metavar="PROFILE", help="limits profile for --dry-run (webgpu-default, sm_90, ...)")
        k.add_argument("--rounds", type=int, default=None, help="timed rounds per batch (default 10..40 within 5 s)")
        k.add_argument("--no-peer", action="store_true", help="leave the template's peer (cuBLAS on CUDA) out of "
                       "the final race and the table's %% of peer column")
        k.set_defaults(func=cmd_tune)
    from tilewise.cli import common as cli_common

    m = fam.add_parser(
        "model", help="every matmul shape and the attention tile of the classifier, across row counts; writes its "
                      "dispatch table",
        description="Measure every matmul the classifier runs (each kernel's candidates at every row\n"
                    "count) and its attention tile on one WebGPU device, and write the dispatch table\n"
                    "that `tilewise.load` and `tilewise play` use there. Every outcome is stored, so\n"
                    "a cut or interrupted run resumes where it stopped.",
        epilog="examples:\n  tilewise tune model\n"
               "  tilewise tune model --preset seed-250m --budget 20 --budget-s 600 --json -")
    m.add_argument("--preset", default="default", help="`default` (the bundled model, what play runs), a preset "
                   "(lfm2-350m, seed-250m, tiny) or a model folder: only its shapes matter")
    m.add_argument("--device", default="auto", help="auto, webgpu or webgpu:N (the table is this adapter's)")
    m.add_argument("--seq", type=cli_common.int_at_least(2), default=346,
                   help="decision length in tokens: its rows (and 47 fewer) are measured besides --rows")
    m.add_argument("--weights", default="nf4", choices=("nf4", "f16", "f32"), help="weight format of the model")
    m.add_argument("--rows", type=_rows, default=None, metavar="M,M,...",
                   help="row counts to measure besides the decision's (default 1,2,4,...,512)")
    m.add_argument("--budget", type=cli_common.positive, default=None, metavar="N",
                   help="most candidates per kernel (default: the default config, the hand-picked ones and 12 "
                        "random ones)")
    m.add_argument("--budget-s", type=cli_common.float_in(0, low_open=True), default=None, metavar="S",
                   help="most seconds overall: no new candidate starts after S; the table keeps the shapes "
                        "finished and says which were cut (default: no limit)")
    m.add_argument("--no-hand-picked", dest="hand_picked", action="store_false",
                   help="leave out the hand-picked seed configs (the default config and random ones compete)")
    m.add_argument("--force", action="store_true", help="re-measure shapes the table and the store already hold")
    m.add_argument("--store", metavar="PATH", help="results store (default: the user cache dir)")
    m.add_argument("--seed", type=cli_common.seed, default=0, help="random seed (inputs, sampled configs)")
    cli_common.add_json(m, "a summary (table path, partial or not, best times per shape)")
    m.set_defaults(func=cmd_tune_model)


def _rows(text: str) -> list[int]:
    try:
        rows = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rows takes comma-separated row counts, got {text!r}") from None
    if not rows or min(rows) < 1:
        raise argparse.ArgumentTypeError(f"--rows takes positive row counts, got {text!r}")
    return rows


def cmd_tune_model(args: argparse.Namespace) -> int:
    from tilewise.cli.common import emit_json
    from tilewise.model.tune import run

    return int(run(args, emit_json) or 0)


def _dry_run_backend(kernel: str, device: str) -> str:
    """The backend a dry run checks: --device's, or for auto the family's WebGPU implementation where it has one."""
    from tilewise.devices import parse_device_name
    from tilewise.kernels.registry import backends

    base, _ = parse_device_name(device)
    if base != "auto":
        return base
    have = backends(kernel)
    return "webgpu" if "webgpu" in have else have[0]


def cmd_tune(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tilewise.kernels.base import parse_shape
    from tilewise.kernels.registry import backends, get_template

    console = Console(soft_wrap=True)
    if args.show_source or args.dry_run:
        tpl = get_template(args.kernel, _dry_run_backend(args.kernel, args.device))
    else:
        from tilewise.devices import resolve

        choice = resolve(args.device, backends(args.kernel), job=f"tuning {args.kernel}")
        console.print(choice.line(), markup=False, highlight=False)
        tpl = get_template(args.kernel, choice.device.info.backend)
    if args.show_source:
        cfg = tpl.parse_config(args.show_source)
        why = tpl.space("full").why_illegal(cfg)
        if why:
            console.print(f"[yellow]note[/yellow]: this config is illegal: {'; '.join(why)}", markup=True)
        print(tpl.source(cfg), end="")
        return 0
    if args.budget is not None and args.budget < 1:
        raise ConfigError(f"--budget {args.budget} measures nothing", "give --budget N with N >= 1")
    args.space = args.space or tpl.default_space()
    space = tpl.named_space(args.space)
    if not args.shape:
        raise ConfigError("--shape is required", f"write e.g. --shape {','.join(['256'] * len(tpl.shape_names))} "
                          f"({','.join(tpl.shape_names)})")
    shape = parse_shape(args.shape, tpl.shape_names)
    from tilewise.tune.search import Budget, get_strategy

    get_strategy(args.strategy)
    budget = Budget(args.budget, args.budget_s)
    if args.dry_run:
        from tilewise.devices.profiles import DEFAULT_FOR_BACKEND
        from tilewise.tune.report import dry_run_lines

        target = args.target or DEFAULT_FOR_BACKEND.get(tpl.backend, "webgpu-default")
        for line in dry_run_lines(tpl, space, shape, target, args.seed):
            console.print(line, markup=False, highlight=False)
        return 0
    return _run_tune(tpl, choice.device, space, shape, budget, args, console)


def _run_tune(tpl: Any, device: Any, space: Any, shape: tuple[int, ...], budget: Any, args: argparse.Namespace,
              console: Any) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tilewise.tune.report import failure_lines, plot_tune, tune_summary, tune_table
    from tilewise.tune.store import Store
    from tilewise.tune.tuner import tune

    store = Store(args.store)
    # a large grid's legal count is not worth enumerating just for a progress bar: leave the total open
    total = budget.count or (space.size if space.points is not None else None)
    mkw = {"min_rounds": args.rounds, "max_rounds": args.rounds} if args.rounds else None
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("tuning", total=total)

        def progress(stage: str, done: int, _total: int | None) -> None:
            bar.update(task, completed=min(done, total) if total else done, description=stage[:70])

        result = tune(tpl, device, shape, space=args.space, strategy=args.strategy, budget=budget, store=store,
                      force=args.force, seed=args.seed, measure_kw=mkw, progress=progress, peer=not args.no_peer)
    console.print(tune_table(result))
    for line in failure_lines(result) + tune_summary(result):
        console.print(line, markup=False, highlight=False)
    console.print(f"store: {store.path}", style="dim", markup=False)
    if args.json:
        Path(args.json).write_text(json.dumps(result.as_json(), indent=1))
        console.print(f"wrote {args.json}", markup=False)
    if args.plot:
        plot_tune(result, args.plot)
        console.print(f"wrote {args.plot}", markup=False)
    return 0
