"""Do a tuned table's choices for the sliced tail make a decision faster? (CUDA, one model, one call)

Two twins of the device's tuned table (`--table`, else the one `tilewise.load` finds), each raced against it:
- `--twin cw1` (default): the short-row matmul (`nf4_mm_rows`, a decision's last blocks: 1 and 3 rows for
  lfm2-350m) with CW 1 in every range. With CW > 1 a warp has the weight loads of CW columns in flight together and
  the grid has CW times fewer blocks; each column adds in the order CW 1 does, so the twin computes the same bits.
- `--twin attention`: the attention entry without the ranges `tune model` tuned for the tail's few queries (the last
  attention block's), so every block runs the decision length's tile.
- `--against T2.json`: another table of the same device and kernels (say one tuned with `--climb`), raced whole.
Printed:
    store     with `--store` (the tune's result store), per short-row matmul and row count: the fastest CW 1 and
              the fastest CW > 1 config, each tune median, measured in the same run
    changed   the ranges the twin changes
    race      decisions on the two tables in alternating rounds (graph replays, as `play` runs them), the largest
              score difference (0: the same bits) and each op's GPU time on both

    PYTHONPATH=src python3 experiments/rows_columns_cuda.py --out OUT_DIR [--twin cw1|attention | --against T2.json]
        [--table T.json] [--store S.db]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tilewise.devices import get_device  # noqa: E402
from tilewise.model.bench import PREFIX_TOKENS, prompts, race_args, race_pair, report_pair  # noqa: E402
from tilewise.model.cuda import CUDAExecutor  # noqa: E402
from tilewise.model.runtime import open_checkpoint  # noqa: E402
from tilewise.tune.dispatch import DispatchTable, load_table  # noqa: E402


def one_column(table: DispatchTable) -> tuple[DispatchTable, list[str]]:
    """`table` with every short-row range's CW set to 1, and a line per range it changed."""
    twin = DispatchTable.from_json(copy.deepcopy(table.to_json()), "the CW 1 twin")
    changed = []
    for key, entry in twin.entries.items():
        for r in entry.ranges:
            if ".rows." in r.get("kernel", "") and r["config"].get("CW", 1) != 1:
                changed.append(f"{key} rows {r['m_min']}-{r['m_max']}: {r['config']} -> CW 1")
                r["config"] = {**r["config"], "CW": 1}
                for field in ("config_key", "label"):
                    r.pop(field, None)
    return twin, changed


def whole_attention(table: DispatchTable) -> tuple[DispatchTable, list[str]]:
    """`table` with each attention entry's last range (the decision length's tile) for every query count."""
    twin = DispatchTable.from_json(copy.deepcopy(table.to_json()), "the attention twin")
    changed = []
    for key, entry in twin.entries.items():
        if entry.family == "attention" and len(entry.ranges) > 1:
            last = entry.ranges[-1]
            changed += [f"{key} queries {r['m_min']}-{r['m_max']}: {r['kernel']} {r['config']} -> {last['kernel']} "
                        f"{last['config']}" for r in entry.ranges[:-1]]
            entry.ranges = [{**last, "m_min": 1}]
    return twin, changed


def range_changes(base: DispatchTable, other: DispatchTable) -> list[str]:
    """A line per entry whose ranges (kernel, config and rows) differ between two tables, or that one lacks, and one
    per model whose whole-run settings (PDL, the fold, ...) differ."""
    def ranges(t: DispatchTable, key: str) -> list[tuple[Any, Any, str, str]]:
        e = t.entries.get(key)
        return [(r["m_min"], r.get("m_max"), r.get("kernel", ""), json.dumps(r["config"], sort_keys=True))
                for r in (e.ranges if e else [])]

    out = []
    for key in sorted(set(base.entries) | set(other.entries)):
        a, b = ranges(base, key), ranges(other, key)
        if a != b:
            out.append(f"{key}: {a} -> {b}")
    for model in sorted(set(base.settings) | set(other.settings)):
        a, b = (t.settings.get(model, {}).get("values") for t in (base, other))
        if a != b:
            out.append(f"settings of {model}: {a} -> {b}")
    return out


TWINS = {"cw1": (one_column, "CW 1", "the tuned CW"), "attention": (whole_attention, "the decision's attention tile",
                                                                     "the tail's own tile")}


def store_lines(path: str, fingerprint: str) -> list[str]:
    """Per matmul shape with a short-row result: the fastest CW 1 and CW > 1 configs of the store's rows kernels."""
    from tilewise.tune.store import Store

    best: dict[tuple[str, str], dict[bool, tuple[float, str]]] = {}
    with Store(path, readonly=True) as store:
        for res in store.query(fingerprint=fingerprint):
            if ".rows." not in res.kernel or res.status != "ok" or res.median_ms is None:
                continue
            cw = dict(p.split("=") for p in res.config.split(",")).get("CW", "1")
            slot = best.setdefault((res.kernel, res.shape), {})
            wide = cw != "1"
            if wide not in slot or res.median_ms < slot[wide][0]:
                slot[wide] = (res.median_ms, res.config)
    out = []
    for (kernel, shape), slot in sorted(best.items()):  # keys are unique: values never compared
        one, wide = slot.get(False), slot.get(True)
        ratio = f"{one[0] / wide[0]:.2f}x" if one and wide else "-"
        text = {w: f"{v[0] * 1e3:.2f} us ({v[1]})" if v else "none" for w, v in ((False, one), (True, wide))}
        out.append(f"{kernel} {shape}: CW 1 best {text[False]}, CW > 1 best {text[True]}: {ratio}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    race_args(ap, "lfm2-350m", 346, "table")
    ap.add_argument("--table", help="dispatch table JSON (default: the device's, as `tilewise.load` finds it)")
    ap.add_argument("--store", help="the tune's result store, for each shape's best CW 1 and CW > 1 configs")
    ap.add_argument("--twin", choices=sorted(TWINS), default="cw1", help="which choices the twin undoes")
    ap.add_argument("--against", metavar="T2.json", help="race another table instead of a twin (--twin is ignored)")
    ap.add_argument("--out", help="folder for rows_columns.json")
    args = ap.parse_args()
    dev = get_device(args.device)
    ck = open_checkpoint(args.preset, weights="nf4")
    _, full = prompts(ck.config.vocab_size, args.seq, 40, PREFIX_TOKENS, seed=5)
    tuned = CUDAExecutor(ck, device=dev, dispatch=load_table(args.table) if args.table else None, quiet=True)
    if args.store:
        print("\n".join(store_lines(args.store, dev.info.fingerprint)))
    if args.against:
        twin, base_label, tuned_label = load_table(args.against), Path(args.against).name, "the table"
        changed, args.twin = range_changes(twin, tuned.dispatch), "against"
    else:
        make, base_label, tuned_label = TWINS[args.twin]
        twin, changed = make(tuned.dispatch)
    print("\n".join(changed) or f"the tables differ in no range ({args.twin}): nothing to race")
    if not changed:
        return 0
    executors = {args.twin: CUDAExecutor(ck, device=dev, dispatch=twin, quiet=True), "tuned": tuned}
    race = race_pair(executors, full, args.rounds, args.per_round, args.twin, "tuned", (base_label, tuned_label))
    print(f"{dev.info.name} [{dev.info.fingerprint}]: {args.preset}, {args.seq} rows; settings "
          f"{tuned.measured_settings or 'none raced'}")
    report_pair(race, f"tuned over {base_label}", args, dev, "rows_columns.json", "experiments/rows_columns_cuda.py",
                changed=changed, twin=args.twin,
                **({"against": Path(args.against).name} if args.against else {}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
