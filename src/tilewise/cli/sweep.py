"""`tilewise sweep FAMILY --m 1..512:8 --n N --k K`: configs timed across row counts, tile waste beside the times,
and the fitted dispatch table (`--out`, the format the runtime loads)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tilewise.errors import ConfigError


def register(sub: Any) -> None:
    p = sub.add_parser("sweep", help="time configs across many M, report tile waste, fit a dispatch table")
    p.add_argument("kernel", help="kernel family with an M,N,K shape (gemm, nf4-matmul, ...)")
    p.add_argument("--device", default="auto", help="auto, webgpu, webgpu:N, cuda, cuda:N (default auto)")
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


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tilewise.devices import resolve
    from tilewise.kernels.registry import backends, get_template
    from tilewise.tune.dispatch import dispatch_table
    from tilewise.tune.report import plot_sweep, sweep_table
    from tilewise.tune.store import Store
    from tilewise.tune.sweep import parse_m_values, sweep, sweep_candidates, sweep_json

    ms = parse_m_values(args.m)
    if args.n < 1 or args.k < 1:
        raise ConfigError(f"--n {args.n} --k {args.k}: sizes must be positive", "write e.g. --n 2560 --k 1024")
    choice = resolve(args.device, backends(args.kernel), job=f"sweeping {args.kernel}")
    tpl = get_template(args.kernel, choice.device.info.backend)
    if tuple(tpl.shape_names) != ("M", "N", "K"):
        raise ConfigError(f"sweep needs an M,N,K kernel; {tpl.name} has {tpl.shape_names}", "sweep gemm")
    device = choice.device
    configs = sweep_candidates(tpl, device.info.limits, args.configs, args.space)
    if not configs:
        raise ConfigError(f"no config of space {args.space or tpl.default_space()} is legal on {device.info.name}",
                          f"see `tilewise tune {args.kernel} --dry-run` for the reasons")
    store = Store(args.store)
    console = Console(soft_wrap=True)
    console.print(choice.line(), markup=False, highlight=False)
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
