"""`tilewise sweep FAMILY --m 1..512:8 --n N --k K`: configs timed across row counts, tile waste beside the times,
and the fitted dispatch table (`--out`, the format the runtime loads)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tilewise.cli import common
from tilewise.cli.ray_opts import add_ray
from tilewise.errors import ConfigError


def register(sub: Any) -> None:
    from tilewise.cli.tune import _plot_file
    from tilewise.kernels.base import MAX_DIM
    from tilewise.kernels.registry import kernels

    p = sub.add_parser("sweep", help="time configs across many M, report tile waste, fit a dispatch table",
                       epilog="examples:\n  tilewise sweep gemm --m 1..512:32 --n 256 --k 256\n"
                              "  tilewise sweep gemm --m 1,64,96,346 --n 1024 --k 1024 --out dispatch.json --json -")
    p.add_argument("kernel", choices=kernels(), metavar="FAMILY",
                   help="kernel family with an M,N,K shape (gemm, nf4-matmul, ...)")
    p.add_argument("--device", default="auto", help="auto, webgpu, webgpu:N, dawn, dawn:N, cuda, cuda:N (default auto)")
    p.add_argument("--m", required=True, help="M values: 1..512, 1..512:8, 1,64,96,346 (required)")
    p.add_argument("--n", type=common.int_at_least(1, MAX_DIM), required=True, help="N, the fixed output width")
    p.add_argument("--k", type=common.int_at_least(1, MAX_DIM), required=True, help="K, the fixed reduction length")
    p.add_argument("--space", default=None,
                   help="candidate configs: the legal configs of this space (default: seed where the kernel has it)")
    p.add_argument("--configs", help="candidate configs instead: NAME=V,...;NAME=V,... (or a tune --json file)")
    p.add_argument("--tolerance", type=common.float_in(0.0, 1.0), default=0.03,
                   help="accepted slowdown vs the per-M best (0.03 = 3%%)")
    p.add_argument("--plot", metavar="FILE.png", type=_plot_file, help="PNG of time per M for every config")
    p.add_argument("--wide", action="store_true", help="add every config's time per M (over 80 columns)")
    common.add_json(p, "every measurement plus the dispatch table")
    p.add_argument("--out", metavar="dispatch.json", type=lambda t: common.output_file(t, "--out"),
                   help="write the dispatch table the runtime loads")
    p.add_argument("--store", metavar="PATH", help="results store (default: the user cache dir)")
    p.add_argument("--force", action="store_true", help="re-measure what the store already holds")
    p.add_argument("--seed", type=common.seed, default=0, help="random seed (inputs, order, bootstrap)")
    add_ray(p)
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from tilewise.devices import resolve
    from tilewise.kernels.registry import backends, get_template
    from tilewise.tune.sweep import parse_m_values

    if args.out is not None and args.out == args.json:
        raise ConfigError(f"--out and --json both name {args.out}", "give the dispatch table and the JSON report "
                          "different files")
    if args.plot:
        from tilewise.tune.plot import require_plot

        require_plot(args.plot)  # before any measuring
    ms = parse_m_values(args.m)
    have = backends(args.kernel)
    first = get_template(args.kernel, have[0])
    if tuple(first.shape_names) != ("M", "N", "K"):
        raise ConfigError(f"sweep needs an M,N,K kernel; {args.kernel} has {','.join(first.shape_names)}",
                          "sweep gemm, or tune this family at one shape with `tilewise tune`")
    first.problem.check_shape((ms[-1], args.n, args.k))
    if args.ray or args.workers:
        from tilewise.tune.cluster import check_ray

        check_ray(args)
    if args.ray:
        return _sweep_ray(args, ms, have, first.prefer_runtime)
    choice = resolve(args.device, have, job=f"sweeping {args.kernel}", prefer=first.prefer_runtime)
    tpl = get_template(args.kernel, choice.device.info.backend)
    return _sweep_on(args, ms, tpl, choice.device, choice.line())


def _sweep_ray(args: argparse.Namespace, ms: list[int], have: list[str], prefer: str | None) -> int:
    """One sweep per device fingerprint of the cluster (each its own table: `--out` takes one fingerprint)."""
    from tilewise.kernels.registry import get_template
    from tilewise.tune.cluster import group_line, start_cluster
    from tilewise.tune.store import Store
    from tilewise.tune.sweep import SWEEP_MEASURE

    cluster = start_cluster(args, have, f"sweeping {args.kernel}", prefer)
    try:
        groups = cluster.groups()
        if len(groups) > 1 and (args.out or args.json):
            raise ConfigError(f"the cluster has {len(groups)} kinds of device; --out and --json take one",
                              "run once per kind (--device picks it), or sweep without --out and use "
                              "`tilewise report --portable --out FILE` for one table good on all")
        for fp, workers in groups.items():
            tpl = get_template(args.kernel, workers[0].info.backend)
            eng = cluster.engine(fp, Store(args.store), force=args.force, seed=args.seed, measure_kw=SWEEP_MEASURE)
            _sweep_on(args, ms, tpl, eng.device, group_line(fp, workers), eng)
    finally:
        cluster.close()
    return 0


def _sweep_on(args: argparse.Namespace, ms: list[int], tpl: Any, device: Any, line: str, engine: Any = None) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tilewise.tune.dispatch import dispatch_table
    from tilewise.tune.plot import plot_sweep
    from tilewise.tune.report import sweep_table
    from tilewise.tune.store import Store
    from tilewise.tune.sweep import sweep, sweep_candidates, sweep_json

    configs = sweep_candidates(tpl, device.info.limits, args.configs, args.space)
    if not configs:
        raise ConfigError(f"no config of space {args.space or tpl.default_space()} is legal on {device.info.name}",
                          f"see `tilewise tune {args.kernel} --dry-run` for the reasons")
    store = engine.store if engine is not None else Store(args.store)
    console = common.console(args, soft_wrap=True)
    console.print(line, markup=False, highlight=False)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("sweep", total=len(ms))
        result = sweep(tpl, device, ms, args.n, args.k, configs, store=store, force=args.force, seed=args.seed,
                       progress=lambda i, n, m: bar.update(task, completed=i, total=n, description=f"M={m}"),
                       engine=engine)
    table = dispatch_table(result, args.tolerance)
    ranges = next(iter(table["entries"].values()))["ranges"]
    tbl, legend = sweep_table(result, ranges, wide=args.wide)
    console.print(tbl)
    for line in legend:
        console.print(line, markup=False, highlight=False)
    console.print(f"dispatch (within {100 * args.tolerance:g}% of the per-M best at every measured M):", markup=False)
    for r in ranges:
        console.print(f"  M {r['m_min']}..{r['m_max']}: {r['label']}", markup=False, highlight=False)
    from tilewise.tune.measure import noise_note

    noisy = [(m, r["label"]) for r in ranges for m in result.ms if r["m_min"] <= m <= r["m_max"]
             for c in result.configs if str(c) == r["label"] and (st := result.stats.get(c, {}).get(m)) is not None
             and noise_note(st)]
    if noisy:
        console.print(f"note: {len(noisy)} of the dispatch choices' timings are too noisy to compare (e.g. "
                      f"M={noisy[0][0]}); a quieter machine or more rounds make the cutoffs trustworthy", markup=False)
    fails = sum(len(v) for v in result.failures.values())
    if fails:
        console.print(f"{fails} (config, M) pairs did not run correctly; see --json", markup=False)
    if args.out:
        common.write_atomic(args.out, json.dumps(table, indent=1))
        console.print(f"wrote {args.out}", markup=False)
    common.emit_json(args.json, sweep_json(result, table), lambda line: console.print(line, markup=False))
    if args.plot:
        plot_sweep(result, args.plot, ranges)
        console.print(f"wrote {args.plot}", markup=False)
    return 0
