"""The ceiling of Dawn's subgroup matrices on this GPU: how fast `subgroupMatrixMultiplyAccumulate` runs when
nothing else does, and when its fragments come from workgroup memory as a tiled matmul's K loop takes them.

Every kernel is one workgroup of NSG subgroups (32 invocations each) repeated over a grid that fills the GPU; each
subgroup holds FM x FN result fragments and runs `iters` K steps of FM x FN multiply-accumulates:

    reg      the FM left and FN right fragments are loaded once from storage before the loop: the multiplies
             alone, back to back (FM x FN independent accumulators hide their latency)
    wg       every K step loads its FM left and FN right fragments from workgroup memory (the K loop of a
             staged tile, without the copies and barriers), from P = 4 K positions in turn; PAD halves of
             padding per staged row
    wg-pad   `wg` with PAD 8 (rows 16 bytes further apart, the staged tiles' option)
    sg       `wg-pad` with each subgroup reading its own fragments of a 2 x NSG/2 grid of them, as in a tiled matmul
    bar      `sg` with a workgroup barrier every K step, as a staged K loop has

`--waves 1` runs one workgroup per multiprocessor, as the classifier's 346-row matmuls do. Each variant's results
are checked, every value, against float64 (the sums of `iters / P` repeats of the same small product), so a
compiler that dropped work would fail the check, not post a rate. TFLOP/s = 2 m n k x multiplies / median time.
Writes `sgmat_peak.json` (date, device, command, every stat) into `--out`.

    [TILEWISE_DAWN_UNCHECKED=1] PYTHONPATH=src python3 experiments/sgmat_peak_dawn.py --out DIR
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tilewise.devices import get_device  # noqa: E402
from tilewise.devices.base import Launch  # noqa: E402
from tilewise.tune.measure import measure  # noqa: E402

P = 4  # K positions a `wg` variant cycles through (its staged tiles are P fragments deep)
SG = 32  # invocations per subgroup the layout assumes (NVIDIA's)
VARIANTS = ("reg", "wg", "wg-pad", "sg", "bar")


def grid_of(variant: str, nsg: int) -> tuple[int, int]:
    """Subgroups along M and N of the workgroup's tile: `sg` and `bar` give each subgroup its own fragments (a
    2 x nsg/2 grid, as a tiled matmul does); the others have every subgroup read the same ones."""
    return (2, nsg // 2) if variant in ("sg", "bar") else (1, 1)


def peak_wgsl(variant: str, frag: tuple[int, int, int], acc: str, fm: int, fn: int, nsg: int) -> str:
    """One kernel: `nsg` subgroups, each with fm x fn `acc` (f32 or f16) result fragments of shape frag (m, n, k).

    Bindings: A (GM TM, TK) f16 and B (TK, GN TN) f16 row-major, where TM = fm m, TN = fn n, TK = P k and GM x GN is
    `grid_of`; C: one (TM, TN) block of results per subgroup of the grid; dims.x: K steps. `sg` and `bar` stage
    with PAD 8 like `wg-pad`; `bar` adds a workgroup barrier to every K step, as a staged K loop has."""
    m, n, k = frag
    gm, gn = grid_of(variant, nsg)
    tm, tn, tk = fm * m, fn * n, P * k
    pad = 0 if variant == "wg" else 8
    lda, ldb = tk + pad, gn * tn + pad
    w: list[str] = ["enable f16;", "enable subgroups;", "enable chromium_experimental_subgroup_matrix;",
                    f"// sgmat peak: {variant}, fragments {m}x{n}x{k} f16->{acc}, {fm}x{fn} each, {nsg} subgroups",
                    "@group(0) @binding(0) var<storage, read> A: array<f16>;  // (GM TM, TK)",
                    "@group(0) @binding(1) var<storage, read> B: array<f16>;  // (TK, GN TN)",
                    f"@group(0) @binding(2) var<storage, read_write> C: array<{acc}>;  // (subgroups, TM, TN)",
                    "@group(0) @binding(3) var<uniform> dims: vec4<u32>;  // x: K steps",
                    f"alias Left = subgroup_matrix_left<f16, {k}, {m}>;",
                    f"alias Right = subgroup_matrix_right<f16, {n}, {k}>;",
                    f"alias Acc = subgroup_matrix_result<{acc}, {n}, {m}>;"]
    if variant != "reg":
        w += [f"var<workgroup> As: array<f16, {gm * tm * lda}>;  // (GM TM, TK + PAD)",
              f"var<workgroup> Bs: array<f16, {tk * ldb}>;  // (TK, GN TN + PAD)"]
    w += [f"@compute @workgroup_size({nsg * SG})",
          "fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wg: vec3<u32>,",
          "        @builtin(subgroup_id) sg: u32) {"]
    w += [f"  var acc_{i}_{j} = Acc();" for i in range(fm) for j in range(fn)]
    if variant == "reg":
        w += [f"  let a_{i} = subgroupMatrixLoad<Left, row_major>(&A, {i * m * tk}u, {tk}u);" for i in range(fm)]
        w += [f"  let b_{j} = subgroupMatrixLoad<Right, row_major>(&B, {j * n}u, {tn}u);" for j in range(fn)]
        w += ["  for (var it = 0u; it < dims.x; it++) {"]
        w += [f"    acc_{i}_{j} = subgroupMatrixMultiplyAccumulate(a_{i}, b_{j}, acc_{i}_{j});"
              for i in range(fm) for j in range(fn)]
    else:
        step, ta, tb = f"e += {nsg * SG}u", gm * tm * tk, tk * gn * tn
        w += [f"  for (var e = tid; e < {ta}u; {step}) {{ As[(e / {tk}u) * {lda}u + e % {tk}u] = A[e]; }}",
              f"  for (var e = tid; e < {tb}u; {step}) {{ Bs[(e / {gn * tn}u) * {ldb}u + e % {gn * tn}u] = B[e]; }}",
              "  workgroupBarrier();",
              f"  let r0 = (sg / {gn}u) % {gm}u * {tm}u; let c0 = sg % {gn}u * {tn}u;  // the subgroup's corner",
              "  for (var it = 0u; it < dims.x; it++) {",
              f"    let p = it % {P}u;  // uniform: every subgroup reads the same K position"]
        w += [f"    let a_{i} = subgroupMatrixLoad<Left, row_major>(&As, (r0 + {i * m}u) * {lda}u + p * {k}u, {lda}u);"
              for i in range(fm)]
        w += [f"    let b_{j} = subgroupMatrixLoad<Right, row_major>(&Bs, p * {k * ldb}u + c0 + {j * n}u, {ldb}u);"
              for j in range(fn)]
        w += [f"    acc_{i}_{j} = subgroupMatrixMultiplyAccumulate(a_{i}, b_{j}, acc_{i}_{j});"
              for i in range(fm) for j in range(fn)]
        if variant == "bar":
            w.append("    workgroupBarrier();")
    w += ["  }", f"  let base = (wg.x * {nsg}u + sg) * {tm * tn}u;"]
    w += [f"  subgroupMatrixStore<row_major>(&C, base + {i * m * tn + j * n}u, acc_{i}_{j}, {tn}u);"
          for i in range(fm) for j in range(fn)]
    w.append("}")
    return "\n".join(w) + "\n"


def expected(variant: str, a: np.ndarray, b: np.ndarray, frag: tuple[int, int, int], fm: int, fn: int, nsg: int,
             iters: int) -> np.ndarray:
    """(nsg, TM, TN) float64: what each subgroup of a workgroup holds after `iters` K steps."""
    m, n, k = frag
    gm, gn = grid_of(variant, nsg)
    tm, tn = fm * m, fn * n
    if variant == "reg":  # the first K position only, every step
        one = iters * (a[:tm, :k].astype(np.float64) @ b[:k, :tn].astype(np.float64))
        return np.broadcast_to(one, (nsg, tm, tn))
    full = (iters // P) * (a.astype(np.float64) @ b.astype(np.float64))  # each K position iters / P times
    return np.stack([full[(s // gn) % gm * tm:][:tm, s % gn * tn:][:, :tn] for s in range(nsg)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="dawn")
    ap.add_argument("--iters", type=int, default=1024, help="K steps per subgroup (a multiple of 4)")
    ap.add_argument("--waves", type=int, default=8, help="workgroups per multiprocessor-sized share of the grid")
    ap.add_argument("--shapes", default="2x2,2x4,4x4", help="fragments per subgroup FMxFN, comma-separated")
    ap.add_argument("--nsg", type=int, default=4, help="subgroups per workgroup")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    if args.iters % P:
        ap.error(f"--iters must be a multiple of {P}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = get_device(args.device)
    configs = [c for c in dev.info.limits.subgroup_matrix_configs if c.component_type == "f16"]
    if not configs:
        print(f"{dev.info.name}: no f16 subgroup-matrix configurations; use --device dawn on a GPU that has them")
        return 2
    rng = np.random.default_rng(0)
    grid = 132 * args.waves  # enough workgroups for 8 per multiprocessor on the largest Hopper parts
    iters = np.array([args.iters, 0, 0, 0], dtype=np.uint32)
    dims = dev.upload(iters, uniform=True)
    argv = [("OUT_DIR" if a == str(out) else a) for a in sys.argv[1:]]
    doc: dict[str, Any] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                           "command": "python3 experiments/sgmat_peak_dawn.py " + " ".join(argv),
                           "device": dev.info.as_dict(), "iters": args.iters, "grid": grid, "nsg": args.nsg,
                           "rows": []}
    runs: dict[str, list[Launch]] = {}
    meta: dict[str, dict[str, Any]] = {}
    for c in configs:
        frag = (c.m, c.n, c.k)
        acc = c.result_component_type
        for shape in args.shapes.split(","):
            fm, fn = (int(v) for v in shape.split("x"))
            if fm * fn * c.m * c.n // SG * (4 if acc == "f32" else 2) > 512:
                continue  # more than 128 f32 accumulator words an invocation would spill
            tm, tn, tk = fm * c.m, fn * c.n, P * c.k
            for variant in VARIANTS:
                gm, gn = grid_of(variant, args.nsg)
                a = rng.uniform(-1, 1, (gm * tm, tk)).astype(np.float16)
                b = rng.uniform(-1, 1, (tk, gn * tn)).astype(np.float16)
                key = f"{c.label()} {fm}x{fn} {variant}"
                src = peak_wgsl(variant, frag, acc, fm, fn, args.nsg)
                try:
                    prog = dev.compile(src, name=f"peak {key}")
                except Exception as exc:  # one shader the driver refuses must not cost the others
                    print(f"{key:<34} compile failed: {str(exc).splitlines()[0]}", flush=True)
                    continue
                c_buf = dev.allocate(grid * args.nsg * tm * tn * (4 if acc == "f32" else 2))
                launch = Launch(prog, (grid, 1, 1), [dev.upload(a), dev.upload(b), c_buf, dims])
                got = dev.run_and_download([launch], c_buf, np.float32 if acc == "f32" else np.float16)
                got = got.reshape(grid, args.nsg, tm, tn).astype(np.float64)
                want = expected(variant, a, b, frag, fm, fn, args.nsg, args.iters)[None]
                err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
                # one step of 1024 dropped moves f32 sums by 1e-3; f16 sums growing for 1024 steps round off by up to
                # about 12% (measured), so there the check catches only lost work on a larger scale
                tol = 5e-4 if acc == "f32" else 0.2
                mults = grid * args.nsg * fm * fn * args.iters
                meta[key] = {"frag": c.label(), "fm": fm, "fn": fn, "variant": variant, "max_rel_err": err,
                             "ok": err <= tol, "flop": 2.0 * c.m * c.n * c.k * mults}
                if err > tol:
                    print(f"{key:<34} WRONG: max relative error {err:.2e} (tolerance {tol:.0e})", flush=True)
                    continue
                runs[key] = [launch]
    got = measure(dev, runs, warmup=3, min_rounds=args.rounds, max_rounds=args.rounds, budget_s=120.0, rng=rng)
    print(f"{dev.info.name}: {args.iters} K steps a subgroup, {grid} workgroups of {args.nsg} subgroups")
    for key, st in got.stats.items():
        row = {**meta[key], "key": key, **st.as_dict(), "tflops": meta[key]["flop"] / st.median_ms / 1e9}
        doc["rows"].append(row)
        print(f"{key:<34}{st.median_ms:9.3f} ms [{st.p20_ms:.3f}, {st.p80_ms:.3f}]{row['tflops']:8.1f} TFLOP/s",
              flush=True)
    (out / "sgmat_peak.json").write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
