"""`tilewise tune | sweep | store | report`: the tuner's command line.

    tilewise tune gemm --device webgpu --shape 256,256,256 [--space seed|full|large]
                  [--strategy exhaustive|random] [--budget N] [--budget-s S] [--json FILE] [--plot FILE]
                  [--force] [--store PATH] [--show-source CONFIG] [--dry-run] [--target PROFILE] [--no-peer]
    tilewise tune model ...            (delegates to tilewise.model_tune when it is installed)
    tilewise sweep gemm --device webgpu --m 1..512:8 --n 2560 --k 1024 [--plot FILE.png] [--json FILE]
                  [--out dispatch.json] [--tolerance 0.03]
    tilewise store export FILE.json | tilewise store import FILE.json [--replace]
    tilewise report [--kernel K] [--shape S] [--device-fingerprint F]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tilewise.errors import ConfigError


def register(sub: Any) -> None:
    """Add the tune, sweep, store and report subcommands."""
    p = sub.add_parser("tune", help="measure every legal config of a kernel at one shape and rank them")
    p.add_argument("kernel", help="kernel family (gemm) or `model` (tunes the model's kernels)")
    p.add_argument("--device", default="webgpu", help="webgpu, webgpu:N, cuda, cuda:N (default webgpu)")
    p.add_argument("--shape", help="problem shape, e.g. M,N,K = 256,256,256")
    p.add_argument("--space", default=None,
                   help="named space: seed (16 hand-picked points; the default where the kernel has it), full, ...")
    p.add_argument("--strategy", default="exhaustive", help="exhaustive | random")
    p.add_argument("--budget", type=int, default=None, help="most configs to measure")
    p.add_argument("--budget-s", type=float, default=None, help="most seconds to spend")
    p.add_argument("--json", metavar="FILE", help="write {kernel, device, shape, results[, peer]} here")
    p.add_argument("--plot", metavar="FILE", help="PNG of medians and intervals per config")
    p.add_argument("--force", action="store_true", help="re-measure configs the store already holds")
    p.add_argument("--store", metavar="PATH", help="results store (default: the user cache dir)")
    p.add_argument("--show-source", metavar="CONFIG", help="print the source of one config (NAME=V,... ; "
                   "names left out take the template's base config) and exit")
    p.add_argument("--dry-run", action="store_true", help="list legal/illegal configs with reasons; no device")
    p.add_argument("--target", metavar="PROFILE", help="limits profile for --dry-run (webgpu-default, sm_90, ...)")
    p.add_argument("--seed", type=int, default=0, help="random seed (inputs, search order, bootstrap)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds per batch (default 10..40 within 5 s)")
    p.add_argument("--no-peer", action="store_true", help="leave the template's peer (cuBLAS on CUDA) out of the "
                   "final race and the table's %% of peer column")
    # for `tilewise tune model` (tilewise.model_tune)
    p.add_argument("--preset", help="model preset (tune model)")
    p.add_argument("--seq", type=int, help="sequence length (tune model)")
    p.add_argument("--weights", help="weight format (tune model)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("sweep", help="time configs across many M, report tile waste, fit a dispatch table")
    p.add_argument("kernel")
    p.add_argument("--device", default="webgpu")
    p.add_argument("--m", required=True, help="M values: 1..512, 1..512:8, 1,64,96,346")
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--space", default=None,
                   help="candidate configs: the legal configs of this space (default: seed where the kernel has it)")
    p.add_argument("--configs", help="candidate configs instead: NAME=V,...;NAME=V,... (or a tune --json file)")
    p.add_argument("--tolerance", type=float, default=0.03, help="accepted slowdown vs the per-M best (0.03 = 3%%)")
    p.add_argument("--plot", metavar="FILE.png")
    p.add_argument("--json", metavar="FILE", help="every measurement plus the dispatch table")
    p.add_argument("--out", metavar="dispatch.json", help="the dispatch table the runtime loads")
    p.add_argument("--store", metavar="PATH")
    p.add_argument("--force", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("store", help="export or import tuning results (share them between machines)")
    p.add_argument("action", choices=["export", "import", "path"])
    p.add_argument("file", nargs="?", help="FILE.json")
    p.add_argument("--store", metavar="PATH")
    p.add_argument("--replace", action="store_true", help="on import, overwrite rows this store already has")
    p.set_defaults(func=cmd_store)

    p = sub.add_parser("report", help="list what the results store holds")
    p.add_argument("--store", metavar="PATH")
    p.add_argument("--kernel")
    p.add_argument("--shape")
    p.add_argument("--device-fingerprint")
    p.add_argument("--top", type=int, default=5, help="best configs shown per (device, kernel, shape)")
    p.set_defaults(func=cmd_report)


# ---- helpers ------------------------------------------------------------------------------------------------
def _backend(device: str) -> str:
    from tilewise.devices import parse_device_name

    base, _ = parse_device_name(device)
    if base == "auto":
        raise ConfigError("--device auto is ambiguous for tuning", "name the backend: --device webgpu or cuda")
    return base


def _template(kernel: str, device: str) -> Any:
    from tilewise.kernels.registry import get_template

    return get_template(kernel, _backend(device))


def _open_store(path: str | None) -> Any:
    from tilewise.tune.store import Store

    return Store(path)


def _space(tpl: Any, name: str) -> Any:
    if name not in tpl.space_names():
        raise ConfigError(f"unknown space {name!r} for {tpl.name}", f"use --space with one of: "
                          f"{', '.join(tpl.space_names())}")
    return tpl.space(name)


def _parse_config(tpl: Any, text: str) -> Any:
    space = tpl.space("full")
    base = getattr(tpl, "default_config", None)
    given = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ConfigError(f"cannot parse {part!r} in config {text!r}", "write NAME=VALUE pairs, comma separated")
        k, v = part.split("=", 1)
        given[k.strip()] = v.strip()
    if base is not None:
        full = {k: str(v) for k, v in base().items()}
        unknown = set(given) - set(full)
        if unknown:
            raise ConfigError(f"unknown parameters {sorted(unknown)} for {tpl.name}",
                              f"parameters: {', '.join(full)}")
        full.update(given)
        given = full
    return space.parse(",".join(f"{k}={v}" for k, v in given.items()))


def _default_space(tpl: Any) -> str:
    return "seed" if "seed" in tpl.space_names() else "full"


def _console() -> Any:
    from rich.console import Console

    return Console(soft_wrap=True)


# ---- tune -----------------------------------------------------------------------------------------------------
def cmd_tune(args: argparse.Namespace) -> int:
    if args.kernel == "model":
        from tilewise.model.tune import run

        return int(run(args) or 0)
    from tilewise.kernels.base import parse_shape

    tpl = _template(args.kernel, args.device)
    console = _console()
    if args.show_source:
        cfg = _parse_config(tpl, args.show_source)
        sp = tpl.space("full")
        why = sp.why_illegal(cfg)
        if why:
            console.print(f"[yellow]note[/yellow]: this config is illegal: {'; '.join(why)}", markup=True)
        print(tpl.source(cfg), end="")
        return 0
    if args.budget is not None and args.budget < 1:
        raise ConfigError(f"--budget {args.budget} measures nothing", "give --budget N with N >= 1")
    args.space = args.space or _default_space(tpl)
    space = _space(tpl, args.space)
    if not args.shape:
        raise ConfigError("--shape is required", f"write e.g. --shape {','.join(['256'] * len(tpl.shape_names))} "
                          f"({','.join(tpl.shape_names)})")
    shape = parse_shape(args.shape, tpl.shape_names)
    from tilewise.tune.search import Budget, get_strategy

    get_strategy(args.strategy)
    budget = Budget(args.budget, args.budget_s)
    if args.dry_run:
        return _dry_run(tpl, space, shape, args, console)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    import tilewise
    from tilewise.tune.report import failure_lines, plot_tune, tune_summary, tune_table
    from tilewise.tune.tuner import tune

    device = tilewise.get_device(args.device)
    store = _open_store(args.store)
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


def _dry_run(tpl: Any, space: Any, shape: tuple[int, ...], args: argparse.Namespace, console: Any) -> int:
    from tilewise.devices.profiles import DEFAULT_FOR_BACKEND, get_profile
    from tilewise.tune.tuner import illegal_examples, no_legal_config_error, split_configs

    target = args.target or DEFAULT_FOR_BACKEND.get(tpl.backend, "webgpu-default")
    limits = get_profile(target)
    console.print(f"{tpl.name} on {tpl.backend}, space {space.name}, shape {','.join(map(str, shape))}, "
                  f"limits {target} (no device used)", markup=False, highlight=False)
    if space.points is not None:
        legal, illegal = split_configs(tpl, space, limits, shape, list(space))
        for c in legal:
            console.print(f"  legal    {c}", markup=False, highlight=False)
        for c, why in illegal:
            console.print(f"  skipped  {c}  (illegal: {'; '.join(why)})", markup=False, highlight=False)
        console.print(f"{len(legal)} legal, {len(illegal)} illegal of {space.size}", markup=False)
        if not legal:
            raise no_legal_config_error(tpl, space, shape, illegal, f"under {target}")
        return 0
    all_legal = space.legal(limits)
    legal, bad_shape = split_configs(tpl, space, limits, shape, all_legal)
    console.print(f"{len(legal)} legal of {space.size} in the grid ({space.size - len(all_legal)} break a rule, "
                  f"{len(bad_shape)} more refuse this shape)", markup=False, highlight=False)
    counts: dict[str, int] = {}
    examples = illegal_examples(space, limits, args.seed, n=400)
    for c in examples:
        first = space.why_illegal(c, limits)[0].split(":", 1)[0]
        counts[first] = counts.get(first, 0) + 1
    console.print("first broken rule among random illegal configs: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])), markup=False)
    for c in examples[:10]:
        console.print(f"  skipped  {c}  (illegal: {'; '.join(space.why_illegal(c, limits))})", markup=False,
                      highlight=False)
    for c in legal[:10]:
        console.print(f"  legal    {c}", markup=False, highlight=False)
    if not legal:
        raise no_legal_config_error(tpl, space, shape, bad_shape, f"under {target}")
    return 0


# ---- sweep ----------------------------------------------------------------------------------------------------
def _sweep_configs(tpl: Any, args: argparse.Namespace, limits: Any) -> list[Any]:
    if args.configs:
        p = Path(args.configs)
        if p.suffix == ".json" and p.exists():
            data = json.loads(p.read_text())
            keys = [r["config"] for r in data.get("results", []) if r.get("status") == "ok"][:8]
        else:
            keys = [k for k in args.configs.split(";") if k.strip()]
        configs = [_parse_config(tpl, k) for k in keys]
        space = tpl.space("full")
        bad = [(c, space.why_illegal(c, limits)) for c in configs if space.why_illegal(c, limits)]
        if bad:
            raise ConfigError(f"{bad[0][0]} is illegal here: {'; '.join(bad[0][1])}", "drop it from --configs")
        return configs
    args.space = args.space or _default_space(tpl)
    space = _space(tpl, args.space)
    configs = space.legal(limits)
    if space.points is None and len(configs) > 32:
        raise ConfigError(f"space {args.space} has {len(configs)} legal configs; too many to sweep",
                          "sweep --space seed, or pass the best few with --configs (e.g. a tune --json file)")
    return configs


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    import tilewise
    from tilewise.tune.dispatch import dispatch_table
    from tilewise.tune.report import plot_sweep, sweep_table
    from tilewise.tune.sweep import parse_m_values, sweep, sweep_json

    tpl = _template(args.kernel, args.device)
    if tuple(tpl.shape_names) != ("M", "N", "K"):
        raise ConfigError(f"sweep needs an M,N,K kernel; {tpl.name} has {tpl.shape_names}", "sweep gemm")
    ms = parse_m_values(args.m)
    if args.n < 1 or args.k < 1:
        raise ConfigError(f"--n {args.n} --k {args.k}: sizes must be positive", "write e.g. --n 2560 --k 1024")
    device = tilewise.get_device(args.device)
    configs = _sweep_configs(tpl, args, device.info.limits)
    if not configs:
        raise ConfigError(f"no config of space {args.space} is legal on {device.info.name}",
                          "see `tilewise tune gemm --dry-run` for the reasons")
    store = _open_store(args.store)
    console = _console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("sweep", total=len(ms))
        result = sweep(tpl, device, ms, args.n, args.k, configs, store=store, force=args.force, seed=args.seed,
                       progress=lambda i, n, m: bar.update(task, completed=i, description=f"M={m}"))
    table = dispatch_table(result, args.tolerance)
    ranges = next(iter(table["entries"].values()))["ranges"]
    tbl, legend = sweep_table(result, ranges)
    console.print(tbl)
    for line in legend:
        console.print(line, markup=False, highlight=False)
    console.print(f"dispatch (within {100 * args.tolerance:g}% of the per-M best at every measured M):", markup=False)
    for r in ranges:
        console.print(f"  M {r['m_min']}..{r['m_max']}: {r['label']}", markup=False, highlight=False)
    fails = sum(len(v) for v in result.failures.values())
    if fails:
        console.print(f"{fails} (config, M) pairs did not run correctly; see --json", markup=False)
    if args.out:
        Path(args.out).write_text(json.dumps(table, indent=1))
        console.print(f"wrote {args.out}", markup=False)
    if args.json:
        Path(args.json).write_text(json.dumps(sweep_json(result, table), indent=1))
        console.print(f"wrote {args.json}", markup=False)
    if args.plot:
        plot_sweep(result, args.plot, ranges)
        console.print(f"wrote {args.plot}", markup=False)
    return 0


# ---- store / report -------------------------------------------------------------------------------------------
def cmd_store(args: argparse.Namespace) -> int:
    store = _open_store(args.store)
    if args.action == "path":
        print(store.path)
        return 0
    if not args.file:
        raise ConfigError(f"`tilewise store {args.action}` needs a FILE.json", f"tilewise store {args.action} r.json")
    if args.action == "export":
        n = store.export_json(args.file)
        print(f"exported {n} results from {store.path} to {args.file}")
    else:
        added, skipped = store.import_json(args.file, replace=args.replace)
        print(f"imported {added} results into {store.path}"
              + (f"; kept {skipped} already stored (use --replace to overwrite)" if skipped else ""))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from rich.table import Table

    store = _open_store(args.store)
    console = _console()
    summary = [s for s in store.summary() if (not args.kernel or s["kernel"] == args.kernel)
               and (not args.shape or s["shape"] == args.shape.replace(",", "x"))
               and (not args.device_fingerprint or s["fingerprint"] == args.device_fingerprint)]
    if not summary:
        console.print(f"the store {store.path} holds no matching results", markup=False)
        return 0
    groups: dict[tuple[str, str, str], dict[str, int]] = {}
    for s in summary:
        groups.setdefault((s["fingerprint"], s["kernel"], s["shape"]), {})[s["status"]] = s["count"]
    t = Table(title=f"results in {store.path}")
    for col in ("device", "kernel", "shape", "statuses", "best configs (median ms)"):
        t.add_column(col, overflow="fold")
    for (fp, kernel, shape), counts in groups.items():
        ok = sorted((r for r in store.query(fp, kernel, shape, "ok") if r.median_ms is not None),
                    key=lambda r: r.median_ms or 0.0)[: args.top]
        best = "\n".join(f"{r.median_ms:.4f}  {r.config}" for r in ok)
        t.add_row(fp, kernel, shape, ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), best)
    console.print(t)
    return 0
