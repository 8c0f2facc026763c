"""Where a decision's matmul time goes, block by block, inside the CUDA graph replays the executor runs: every `wgr`
launch of the plan stamps the global timer and its SM's cycle counter at the eight points of wgr_timeline_cuda.py
(entry, setup, the PDL wait, the first stage landed and decoded, the loop's end, the epilogue), each launch into its
own buffer, so that a launch's fixed costs are measured in place: after the kernel before it, under PDL, with the
table's configs, settings and f16 outputs, none of which a launch timed alone has.

The executor compiles every wgr kernel from matmul_wgr.cu's text with the stamps edited in (the table stays valid:
its versions hash the files); every plan it builds gets its wgr launches' `counters` argument replaced by a stamp
buffer (SR 1 launches read their counters and are refused). Per op label it prints, as medians over the replays, the
sum over a decision's launches of each launch's span (first block's entry to last block's end) and of its blocks'
median phases: setup (entry to the barrier after the tables), wait (the PDL wait), first (the first stage landed and
decoded), loop (the K loop), post (the epilogue's staging, stores or cluster sums; for SR 2 split into synced, its
sums sent and the peers' landed, and reduced, its token groups' slices summed and staged); and the gap from
one wgr launch's end to the next one's start (the kernels in between: conv, attention, rope, the head).

    PYTHONPATH=src python3 experiments/decision_timeline_cuda.py --out DIR [--preset lfm2-350m --seq 346]
"""
from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
sys.path.insert(0, str(ROOT / "src"))

import tilewise.kernels.matmul.cuda as mc  # noqa: E402
import wgr_parts_cuda as parts  # noqa: E402
import wgr_timeline_cuda as tl  # noqa: E402

#: point ranges: entry..setup, setup..after the PDL wait, the first stage landed and decoded, the loop, the epilogue
PHASES = {"setup": (0, 1), "wait": (1, 2), "first": (2, 4), "loop": (4, 5), "post": (5, 7)}
#: SR 2's epilogue, part of `post`: its sums sent and every peer's for its token groups landed (the wait for the
#: slowest peer), then its groups' slices summed and staged
CLUSTER = ("synced", "reduced")


def stamp_plans(ex: Any, dev: Any) -> dict[int, list[dict[str, Any]]]:
    """Wrap the executor's plan builder: every plan's wgr launches write stamps into their own buffers. Returns the
    registry, plan id -> [{index, label, entry, buffer, blocks}] in plan order."""
    registry: dict[int, list[dict[str, Any]]] = {}
    build = ex._build_plan

    def stamped_build(*args: Any, **kwargs: Any) -> Any:
        plan = build(*args, **kwargs)
        rows = []
        for i, (ln, label) in enumerate(zip(plan.launches, plan.labels)):
            entry = str(ln.program.meta.get("entry", ""))
            if not entry.startswith("nf4_mm_wgr"):
                continue
            if int(entry.rstrip(">").split(",")[-1]) == 1:
                raise SystemExit(f"{label}: {entry} sums serially (SR 1) and reads `counters`, which carries the "
                                 "stamps here; pick a table without serial_reduce")
            blocks = math.prod(ln.grid)
            buf = dev.upload(np.full((blocks, tl.STRIDE), tl.FILL, np.uint64))
            plan.launches[i] = tl.stamped(ln, buf)
            rows.append({"index": i, "label": label, "entry": entry, "buffer": buf, "blocks": blocks})
        registry[id(plan)] = rows
        return plan

    ex._build_plan = stamped_build
    return registry


def decision(dev: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One replay's stamps: per launch its span and its blocks' median phases (us), and the gaps between launches."""
    got = [tl.read(dev, r["buffer"], r["blocks"]) for r in rows]
    _, us_per_cycle = tl.cycles_of(np.concatenate(got))
    launches = []
    for r, g in zip(rows, got):
        c, _ = tl.cycles_of(g)
        ph = {name: float(np.median(c[:, b] - c[:, a]) * us_per_cycle) for name, (a, b) in PHASES.items()}
        split = tl.cluster_split(g)  # SR 2: the sums sent and landed, then summed
        ph.update({k: float(np.median(split[k]) * us_per_cycle) for k in CLUSTER} if split else {})
        launches.append({"label": r["label"], "start_ns": int(g[:, 0].min()), "end_ns": int(g[:, 14].max()), **ph})
    for a, b in itertools.pairwise(launches):
        a["gap_after_us"] = (b["start_ns"] - a["end_ns"]) / 1e3
    launches[-1]["gap_after_us"] = 0.0
    return {"mhz": 1.0 / us_per_cycle if us_per_cycle else 0.0, "launches": launches,
            "span_us": (launches[-1]["end_ns"] - launches[0]["start_ns"]) / 1e3}


def summarize(decisions: list[dict[str, Any]]) -> dict[str, Any]:
    """Per op label, medians over the decisions of the per-decision sums."""
    per: dict[str, dict[str, list[float]]] = {}
    for d in decisions:
        sums: dict[str, dict[str, float]] = {}
        for ln in d["launches"]:
            s = sums.setdefault(ln["label"], {"n": 0, "span": 0.0, **{k: 0.0 for k in (*PHASES, *CLUSTER)},
                                              "gap": 0.0})
            s["n"] += 1
            s["span"] += (ln["end_ns"] - ln["start_ns"]) / 1e3
            for k in (*PHASES, *CLUSTER):
                s[k] += ln.get(k, 0.0)
            s["gap"] += ln["gap_after_us"]
        for label, s in sums.items():
            for k, v in s.items():
                per.setdefault(label, {}).setdefault(k, []).append(v)
    ops = {label: {k: statistics.median(v) for k, v in d.items()} for label, d in per.items()}
    return {"ops": ops, "span_us": statistics.median(d["span_us"] for d in decisions),
            "mhz": statistics.median(d["mhz"] for d in decisions)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="")
    ap.add_argument("--preset", default="lfm2-350m")
    ap.add_argument("--seq", type=int, default=346)
    ap.add_argument("--decisions", type=int, default=20, help="graph replays read")
    ap.add_argument("--table", help="dispatch table JSON (default: the device's, as `tilewise.load` finds it)")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    from tilewise.devices import get_device
    from tilewise.model.bench import PREFIX_TOKENS, prompts
    from tilewise.model.cuda import CUDAExecutor
    from tilewise.model.runtime import open_checkpoint
    from tilewise.tune.dispatch import load_table

    mc.matmul_source = lambda: parts.edited_source("timeline")  # type: ignore[assignment]
    dev = get_device(args.device)
    ck = open_checkpoint(args.preset, weights="nf4")
    table = load_table(args.table) if args.table else None
    _, full = prompts(ck.config.vocab_size, args.seq, 40, PREFIX_TOKENS, seed=3)
    ex = CUDAExecutor(ck, device=dev, dispatch=table, quiet=True)
    registry = stamp_plans(ex, dev)
    ran: list[Any] = []
    run_plan = ex.run_plan

    def tracked(plan: Any, timed: bool) -> Any:
        ran.append(plan)
        return run_plan(plan, timed)

    ex.run_plan = tracked  # type: ignore[method-assign]
    for i in range(5):  # the graph captured, clocks up
        ex.forward(full[i], 0, None, True)
    dev.synchronize()
    decisions = []
    for i in range(args.decisions):
        ex.forward(full[i % len(full)], 0, None, True)
        dev.synchronize()
        decisions.append(decision(dev, registry[id(ran[-1])]))
    res = summarize(decisions)
    settings = {k: getattr(ex, k) for k in ("pdl", "fuse_preps", "serial_reduce", "fold_norm")}
    print(f"{dev.info.name}: {args.preset}, {args.seq} rows, {args.decisions} graph replays, settings {settings}; "
          f"medians over the replays of each op's sums over a decision, us ({res['mhz']:.0f} MHz by the stamps)")
    cols = ("span", *PHASES, *CLUSTER, "gap")
    print(f"{'op':<16}{'n':>4}" + "".join(f"{c:>8}" for c in cols))
    ops = sorted(res["ops"].items(), key=lambda kv: -kv[1]["span"])
    for label, o in [*ops, ("wgr, all", {k: sum(o[k] for _, o in ops) for k in ("n", *cols)})]:
        print(f"{label:<16}{o['n']:>4.0f}" + "".join(f"{o[c]:>8.1f}" for c in cols))
    print(f"first wgr entry to last wgr end: {res['span_us']:.1f} us (the gaps hold the kernels between wgr launches)")
    parts.write_record(args.out, f"decision_timeline_{args.preset}.json", "experiments/decision_timeline_cuda.py",
                       dev, preset=args.preset, seq=args.seq, settings=settings, summary=res, decisions=decisions)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
