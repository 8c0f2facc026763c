"""Where a subgroup-matrix matmul's time goes on Dawn: the classifier's sgmat kernels at a decision's row count,
with one part of the kernel taken out at a time, all raced in one interleaved measurement.

The variants edit the generated WGSL of one config (PIPE=1 or 2; the edits are textual and checked to have
changed something). They compute wrong values on purpose, so they are timed, never verified or stored:

    full        the kernel as the tuner runs it
    no-mma      the multiply-accumulates removed (the fragment loads then die with them)
    no-xload    x comes from a register instead of storage (staging, norm and f16 stores stay)
    no-wload    the NF4 words and absmax come from registers (the table lookups and f16 stores stay)
    no-decode   load8 returns registers: no weight loads, no lookups (the f16 stores stay)
    no-wstore   the decoded weights are never stored (so neither loaded nor decoded): MMA on stale tiles
    no-xstore   the x tile is never stored
    mma-only    neither tile stored: the K loop's barriers, fragment loads and multiplies
    no-loop     the K loop runs no step: launch, epilogue and the fixed costs
    bare        neither the K loop nor the epilogue: launch, workgroup memory and the NF4 table (no-loop - bare is
                the epilogue)
    f16-w       the same config with f16 weights in storage (format f16: no decode, twice the bytes)

Before the parts, with `--sample N`, the seeds and N random legal configs of each shape go through the engine
(verified against float64, every output), then `--neighbors R` rounds of hill-climbing (every legal config one
parameter away from the best, raced with it), so the parts are taken of the best one found. Writes
`sgmat_parts.json` (date, device, command, every stat) into `--out`.

    TILEWISE_DAWN_UNCHECKED=1 PYTHONPATH=src python3 experiments/sgmat_parts_dawn.py --out DIR [--sample 60]
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tilewise.devices import get_device  # noqa: E402
from tilewise.kernels.matmul.sgmat import SgmatMatmul  # noqa: E402
from tilewise.kernels.matmul.sgmat_wgsl import mm_fmt  # noqa: E402
from tilewise.model.tune import candidates, model_config, model_matmuls  # noqa: E402
from tilewise.tune.engine import Engine, Item  # noqa: E402
from tilewise.tune.measure import Stats, measure, summarize  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from clock_log import ClockLog  # noqa: E402

# the unchecked decision tune's picks at 346 rows (2026-12-05; parameters left out take the default's values)
PICKS = {
    "ffn.gate_up": {"FRAG": "16x8x16", "SM": 4, "SN": 2, "FM": 2, "FN": 8, "BK": 16, "WL": "kn", "PAD": 8, "PIPE": 2},
    "ffn.down": {"FRAG": "16x8x8", "SM": 2, "SN": 2, "FM": 6, "FN": 4, "BK": 16, "WL": "nk", "KS": 8, "PIPE": 2},
    "conv.in_proj": {"FRAG": "16x16x16", "SM": 2, "SN": 2, "FM": 3, "FN": 2, "BK": 32, "WL": "kn", "PAD": 8},
}
_X = re.compile(r"(?<![A-Za-z_0-9])x\[[^\]]*\]")


def _w_body(src: str, new_body: str | None, keep_lookups: bool) -> str:
    """load8_<s>'s body replaced: weights and absmax from registers (keeping the lookups), or `new_body`."""
    out = src
    for s in (0, 1):
        if f"fn load8_{s}(" not in out:
            continue
        if keep_lookups:
            out = re.sub(rf"let wd = w{s}\[[^\]]*\];", "let wd = row * 2654435761u + c;", out)
            out = re.sub(rf"let s = am{s}\[[^\]]*\];", "let s = f32(c) * 0.01;", out)
        else:
            out = re.sub(rf"(fn load8_{s}\(row: u32, c: u32\) -> C8 \{{)(.*?)(\n\}})",
                         lambda m: m.group(1) + "\n    " + new_body + m.group(3), out, flags=re.S)
    return out


_DECL = re.compile(r"var<storage, read> (\w+): array<(vec4<(?:f32|u32)>|f32|u32)>;")
_AS_F32 = {"vec4<f32>": "{}[0].x", "vec4<u32>": "f32({}[0].x)", "f32": "{}[0]", "u32": "f32({}[0])"}


def _keep_bindings(src: str) -> str:
    """Every storage binding read once under a condition no launch meets, so that a part taken out does not drop a
    binding from the layout Dawn derives (the launches bind them all)."""
    reads = " + ".join(_AS_F32[t].format(nm) for nm, t in _DECL.findall(src))
    head = "@builtin(subgroup_id) sg: u32) {"
    return src.replace(head, head + f"\n    if (dims.m == 4294967295u) {{ out[0] = {reads}; }}", 1)


def _drop(src: str, pattern: str) -> str:
    return "\n".join(line for line in src.split("\n") if not re.search(pattern, line))


# the lines storing staged tiles: one half at a time (VS 0), or 8 halves a vec4<u32> from a register (VS 1)
_WSTORE = r"^\s*Ws[01]\[.*\] = (f16\(|pw)"
_XSTORE = r"Xs\[o\] = h\.x|Xs\[.*\] = px"


def timed_with_clock(path: Path, run: Any, *args: Any, **kw: Any) -> tuple[Any, dict[str, float] | None]:
    """run(*args, **kw) while the SM clock is logged to `path`; (its result, the clock's min / median / max MHz,
    None where there is no nvidia-smi)."""
    with ClockLog(path) as clocks:
        got = run(*args, **kw)
    mhz = sorted(c for _, c, _ in clocks.samples())
    return got, ({"min": mhz[0], "median": mhz[len(mhz) // 2], "max": mhz[-1]} if mhz else None)


def variants(src: str) -> dict[str, str]:
    """name -> WGSL of each part taken out (see the module docstring)."""
    reg = "C8(vec4<f32>(f32(c)), vec4<f32>(f32(row)))"
    v = {
        "no-mma": _drop(src, r"= subgroupMatrixMultiplyAccumulate\("),
        "no-xload": _X.sub("vec4<f32>(f32(li) * 0.001)", src),
        "no-wload": _w_body(src, None, True),
        "no-decode": _w_body(src, f"return {reg};", False),
        "no-wstore": _drop(src, _WSTORE),
        "no-xstore": _drop(src, _XSTORE),
        "no-loop": re.sub(r"k0 < kz \+ \d+u;", "k0 < kz;", src.replace("k0 < K;", "k0 < 0u;")),
    }
    v["mma-only"] = _drop(v["no-wstore"], _XSTORE)
    lines = src.split("\n")
    cut = next(i for i, line in enumerate(lines) if "= Acc();" in line)
    v["bare"] = "\n".join(lines[:cut]) + "\n    if (dims.m == 4294967294u) { out[li] = 1.0; }\n}\n"
    for name, text in v.items():
        if text == src:
            raise RuntimeError(f"variant {name} changed nothing: the generated WGSL no longer has what it edits")
    return {name: _keep_bindings(text) for name, text in v.items()}


def scaled(st: Stats, f: float) -> Stats:
    """`st` with every sample times `f` (per run of a candidate repeated 1/f times)."""
    return summarize(st.samples_ms * f)


class Edited(SgmatMatmul):
    """An sgmat matmul whose WGSL is edited after generation (a part taken out)."""

    def __init__(self, base: SgmatMatmul, part: str) -> None:
        super().__init__(base.fmt, base.epilogue, base.features, base.norm, base.eps)
        self.part = part
        self.name = f"{base.name}~{part}"

    def source(self, config: Any, shape: Any = None) -> str:
        return variants(super().source(config, shape))[self.part] if self.part else super().source(config, shape)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="lfm2-350m")
    ap.add_argument("--rows", type=int, default=346)
    ap.add_argument("--only", default="ffn.gate_up,ffn.down,conv.in_proj")
    ap.add_argument("--sample", type=int, default=0, help="random legal configs per shape before the parts")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--neighbors", type=int, default=0, help="rounds of hill-climbing from the best config")
    ap.add_argument("--no-parts", action="store_true", help="only the sample and the hill-climb")
    ap.add_argument("--parts-only", default="", help="take the parts of these shapes only (default: all)")
    ap.add_argument("--repeat", type=int, default=8, help="back-to-back runs of a candidate per timed sample")
    ap.add_argument("--device", default="dawn")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = get_device(args.device)
    cfg = model_config(args.preset)
    shapes = model_matmuls(cfg)
    eng = Engine(dev, None, seed=0, measure_kw={"warmup": 3, "min_rounds": 8, "max_rounds": 20, "budget_s": 0.5})
    argv = [("OUT_DIR" if a == str(out) else a) for a in sys.argv[1:]]
    doc: dict[str, Any] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                           "command": "python3 experiments/sgmat_parts_dawn.py " + " ".join(argv),
                           "device": dev.info.as_dict(), "rows": args.rows, "shapes": {}}
    print(f"{dev.info.name} [{dev.info.fingerprint}]", flush=True)
    for label in [s.strip() for s in args.only.split(",") if s.strip()]:
        epilogue, n, k, norm = shapes[label]
        shape = (args.rows, n, k)
        base = SgmatMatmul("nf4", epilogue, dev.enabled_features, norm, cfg.norm_eps)
        row: dict[str, Any] = {"n": n, "k": k, "epilogue": epilogue, "norm": norm}
        best = base.config_of(PICKS[label]) if label in PICKS else base.default_config()
        if not base.space().is_legal(best, dev.info.limits):  # another adapter: its first fitted seed
            best = base.seed_configs(dev.info.limits)[0]
        if args.sample:
            t0 = time.perf_counter()
            items = [Item(base, c, shape) for c in candidates(base, dev.info.limits, args.sample, 0)
                     if not base.config_problems(c, shape)]
            # every phase logs the SM clock: a round that times its start config far slower than the round before
            # did cannot otherwise be told from a clock that fell
            outs, mhz = timed_with_clock(out / f"clocks-{label}-sample.csv", eng.evaluate, items, batch=None)
            ok = sorted((oc for oc in outs if oc.status == "ok"), key=lambda oc: oc.stats.median_ms)
            row["sample"] = {"candidates": len(items), "ok": len(ok), "seconds": time.perf_counter() - t0,
                             "sm_mhz": mhz,
                             "failed": {str(oc.config): f"{oc.status}: {oc.reason}" for oc in outs
                                        if oc.status != "ok"},
                             "ranked": [[str(oc.config), oc.stats.median_ms] for oc in ok]}
            print(f"{label}: {len(ok)}/{len(items)} ok in {row['sample']['seconds']:.0f} s (SM clock {mhz} MHz); best "
                  + ", ".join(f"{oc.stats.median_ms * 1e3:.1f} us {mm_fmt(oc.config)}"
                              for oc in ok[:5]), flush=True)
            if ok:
                best = ok[0].config
        tried = {best}
        for rnd in range(args.neighbors):  # hill-climb: every legal config one parameter away, raced with the best
            space = base.space()
            near = [space.config({**best, p: v}) for p, vals in space.params.items() for v in vals if v != best[p]]
            near = [c for c in near if c not in tried and space.is_legal(c, dev.info.limits)
                    and not base.config_problems(c, shape)]
            tried.update(near)
            outs, mhz = timed_with_clock(out / f"clocks-{label}-round{rnd + 1}.csv", eng.evaluate,
                                         [Item(base, c, shape) for c in [best, *near]], batch=None)
            ok = sorted((oc for oc in outs if oc.status == "ok"), key=lambda oc: oc.stats.median_ms)
            row.setdefault("neighbors", []).append({"from": str(best), "sm_mhz": mhz,
                                                    "ranked": [[str(oc.config), oc.stats.median_ms] for oc in ok]})
            print(f"{label} round {rnd + 1}: {len(near)} neighbours of [{mm_fmt(best)}] (SM clock {mhz} MHz); best "
                  + ", ".join(f"{oc.stats.median_ms * 1e3:.1f} us {mm_fmt(oc.config)}" for oc in ok[:4]), flush=True)
            if not ok or ok[0].config == best:
                break
            best = ok[0].config
        row["best"] = str(best)
        if args.no_parts or (args.parts_only and label not in args.parts_only.split(",")):
            doc["shapes"][label] = row
            (out / "sgmat_parts.json").write_text(json.dumps(doc, indent=1, default=str))
            continue
        parts = ["", *variants(base.source(best, shape))]
        items = [Item(Edited(base, p) if p else base, best, shape) for p in parts]
        items.append(Item(SgmatMatmul("f16", epilogue, dev.enabled_features, norm, cfg.norm_eps), best, shape))
        names = ["full", *parts[1:], "f16-w"]
        # each sample runs a candidate `--repeat` times back to back: a round of one launch each leaves the GPU
        # idle long enough between rounds for its clock to fall (the first try of this study timed everything
        # about 5x slower than the sample above)
        launches = {nm: eng.launches(it) * args.repeat for nm, it in zip(names, items)}
        got, row["sm_mhz"] = timed_with_clock(out / f"clocks-{label}.csv", measure, dev, launches, warmup=3,
                                              min_rounds=args.rounds, max_rounds=args.rounds, budget_s=60.0,
                                              rng=eng.rng)
        stats = [scaled(got.stats[nm], 1 / args.repeat) for nm in names]
        full = stats[0].median_ms
        row["config"] = str(best)
        row["parts"] = {nm: st.as_dict() for nm, st in zip(names, stats)}
        doc["shapes"][label] = row
        flops = 2 * args.rows * n * k * (2 if epilogue == "swiglu" else 1)
        print(f"\n{label} {args.rows}x{n}x{k} [{mm_fmt(best)}]: full {full * 1e3:.1f} us "
              f"({flops / full / 1e9:.1f} TFLOP/s); SM clock during the race {row['sm_mhz']} MHz")
        for nm, st in zip(names, stats):
            print(f"  {nm:<10} {st.median_ms * 1e3:9.1f} us  [{st.ci95_ms[0] * 1e3:.1f}, {st.ci95_ms[1] * 1e3:.1f}]"
                  f"  {st.median_ms / full:6.2f}x full   saves {(full - st.median_ms) * 1e3:8.1f} us", flush=True)
        (out / "sgmat_parts.json").write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
