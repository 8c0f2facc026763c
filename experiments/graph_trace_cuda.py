"""Kernel times inside CUDA graph replays, one setting on and off (the norm fold by default), from an Nsight Systems
trace. Op-by-op timing (`forward(timed=True)`) runs each launch alone between two events; a decision is one graph
replay. A cost only the replay has (the gap before a kernel, a kernel slower after another) never shows op by op.

Run it under the profiler, then read the trace's kernel rows:

    nsys profile --cuda-graph-trace=node -o OUT/trace python3 experiments/graph_trace_cuda.py --out OUT
    nsys stats --report cuda_gpu_trace --format csv --output OUT/trace OUT/trace.nsys-rep
    python3 experiments/graph_trace_cuda.py --parse OUT/trace_cuda_gpu_trace.csv --out OUT

Without Nsight Systems, `--torch-trace` records the same run through PyTorch's profiler (CUPTI, which sees CuPy's
kernels in the same CUDA context, graph nodes one by one) and writes its kernel rows as `trace.csv` in the columns
`--parse` reads:

    python3 experiments/graph_trace_cuda.py --out OUT --torch-trace
    python3 experiments/graph_trace_cuda.py --parse OUT/trace.csv --out OUT

The first run replays each mode's decisions after its warm-up, the modes one after the other with a pause around
each stretch, and writes `launches.json` (each mode's op label per launch, in plan order). `--parse` cuts the trace's
kernel rows at the pauses, takes the stretches of exactly `decisions` x launches kernels as the modes' replays (in
order) and prints, per op and mode, the kernel time and the idle time before its kernels (from the previous
kernel's end), each a median over the decisions, and the decisions' spans; `graph_trace.json` holds it all.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

PAUSE_S = 0.05  # around each measured stretch: far longer than any gap inside a decision
SETTINGS = ("fold_norm", "fuse_preps", "serial_reduce")


def record(args: argparse.Namespace) -> int:
    from tilewise.devices import get_device
    from tilewise.model.bench import PREFIX_TOKENS, prompts
    from tilewise.model.cuda import CUDAExecutor
    from tilewise.model.runtime import open_checkpoint
    from tilewise.tune.dispatch import load_table

    dev = get_device(args.device)
    ck = open_checkpoint(args.preset, weights="nf4")
    table = load_table(args.table) if args.table else None
    _, full = prompts(ck.config.vocab_size, args.seq, 40, PREFIX_TOKENS, seed=3)
    modes: dict[str, list[str]] = {}
    if args.torch_trace:
        import torch

        tracing: Any = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    else:
        tracing = contextlib.nullcontext()
    with tracing as prof:
        for on in (True, False):
            ex = CUDAExecutor(ck, device=dev, dispatch=table, quiet=True)
            setattr(ex, args.setting, on)
            ex.forward(full[0], 0, None, True, timed=True)  # the plan's launches in order, by op label
            labels = [label for label, _ in ex.last_op_times]
            for i in range(5):  # the graph captured, clocks up
                ex.forward(full[i], 0, None, True)
            dev.synchronize()
            time.sleep(PAUSE_S)
            for i in range(args.decisions):
                ex.forward(full[i % len(full)], 0, None, True)
            dev.synchronize()
            time.sleep(PAUSE_S)
            modes[f"{args.setting} {'on' if on else 'off'}"] = labels
    doc = {"device": dev.info.name, "preset": args.preset, "seq": args.seq, "decisions": args.decisions,
           "modes": modes}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.torch_trace:
        chrome = Path(args.out) / "trace.json"
        prof.export_chrome_trace(str(chrome))
        kernels = [e for e in json.loads(chrome.read_text())["traceEvents"] if e.get("cat") == "kernel"]
        with (Path(args.out) / "trace.csv").open("w", newline="") as f:  # ts and dur are microseconds
            w = csv.writer(f)
            w.writerow(["Start (ns)", "Duration (ns)", "Name"])
            w.writerows([round(float(e["ts"]) * 1e3), round(float(e["dur"]) * 1e3), e["name"]] for e in kernels)
        chrome.unlink()
    (Path(args.out) / "launches.json").write_text(json.dumps(doc, indent=1))
    print(f"{dev.info.name}: {', '.join(f'{m}: {len(v)} launches' for m, v in modes.items())}")
    return 0


def kernel_rows(path: Path) -> list[tuple[float, float]]:
    """(start ns, duration ns) of every kernel row of an `nsys stats --report cuda_gpu_trace` CSV, in time order
    (memory copies and sets are left out)."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if any(c.startswith("Start") for c in r))
    cols = rows[head]
    start, dur = (next(i for i, c in enumerate(cols) if c.startswith(p)) for p in ("Start", "Duration"))
    name = next(i for i, c in enumerate(cols) if c.strip() == "Name")
    out = [(float(r[start]), float(r[dur])) for r in rows[head + 1:]
           if len(r) > name and r[name] and not r[name].startswith("[CUDA")]
    return sorted(out)


def stretches(rows: list[tuple[float, float]], pause_ns: float) -> list[list[tuple[float, float]]]:
    """`rows` cut wherever a kernel starts more than `pause_ns` after the previous one ended."""
    out: list[list[tuple[float, float]]] = []
    end = None
    for s, d in rows:
        if end is None or s - end > pause_ns:
            out.append([])
        out[-1].append((s, d))
        end = s + d
    return out


def parse(args: argparse.Namespace) -> int:
    doc = json.loads((Path(args.out) / "launches.json").read_text())
    decisions, modes = doc["decisions"], doc["modes"]
    parts = stretches(kernel_rows(Path(args.parse)), PAUSE_S * 1e9 / 2)
    found = {}
    rest = iter(parts)
    for mode, labels in modes.items():  # in order: each mode's replays are the next stretch of the right length
        found[mode] = next((p for p in rest if len(p) == decisions * len(labels)), None)
        if found[mode] is None:
            print(f"no stretch of {decisions} x {len(labels)} kernels for {mode}: stretch lengths "
                  f"{[len(p) for p in parts]}")
            return 1
    result: dict[str, Any] = {}
    for mode, labels in modes.items():
        rows, n = found[mode], len(labels)
        per: dict[str, dict[str, list[float]]] = {}
        spans = []
        for d in range(decisions):
            dec = rows[d * n:(d + 1) * n]
            spans.append((dec[-1][0] + dec[-1][1] - dec[0][0]) / 1e3)
            sums: dict[str, list[float]] = {}
            for i, (label, (s, dur)) in enumerate(zip(labels, dec)):
                gap = s - (dec[i - 1][0] + dec[i - 1][1]) if i else 0.0
                k, g = sums.setdefault(label, [0.0, 0.0])
                sums[label] = [k + dur / 1e3, g + gap / 1e3]
            for label, (k, g) in sums.items():
                per.setdefault(label, {"kernel_us": [], "gap_us": []})
                per[label]["kernel_us"].append(k)
                per[label]["gap_us"].append(g)
        result[mode] = {"span_us": statistics.median(spans), "launches": n,
                        "ops": {lb: {"launches": labels.count(lb), **{key: statistics.median(v)
                                                                       for key, v in d.items()}}
                                for lb, d in per.items()}}
    names = list(result)
    print(f"{doc['device']}: {doc['preset']}, {doc['seq']} rows, {decisions} replays a mode; medians in us")
    width = max(len(m) for m in names) + 9
    print(f"{'op':<20}" + "".join(f"{m + ' kernel':>{width}}{'gap':>8}{'n':>4}" for m in names))
    labels = sorted(set().union(*(r["ops"] for r in result.values())),
                    key=lambda lb: -result[names[-1]]["ops"].get(lb, {"kernel_us": 0.0})["kernel_us"])
    for lb in labels:
        cells = []
        for m in names:
            o = result[m]["ops"].get(lb)
            cells.append(f"{o['kernel_us']:>{width}.1f}{o['gap_us']:>8.1f}{o['launches']:>4}" if o
                         else f"{'-':>{width + 12}}")
        print(f"{lb:<20}" + "".join(cells))
    for m in names:
        ops = result[m]["ops"].values()
        print(f"{m}: span {result[m]['span_us']:.1f} us = kernels {sum(o['kernel_us'] for o in ops):.1f} + gaps "
              f"{sum(o['gap_us'] for o in ops):.1f} ({result[m]['launches']} launches)")
    (Path(args.out) / "graph_trace.json").write_text(json.dumps({**doc, "result": result}, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for launches.json and graph_trace.json")
    ap.add_argument("--parse", metavar="CSV", help="read this cuda_gpu_trace CSV instead of running decisions")
    ap.add_argument("--preset", default="lfm2-350m")
    ap.add_argument("--seq", type=int, default=346)
    ap.add_argument("--setting", choices=SETTINGS, default="fold_norm", help="the executor setting turned on, then off")
    ap.add_argument("--decisions", type=int, default=20, help="graph replays a mode")
    ap.add_argument("--table", help="dispatch table JSON (default: the device's, as `tilewise.load` finds it)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--torch-trace", action="store_true",
                    help="record the kernels through PyTorch's profiler into OUT/trace.csv (no Nsight Systems)")
    args = ap.parse_args()
    return parse(args) if args.parse else record(args)


if __name__ == "__main__":
    raise SystemExit(main())
