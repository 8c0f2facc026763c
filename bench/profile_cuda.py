"""Where one CUDA decision's time goes: every kernel of one lfm2-350m decision under Nsight Compute,
with its op label, so the kernels' own time can be set beside the graph replay's wall time.

    ncu --profile-from-start off --cache-control none --clock-control none --csv \
        --metrics gpu__time_duration.sum,gpc__cycles_elapsed.max \
        python3 bench/profile_cuda.py run --labels OUT/labels.json > OUT/ncu.csv
    python3 bench/profile_cuda.py table OUT/ncu.csv OUT/labels.json [--clock-mhz 1980]

`run` loads the nf4 preset (seeded random weights) on the CUDA device with the dispatch table of
TILEWISE_DISPATCH_DIR, makes three decisions, then one more launch by launch inside the profiler's range, and
writes that decision's op labels in launch order. `table` joins the CSV's kernels with the labels (both in launch
order) and prints per op: launches, the kernels' time in cycles at `--clock-mhz` (the profiler leaves the clock
alone, so its durations may be taken at a lower clock) per op and kernel, and the share of the decision.

Why a kernel takes its time: profile the same run with Nsight Compute's sections instead of the two metrics, then
`details` prints, for the first launch of each (op, kernel), every metric of those sections (occupancy, waves,
throughputs, warp states), so the model's small kernels can be read beside each other:

    ncu --profile-from-start off --cache-control none --clock-control none --csv --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats \
        python3 bench/profile_cuda.py run --labels OUT/labels.json > OUT/sections.csv
    python3 bench/profile_cuda.py details OUT/sections.csv OUT/labels.json [--ops ffn.gate_up,ffn.down]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def run(preset: str, seq: int, labels_path: Path) -> None:
    import cupy as cp

    from tilewise.model.bench import PREFIX_TOKENS, prompts
    from tilewise.model.runtime import from_checkpoint, open_checkpoint

    ck = open_checkpoint(preset, weights="f32", seed=0).converted("nf4").materialize()
    model = from_checkpoint(ck, device="cuda", quiet=True)
    _, full = prompts(ck.config.vocab_size, seq, 4, PREFIX_TOKENS)
    for ids in full[:3]:
        model.scores(model.prefill(ids))
    ex = model.executor
    ex.graphs = False  # launch by launch: the profiler sees each kernel once, in plan order
    seen = []
    run_plan = ex.run_plan
    ex.run_plan = lambda plan, timed=False: (seen.append(plan), run_plan(plan, timed))[1]
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.profiler.start()
    model.scores(model.prefill(full[3]))
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.profiler.stop()
    plan = seen[-1]
    labels_path.write_text(json.dumps({"preset": preset, "seq": seq, "labels": plan.labels,
                                       "dispatch": Path(str(getattr(ex.dispatch, "source", None))).name}))
    print(f"profiled {len(plan.labels)} launches", file=sys.stderr)


def profiled(csv_path: Path, labels_path: Path) -> tuple[list[str], list[dict[str, object]]]:
    """The decision's op labels and its kernels in launch order, each {"name", "section/metric [unit]": value} (a
    number where the value reads as one)."""
    labels = json.loads(labels_path.read_text())["labels"]
    rows = [r for r in csv.reader(line for line in csv_path.read_text().splitlines() if line.startswith('"'))]
    head, body = rows[0], rows[1:]
    col = {name: head.index(name) for name in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
    sec, unit = head.index("Section Name") if "Section Name" in head else None, head.index("Metric Unit")
    kernels: dict[int, dict[str, object]] = {}
    for r in body:
        k = kernels.setdefault(int(r[col["ID"]]), {"name": r[col["Kernel Name"]]})
        value: object = r[col["Metric Value"]]
        with contextlib.suppress(ValueError):
            value = float(str(value).replace(",", ""))
        k[r[col["Metric Name"]]] = value
        if sec is not None:
            k[f"{r[sec]}/{r[col['Metric Name']]} [{r[unit]}]"] = value
    ordered = [kernels[i] for i in sorted(kernels)]
    if len(ordered) != len(labels):
        sys.exit(f"{len(ordered)} kernels profiled but {len(labels)} labels: not the same decision")
    return labels, ordered


def short_name(kernel: dict[str, object]) -> str:
    return str(kernel["name"]).split("(")[0].split("<")[0].removeprefix("void ")


def details(csv_path: Path, labels_path: Path, ops: list[str] | None) -> None:
    labels, ordered = profiled(csv_path, labels_path)
    seen: set[tuple[str, str]] = set()
    for label, k in zip(labels, ordered):
        key = (label, short_name(k))
        if key in seen or (ops and label not in ops):
            continue
        seen.add(key)
        print(f"== {label}: {str(k['name']).split('(')[0].removeprefix('void ')}")
        for name, value in k.items():
            if "/" in name:  # section/metric [unit]
                print(f"   {name:78} {value:>14,.2f}" if isinstance(value, float) else f"   {name:78} {value!s:>14}")


def table(csv_path: Path, labels_path: Path, clock_mhz: float) -> None:
    labels, ordered = profiled(csv_path, labels_path)
    ops: dict[tuple[str, str], list[float]] = {}  # (op label, kernel) -> us per launch
    for label, k in zip(labels, ordered):
        kernel = short_name(k)
        ops.setdefault((label, kernel), []).append(float(k["gpc__cycles_elapsed.max"]) / clock_mhz)  # type: ignore
    total = sum(sum(v) for v in ops.values())
    print(f"{'op':18} {'kernel':22} {'launches':>8} {'us':>8} {'us each':>8} {'share':>6}   (cycles at "
          f"{clock_mhz:.0f} MHz)")
    for (label, kernel), v in sorted(ops.items(), key=lambda kv: -sum(kv[1])):
        print(f"{label:18} {kernel:22} {len(v):8d} {sum(v):8.1f} {sum(v) / len(v):8.2f} {sum(v) / total:6.1%}")
    print(f"{'sum':18} {'':22} {len(labels):8d} {total:8.1f}")
    small = [us for v in ops.values() for us in v if us < 5]
    print(f"kernels under 5 us: {len(small)}, {sum(small):.1f} us together")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--preset", default="lfm2-350m")
    r.add_argument("--seq", type=int, default=346)
    r.add_argument("--labels", type=Path, required=True)
    t = sub.add_parser("table")
    t.add_argument("csv", type=Path)
    t.add_argument("labels", type=Path)
    t.add_argument("--clock-mhz", type=float, default=1980.0)
    d = sub.add_parser("details")
    d.add_argument("csv", type=Path)
    d.add_argument("labels", type=Path)
    d.add_argument("--ops", default="", help="op labels to show, comma-separated (default: all)")
    a = ap.parse_args()
    if a.cmd == "run":
        run(a.preset, a.seq, a.labels)
    elif a.cmd == "details":
        details(a.csv, a.labels, [o for o in a.ops.split(",") if o] or None)
    else:
        table(a.csv, a.labels, a.clock_mhz)


if __name__ == "__main__":
    main()
