"""`tilewise tune model`'s command: the arguments checked, the device (or a Ray cluster's devices) resolved, the
tune run with progress on a terminal or as plain lines, the settings raced after a whole local CUDA tune, and the
`--json` summary (the tuning itself: `model/tune.py`)."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from typing import Any

from tilewise.errors import ConfigError
from tilewise.model import tune as model_tune
from tilewise.model.dispatch import CUDA_SETTINGS
from tilewise.tune.engine import Engine
from tilewise.tune.store import Store


def run(args: argparse.Namespace, emit_json: Callable[..., None] | None = None) -> int:
    """`tilewise tune model [--preset default] [--seq 346] [--device auto] [--budget N] [--budget-s S] ...`;
    `emit_json(target, summary, note)` writes the `--json` summary (the CLI's convention)."""
    from tilewise.devices import resolve

    name = getattr(args, "preset", None) or "default"
    seq = int(getattr(args, "seq", None) or 346)
    fmt = getattr(args, "weights", None) or "nf4"
    if fmt not in ("nf4", "f16", "f32"):
        raise ConfigError(f"unknown weight format {fmt!r}", "use --weights nf4, f16 or f32")
    if seq < 2:
        raise ConfigError(f"--seq {seq} is too short for a decision", "use e.g. --seq 346")
    cfg = model_tune.model_config(name)  # a bad preset fails before any device is opened
    job = "tuning the classifier's kernels"
    if getattr(args, "ray", None):  # one table per device fingerprint of the cluster
        from tilewise.tune.cluster import check_ray, each_device

        check_ray(args)
        args.device = str(getattr(args, "device", None) or "auto")
        each_device(args, ("webgpu", "cuda"), job, None,
                    lambda dev, line, make: _run_one(args, cfg, name, seq, fmt, dev, line, make, emit_json))
        return 0
    choice = resolve(str(getattr(args, "device", None) or "auto"), ("webgpu", "cuda"), job=job)
    return _run_one(args, cfg, name, seq, fmt, choice.device, choice.line(), Engine, emit_json)


def _run_one(args: argparse.Namespace, cfg: Any, name: str, seq: int, fmt: str, device: Any, line: str,
             make_engine: Callable[..., Engine], emit_json: Callable[..., None] | None) -> int:
    """Tune the model on one device (a cluster's: `make_engine` then builds engines on its workers)."""
    from rich.console import Console

    console = Console(stderr=getattr(args, "json", None) == "-", soft_wrap=True)  # `--json -` owns stdout
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        console.print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", markup=False, highlight=False)

    log(line)
    kw = {"rows": getattr(args, "rows", None), "seed": int(getattr(args, "seed", 0) or 0),
          "force": bool(getattr(args, "force", False)), "hand_picked": getattr(args, "hand_picked", True),
          "store": Store(getattr(args, "store", None)), "budget": getattr(args, "budget", None),
          "budget_s": getattr(args, "budget_s", None), "climb": getattr(args, "climb", 0) or 0,
          "l2": getattr(args, "l2", None) or "auto"}
    with contextlib.ExitStack() as stack:
        if console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            bar = stack.enter_context(Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                               TimeElapsedColumn(), console=console, transient=True))
            task = bar.add_task("tuning", total=None)

            def show(text: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, description=text[:72])
        else:
            last = {"t": -1e9, "what": ""}

            def show(text: str, done: int, total: int) -> None:
                # plain lines: the first candidate of every row count, then at most one line per 10 s
                what = text.rsplit(":", 1)[0]
                if what != last["what"] or time.perf_counter() - last["t"] >= 10:
                    log(f"{text} ({done}/{total} in all)")
                    last.update(t=time.perf_counter(), what=what)

        table = model_tune.tune_model(device, cfg, seq, fmt, log=log, progress=show, make_engine=make_engine, **kw)
    settings = None
    if table.partial:
        log(f"partial: {', '.join(table.partial['left'])} not measured ({table.partial['why']}); run the same "
            "command again to finish (what was measured is reused)")
    elif device.info.backend == "cuda" and make_engine is not Engine:  # a cluster's workers hold its GPUs
        log(f"settings: the executor's settings ({', '.join(CUDA_SETTINGS)}) are raced only by a tune on the GPU's "
            "own host (without --ray); until then the executor keeps its defaults")
    elif device.info.backend == "cuda":
        from tilewise.model.tune_settings import tune_settings

        settings = tune_settings(device, cfg, name, fmt, seq, table, table.source, log)["values"]
    runtime = "cuda" if device.info.backend == "cuda" else device.info.runtime or "webgpu"
    log(f"`tilewise.load(..., device='{runtime}')` uses it on this device")
    summary = {"model": name, "device": device.info.fingerprint, "table": table.source, "seq": seq,
               "weights": fmt, "partial": table.partial, "entries": sorted(table.entries),
               "settings": settings,
               "shapes": {k: {kk: v[kk] for kk in ("best_ms", "best", "failures") if kk in v}
                          for k, v in table.measured.items()}, "seconds": round(time.perf_counter() - t0, 1)}
    if emit_json is not None:
        emit_json(getattr(args, "json", None), summary, log)
    return 0
