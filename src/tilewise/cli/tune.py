"""`tilewise tune FAMILY ...` (one kernel family at one shape) and `tilewise tune model ...` (the classifier's kernels).

    tilewise tune gemm --device webgpu --shape 256,256,256 [--space seed|full|large]
                  [--strategy exhaustive|random|climb] [--budget N] [--budget-s S] [--json FILE] [--plot FILE]
                  [--top N] [--wide] [--force] [--store PATH] [--show-source CONFIG] [--dry-run] [--target PROFILE]
                  [--no-peer]
    tilewise tune model [--preset default] [--seq 346] [--device auto] [--weights nf4] [--budget N]
                  [--budget-s S] [--climb N] [--json FILE] [--force]

Every argument is checked before a device is opened or a config measured: a run never stores a result that the
caller's arguments caused.
"""

from __future__ import annotations

import argparse
from typing import Any

from tilewise.cli import common
from tilewise.cli.ray_opts import add_ray
from tilewise.errors import ConfigError

MAX_ROUNDS = 10_000
MAX_MODEL_ROWS = 8192  # a decision is a few hundred rows; the tuned range ends at 512


def register(sub: Any) -> None:
    """Add `tune`, with one subcommand per kernel family and `model`."""
    from tilewise.kernels.registry import backends, kernels
    from tilewise.tune.report import SCREENFUL
    from tilewise.tune.search import STRATEGIES

    p = sub.add_parser("tune", help="measure every legal config of a kernel at one shape and rank them, or tune the "
                                    "classifier's kernels (tune model)",
                       description="Tune one kernel family at one shape, or (tune model) every kernel the "
                                   "classifier runs.\n\nkernel families: " + ", ".join(kernels()) + ".",
                       epilog="examples:\n  tilewise tune gemm --shape 256,256,256 --budget 20\n"
                              "  tilewise tune gemm --shape 256,256,256 --dry-run")
    fam = p.add_subparsers(dest="kernel", metavar="FAMILY")
    fam.required = True
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--device", default="auto", help="auto, webgpu, webgpu:N, dawn, dawn:N, cuda, cuda:N "
                        "(default auto: the fastest device the family has an implementation for)")
    shared.add_argument("--budget", type=common.positive, default=None, help="most configs to measure")
    shared.add_argument("--force", action="store_true", help="re-measure what the store already holds")
    shared.add_argument("--store", metavar="PATH", help="results store (default: the user cache dir)")
    common.add_json(shared, "the result (--dry-run: the legal and illegal configs)")
    shared.add_argument("--seed", type=common.seed, default=0, help="random seed (inputs, search order, bootstrap)")
    add_ray(shared)
    from tilewise.devices.profiles import PROFILES

    for name in kernels():
        k = fam.add_parser(name, parents=[shared], help=f"{name} ({', '.join(backends(name))})",
                           epilog=f"examples:\n  tilewise tune {name} --shape S --budget 20\n"
                                  f"  tilewise tune {name} --shape S --dry-run --json -")
        k.add_argument("--shape", help="problem shape, e.g. M,N,K = 256,256,256 (required)")
        k.add_argument("--space", default=None,
                       help="named space: seed (hand-picked points; the default where the family has it), full, ...")
        k.add_argument("--strategy", default="exhaustive", choices=sorted(STRATEGIES),
                       help="exhaustive (every legal config in order), random (a seeded sample) or climb "
                            "(from the family's seed points, or a few random configs where it has none, "
                            "hill-climbing: the neighbours of the fastest, measured together, until none is "
                            "faster; then a fresh random start)")
        k.add_argument("--budget-s", type=common.float_in(0.0, low_open=True), default=None,
                       help="most seconds to spend")
        k.add_argument("--plot", metavar="FILE", type=_plot_file, help="PNG of medians and intervals per config")
        k.add_argument("--top", type=common.positive, default=SCREENFUL, help="ranked configs the table shows")
        k.add_argument("--wide", action="store_true", help="add intervals, tile waste and errors (over 80 columns)")
        k.add_argument("--show-source", metavar="CONFIG", help="print the source of one legal config (NAME=V,... ; "
                       "names left out take the template's base config) and exit")
        k.add_argument("--dry-run", action="store_true", help="list legal/illegal configs with reasons; no device")
        k.add_argument("--target", metavar="PROFILE", choices=sorted(PROFILES),
                       help="limits profile for --dry-run and --show-source (default: the backend's)")
        k.add_argument("--rounds", type=common.int_at_least(1, MAX_ROUNDS), default=None,
                       help="timed rounds per batch (default 10..40 within 5 s)")
        k.add_argument("--no-peer", action="store_true", help="leave the template's peer (cuBLAS on CUDA) out of "
                       "the final race and the table's %%peer column")
        k.set_defaults(func=cmd_tune)
    m = fam.add_parser(
        "model", help="every matmul shape and the attention tile of the classifier, across row counts; writes its "
                      "dispatch table",
        description="Measure every matmul the classifier runs (each kernel's candidates at every row\n"
                    "count) and its attention tile on one device (WebGPU, Dawn or CUDA), and write the\n"
                    "dispatch table that `tilewise.load` and `tilewise play` use there. Every outcome\n"
                    "is stored, so a cut or interrupted run resumes where it stopped. On CUDA a finished\n"
                    "tune then races programmatic dependent launch, the fused prologues and split-K summed\n"
                    "in the matmul on whole decisions of the model and keeps what won in the table.",
        epilog="examples:\n  tilewise tune model\n  tilewise tune model --device cuda --preset lfm2-350m\n"
               "  tilewise tune model --preset seed-250m --budget 20 --budget-s 600 --json -")
    m.add_argument("--preset", default="default", help="`default` (the bundled model, what play runs), a preset "
                   "(lfm2-350m, seed-250m, tiny) or a model folder: only its shapes matter")
    m.add_argument("--device", default="auto",
                   help="auto, webgpu, webgpu:N, dawn, dawn:N, cuda or cuda:N (the table is this device's)")
    m.add_argument("--seq", type=common.int_at_least(2), default=346,
                   help="decision length in tokens: its rows (and 47 fewer) are measured besides --rows")
    m.add_argument("--weights", default="nf4", choices=("nf4", "f16", "f32"), help="weight format of the model")
    m.add_argument("--rows", type=_rows, default=None, metavar="M,M,...",
                   help="row counts to measure besides the decision's (default 1,2,4,...,512)")
    m.add_argument("--budget", type=common.positive, default=None, metavar="N",
                   help="most candidates per kernel (default: the default config, the hand-picked ones and 12 "
                        "random ones)")
    m.add_argument("--budget-s", type=common.float_in(0, low_open=True), default=None, metavar="S",
                   help="most seconds overall: no new candidate starts after S; the table keeps the shapes "
                        "finished and says which were cut (default: no limit)")
    m.add_argument("--climb", type=common.positive, default=None, metavar="N",
                   help="per matmul shape, N more configs of the kernel fastest at the decision's rows, "
                        "hill-climbing from its best and the configs that tie with it (neighbours: one "
                        "parameter a step away)")
    m.add_argument("--l2", choices=("auto", "cold", "warm"), default="auto",
                   help="CUDA: time each kernel with L2 evicted before every sample (cold) or kept (warm); auto "
                        "keeps it where the model's weights fit in half of L2, as its decisions find them")
    m.add_argument("--no-hand-picked", dest="hand_picked", action="store_false",
                   help="leave out the hand-picked seed configs (the default config and random ones compete)")
    m.add_argument("--force", action="store_true", help="re-measure shapes the table and the store already hold")
    m.add_argument("--store", metavar="PATH", help="results store (default: the user cache dir)")
    m.add_argument("--seed", type=common.seed, default=0, help="random seed (inputs, sampled configs)")
    common.add_json(m, "a summary (table path, partial or not, best times per shape)")
    add_ray(m)
    m.set_defaults(func=cmd_tune_model)


def _rows(text: str) -> list[int]:
    try:
        rows = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rows takes comma-separated row counts, got {text!r}") from None
    if not rows or min(rows) < 1 or max(rows) > MAX_MODEL_ROWS:
        raise argparse.ArgumentTypeError(f"--rows takes row counts from 1 to {MAX_MODEL_ROWS}, got {text!r}")
    return rows


def cmd_tune_model(args: argparse.Namespace) -> int:
    from tilewise.cli.common import emit_json
    from tilewise.cli.tune_model import run

    return int(run(args, emit_json) or 0)


def _plot_file(text: str) -> str:
    if not text.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"--plot {text!r} must name a .png file")
    return common.output_file(text, "--plot")


def _offline_backend(kernel: str, device: str) -> str:
    """The backend --dry-run and --show-source check: --device's, or for auto the family's WebGPU implementation
    where it has one (no device is opened for them)."""
    from tilewise.devices import parse_device_name
    from tilewise.kernels.registry import backends

    base, _ = parse_device_name(device)
    base = "webgpu" if base == "dawn" else base  # Dawn runs the WebGPU templates
    have = backends(kernel)
    if base != "auto":
        if base not in have:
            raise ConfigError(f"{kernel} has no {base} implementation", f"use --device {' or '.join(have)}")
        return base
    return "webgpu" if "webgpu" in have else have[0]


def _offline_target(tpl: Any, device: str) -> str:
    """The limits profile a dry run uses without --target: Dawn's (the measured H200 one) for --device dawn or a
    kernel that needs Dawn, otherwise the backend's default."""
    from tilewise.devices import parse_device_name
    from tilewise.devices.profiles import DEFAULT_FOR_BACKEND

    if parse_device_name(device)[0] == "dawn" or tpl.prefer_runtime == "dawn":
        return "h200-dawn"
    return DEFAULT_FOR_BACKEND.get(tpl.backend, "webgpu-default")


def cmd_tune(args: argparse.Namespace) -> int:
    from tilewise.kernels.base import parse_shape
    from tilewise.kernels.registry import backends, get_template

    console = common.console(args, soft_wrap=True)
    if args.plot and not (args.show_source or args.dry_run):
        from tilewise.tune.plot import require_plot

        require_plot(args.plot)  # before any measuring: a missing matplotlib must not cost the run
    offline = bool(args.show_source or args.dry_run)
    tpl = get_template(args.kernel, _offline_backend(args.kernel, args.device) if offline else backends(args.kernel)[0])
    if args.show_source:
        return _show_source(tpl, args)
    args.space = args.space or tpl.default_space()
    space = tpl.named_space(args.space)
    if not args.shape:
        example = ",".join(map(str, tpl.problem.example_shape or (256,) * len(tpl.shape_names)))
        raise ConfigError("--shape is required", f"write e.g. --shape {example} ({','.join(tpl.shape_names)})")
    shape = parse_shape(args.shape, tpl.shape_names)
    tpl.problem.check_shape(shape)
    if args.dry_run:
        from tilewise.tune.report import dry_run, dry_run_lines

        found = dry_run(tpl, space, shape, args.target or _offline_target(tpl, args.device), args.seed)
        common.emit_json(args.json, found, console.print)
        if args.json != common.STDOUT:
            for line in dry_run_lines(found):
                console.print(line, markup=False, highlight=False)
        return 0
    from tilewise.devices import resolve
    from tilewise.tune.search import Budget

    budget = Budget(args.budget, args.budget_s)
    if args.ray or args.workers:
        from tilewise.tune.cluster import check_ray

        check_ray(args)
    if args.ray:
        return _run_tune_ray(args, shape, budget, console, tpl.prefer_runtime)
    choice = resolve(args.device, backends(args.kernel), job=f"tuning {args.kernel}", prefer=tpl.prefer_runtime)
    console.print(choice.line(), markup=False, highlight=False)
    tpl = get_template(args.kernel, choice.device.info.backend)
    space = tpl.named_space(args.space)
    return _run_tune(tpl, choice.device, space, shape, budget, args, console)


def _show_source(tpl: Any, args: argparse.Namespace) -> int:
    """Print the source of one legal config; an illegal one is refused with its broken rules, never generated."""
    from tilewise.devices.profiles import get_profile
    from tilewise.kernels.base import parse_shape

    cfg = tpl.parse_config(args.show_source)
    target = args.target or _offline_target(tpl, args.device)
    shape = parse_shape(args.shape, tpl.shape_names) if args.shape else None
    why = tpl.space("full").why_illegal(cfg, get_profile(target)) + (tpl.shape_problems(cfg, shape) if shape else [])
    if why:
        raise ConfigError(f"config {cfg.key()} is illegal under {target}: {'; '.join(why)}",
                          f"pick a legal config: `tilewise tune {tpl.name} --dry-run --shape ...` lists them")
    print(tpl.source(cfg, shape) if shape else tpl.source(cfg), end="")
    return 0


def _run_tune_ray(args: argparse.Namespace, shape: tuple[int, ...], budget: Any, console: Any,
                  prefer: str | None) -> int:
    """One tuning run per device fingerprint of the cluster, each on its own workers and into its own table."""
    from tilewise.kernels.registry import backends, get_template
    from tilewise.tune.cluster import group_line, start_cluster
    from tilewise.tune.store import Store

    store = Store(args.store)
    cluster = start_cluster(args, backends(args.kernel), f"tuning {args.kernel}", prefer)
    try:
        for fp, workers in cluster.groups().items():
            console.print(group_line(fp, workers), markup=False, highlight=False)
            tpl = get_template(args.kernel, workers[0].info.backend)
            space = tpl.named_space(args.space)
            mkw = {"min_rounds": args.rounds, "max_rounds": args.rounds} if args.rounds else None
            eng = cluster.engine(fp, store, force=args.force, seed=args.seed, measure_kw=mkw)
            _run_tune(tpl, eng.device, space, shape, budget, args, console, engine=eng)
    finally:
        cluster.close()
    return 0


def _run_tune(tpl: Any, device: Any, space: Any, shape: tuple[int, ...], budget: Any, args: argparse.Namespace,
              console: Any, engine: Any = None) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tilewise.tune.report import failure_lines, table_notes, tune_summary, tune_table
    from tilewise.tune.store import Store
    from tilewise.tune.tuner import tune

    store = engine.store if engine is not None else Store(args.store)
    # a large grid's legal count is not worth enumerating just for a progress bar: leave the total open
    total = budget.count or (space.size if space.points is not None else None)
    mkw = {"min_rounds": args.rounds, "max_rounds": args.rounds} if args.rounds else None
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("tuning", total=total)

        def progress(stage: str, done: int, _total: int | None) -> None:
            bar.update(task, completed=min(done, total) if total else done, description=stage[:40])

        if engine is not None:
            engine.progress = progress

        result = tune(tpl, device, shape, space=args.space, strategy=args.strategy, budget=budget, store=store,
                      force=args.force, seed=args.seed, measure_kw=mkw, progress=progress, peer=not args.no_peer,
                      engine=engine)
    console.print(tune_table(result, args.top, args.wide))
    for line in table_notes(result, args.top) + failure_lines(result) + tune_summary(result):
        console.print(line, markup=False, highlight=False)
    console.print(f"store: {store.path}", style="dim", markup=False)
    common.emit_json(args.json, result.as_json(), lambda line: console.print(line, markup=False))
    if args.plot:
        from tilewise.tune.plot import plot_tune

        plot_tune(result, args.plot)
        console.print(f"wrote {args.plot}", markup=False)
    return 0
