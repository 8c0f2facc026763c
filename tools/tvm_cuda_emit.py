"""Pre-emit the TVM-scheduled CUDA kernels into a source store, for a GPU machine that has no TVM.

    PYTHONPATH=src python tools/tvm_cuda_emit.py --arch sm_90 --out build/tvm-cuda-sources

Run it where TVM is installed (no GPU needed). Then, on the GPU machine, point TILEWISE_TVM_CUDA_SOURCES at the
copied directory: `conv1d`, `gemm-tvm` and `dwsep-conv2d` on `--device cuda` (`tilewise tune`, `tilewise ladder
conv1d-gpu|gemm-gpu|dwsep-conv2d-gpu --device cuda`, tests/cuda/test_tvm_cuda_runtime.py and
tests/cuda/test_tvm_cuda_dwsep_runtime.py) read their kernels from it (`tilewise.kernels.tvm.sources`).

Without --shapes it emits, for each template, every legal config of

* the spaces and shapes tests/cuda/test_tvm_cuda_runtime.py and test_tvm_cuda_dwsep_runtime.py compile (the seed
  spaces at their shapes, the large conv1d blocks, the timed configs), and
* each CUDA ladder (`tilewise.ladder.VARIANTS`) at its default and --small shape: the rungs, the seed space, the
  configs the ladder's tuned-best search draws with its defaults (--tune 24, --seed 0), and the staging-flipped
  counterpart of each (the ladder times the tuned best with its staging flipped).

`--shapes M,N ... M,N,K ... B,C,H,W,O,K,P ...` replaces the shapes (two numbers: conv1d, three: gemm-tvm, seven:
dwsep-conv2d) and emits the ladder set at each; `--config K=V,...` emits only those configs; `--space NAME` adds
every legal config of a named space (`full`: the whole grid) at the shapes. Illegal configs are skipped with their
reasons. Writes DIR/index.json. `--plan-json FILE` also writes the plan itself (every template, config and shape,
with the reasons of those skipped as illegal), with or without --dry-run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# tests/cuda/test_tvm_cuda_runtime.py (tests/unit/test_tvm_sources.py checks these cover what it compiles)
TEST_CONV1D_SEED_SHAPES = [(16, 16), (700, 16), (1023, 64), (64, 64), (100_003, 64)]
TEST_CONV1D_LARGE = [(1024, 16, 16, "local"), (1024, 2, 64, "shared"), (32, 16, 32, "global"), (512, 8, 4, "shared")]
TEST_CONV1D_LARGE_SHAPE = (50_001, 64)
TEST_CONV1D_TIMED = ({"NT": 128, "TPT": 4, "RK": 8, "STAGE": "local"}, (1 << 20, 64))
TEST_GEMM_SEED_SHAPES = [(64, 64, 16), (256, 192, 48), (1024, 1024, 1024)]
# tests/cuda/test_tvm_cuda_dwsep_runtime.py
TEST_DWSEP_SEED_SHAPES = [(2, 8, 5, 13, 20, 3, 1), (1, 16, 9, 11, 24, 5, 2), (1, 8, 7, 70, 9, 1, 0),
                          (1, 64, 56, 56, 128, 3, 1)]
TEST_DWSEP_TIMED = ({"BW": 32, "TPX": 4, "BO": 32, "TO": 4, "RC": 4, "STAGE": "local"}, (8, 64, 56, 56, 128, 3, 1))
#: the ladder's tuned-best search with `tilewise ladder`'s defaults
LADDER_TUNE_COUNT = 24
LADDER_SEED = 0
PRIMITIVE_OF = {"conv1d": "conv1d-gpu", "gemm-tvm": "gemm-gpu", "dwsep-conv2d": "dwsep-conv2d-gpu"}
DIMS_OF = {"conv1d": 2, "gemm-tvm": 3, "dwsep-conv2d": 7}


def templates() -> dict[str, Any]:
    from tilewise.kernels.conv1d.tvm_cuda import TvmCudaConv1d
    from tilewise.kernels.dwsep_conv2d.tvm_cuda import TvmCudaDwsepConv2d
    from tilewise.kernels.gemm.tvm_cuda import TvmCudaGemm

    return {"conv1d": TvmCudaConv1d(), "gemm-tvm": TvmCudaGemm(), "dwsep-conv2d": TvmCudaDwsepConv2d()}


def ladder_configs(name: str, tpl: Any, shape: tuple[int, ...], limits: Any, count: int = LADDER_TUNE_COUNT,
                   seed: int = LADDER_SEED) -> list[Any]:
    """What the CUDA ladder of this template may compile at `shape`: rungs, seed space, the tuned search's draw,
    and the staging-flipped counterpart of each."""
    from tilewise.ladder import VARIANTS, _search_points

    spec = VARIANTS[(PRIMITIVE_OF[name], "cuda")]
    space = tpl.space("full")
    configs = [spec.rung_config(space, r) for r in spec.rungs]
    configs += list(tpl.space("seed"))
    configs += _search_points(spec, tpl, space, limits, shape, count, seed)
    flips = []
    for c in configs:
        stage = spec.stage_of(c) if spec.stage_of else None
        if spec.restage is not None and stage in ("workgroup", "private"):
            flips.append(spec.restage(c, "private" if stage == "workgroup" else "workgroup"))
    return list(dict.fromkeys(configs + flips))


def default_plan(tpls: dict[str, Any], limits: Any) -> dict[str, list[tuple[Any, tuple[int, ...]]]]:
    """(config, shape) per template: the CUDA tests' and the ladders'."""
    from tilewise.ladder import VARIANTS

    plan: dict[str, list[tuple[Any, tuple[int, ...]]]] = {}
    conv, gemm = tpls["conv1d"], tpls["gemm-tvm"]
    full = conv.space("full")
    items = [(c, s) for s in TEST_CONV1D_SEED_SHAPES for c in conv.space("seed")]
    items += [(full.config(dict(zip(("NT", "TPT", "RK", "STAGE"), v))), TEST_CONV1D_LARGE_SHAPE)
              for v in TEST_CONV1D_LARGE]
    items += [(full.config(TEST_CONV1D_TIMED[0]), TEST_CONV1D_TIMED[1])]
    plan["conv1d"] = items
    plan["gemm-tvm"] = [(c, s) for s in TEST_GEMM_SEED_SHAPES for c in gemm.space("seed")]
    dwsep = tpls["dwsep-conv2d"]
    plan["dwsep-conv2d"] = [(c, s) for s in TEST_DWSEP_SEED_SHAPES for c in dwsep.space("seed")]
    plan["dwsep-conv2d"] += [(dwsep.space("full").config(TEST_DWSEP_TIMED[0]), TEST_DWSEP_TIMED[1])]
    for name, tpl in tpls.items():
        spec = VARIANTS[(PRIMITIVE_OF[name], "cuda")]
        for shape in (spec.shape, spec.small_shape):
            plan[name] += [(c, tuple(shape)) for c in ladder_configs(name, tpl, tuple(shape), limits)]
    return plan


def parse_shapes(texts: Sequence[str]) -> list[tuple[int, ...]]:
    shapes = []
    for text in texts:
        try:
            shape = tuple(int(p) for p in text.split(","))
        except ValueError:
            raise SystemExit(f"--shapes: {text!r} is not integers M,N or M,N,K or B,C,H,W,O,K,P (e.g. 16384,64)"
                             ) from None
        if len(shape) not in (2, 3, 7) or min(shape[:6]) < 1 or shape[-1] < 0:
            raise SystemExit(f"--shapes: {text!r} must be M,N (conv1d), M,N,K (gemm-tvm) or B,C,H,W,O,K,P "
                             "(dwsep-conv2d), positive (P >= 0)")
        shapes.append(shape)
    return shapes


def custom_plan(tpls: dict[str, Any], limits: Any, shapes: list[tuple[int, ...]], configs: Sequence[str],
                spaces: Sequence[str]) -> dict[str, list[tuple[Any, tuple[int, ...]]]]:
    """(config, shape) per template for --shapes: the --config list, or the ladder set plus any --space."""
    plan: dict[str, list[tuple[Any, tuple[int, ...]]]] = {name: [] for name in tpls}
    for name, tpl in tpls.items():
        for shape in (s for s in shapes if len(s) == DIMS_OF[name]):
            if configs:
                plan[name] += [(tpl.space("full").parse(text), shape) for text in configs]
                continue
            plan[name] += [(c, shape) for c in ladder_configs(name, tpl, shape, limits)]
            for space in spaces:
                plan[name] += [(c, shape) for c in tpl.space(space)]
    return plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90", help="CUDA architecture to emit for (default sm_90)")
    ap.add_argument("--out", required=True, help="the source store directory (TILEWISE_TVM_CUDA_SOURCES there)")
    ap.add_argument("--shapes", nargs="+", metavar="SHAPE", help="M,N (conv1d), M,N,K (gemm-tvm) and/or "
                                                                 "B,C,H,W,O,K,P (dwsep-conv2d) instead of the tests' "
                                                                 "and ladders' shapes")
    ap.add_argument("--template", action="append", choices=("conv1d", "gemm-tvm", "dwsep-conv2d"),
                    help="only this template (repeatable)")
    ap.add_argument("--config", action="append", default=[], metavar="K=V,...",
                    help="only this config (repeatable; needs --shapes and one --template)")
    ap.add_argument("--space", action="append", default=[], choices=("seed", "full", "small"),
                    help="with --shapes: also every legal config of this space (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="list the counts, emit nothing")
    ap.add_argument("--plan-json", metavar="FILE", help="write the plan (template, config, shape, skip reasons) here")
    args = ap.parse_args(argv)

    from tilewise.devices.profiles import PROFILES
    from tilewise.errors import TilewiseError
    from tilewise.kernels.tvm import sources as tvm_sources

    if args.config and (not args.shapes or not args.template or len(args.template) != 1):
        raise SystemExit("--config needs --shapes and exactly one --template")
    if args.space and not args.shapes:
        raise SystemExit("--space needs --shapes")
    version = tvm_sources.tvm_version()
    if version is None and not args.dry_run:
        raise SystemExit("Apache TVM is not importable here: run this where it is (pip install 'tilewise[tvm]')")
    limits = PROFILES.get(args.arch)
    if limits is None:
        print(f"note: no limits profile for {args.arch}; rules that need device limits are not checked",
              file=sys.stderr)
    tpls = {k: v for k, v in templates().items() if not args.template or k in args.template}
    if args.shapes:
        plan = custom_plan(tpls, limits, parse_shapes(args.shapes), args.config, args.space)
    else:
        plan = {k: v for k, v in default_plan(templates(), limits).items() if k in tpls}
    out = Path(args.out)
    print(f"emitting for {args.arch} with TVM {version} into {out}", flush=True)
    t_all = time.perf_counter()
    total = {"sources": 0, "written": 0, "skipped": 0, "failed": 0}
    planned: list[dict[str, Any]] = []
    for name, items in plan.items():
        tpl = tpls[name]
        space = tpl.space("full")
        t0 = time.perf_counter()
        counts = dict.fromkeys(total, 0)
        shapes = set()
        for cfg, shape in dict.fromkeys(items):
            why = space.why_illegal(cfg, limits) + tpl.shape_problems(cfg, shape)
            planned.append({"template": name, "config": dict(cfg), "shape": list(shape), "skip": why})
            if why:
                counts["skipped"] += 1
                print(f"  skip {name} {cfg.key()} at {','.join(map(str, shape))}: {'; '.join(why)}", flush=True)
                continue
            shapes.add(shape)
            counts["sources"] += 1
            if args.dry_run:
                continue
            key = tvm_sources.SourceKey.make(name, cfg, shape, args.arch)
            try:
                _, changed = tvm_sources.write(out, key, tpl.emit_tvm(cfg, shape, args.arch), version)
            except TilewiseError as exc:
                counts["failed"] += 1
                print(f"  FAILED {key.describe()}: {exc.problem}", flush=True)
                continue
            counts["written"] += int(changed)
        for k in total:
            total[k] += counts[k]
        print(f"{name}: {counts['sources']} sources at {len(shapes)} shapes ({counts['written']} written, "
              f"{counts['sources'] - counts['written'] - counts['failed']} already stored), {counts['skipped']} "
              f"illegal skipped, {counts['failed']} failed, {time.perf_counter() - t0:.1f} s", flush=True)
    if args.plan_json:
        Path(args.plan_json).write_text(json.dumps({"arch": args.arch, "sources": planned}, indent=1))
        print(f"wrote the plan of {len(planned)} sources to {args.plan_json}")
    if not args.dry_run and out.is_dir():
        index = tvm_sources.write_index(out)
        size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
        print(f"wrote {index}: {sum(1 for _ in out.glob('*.cu'))} sources in the store, {size / 1e6:.2f} MB")
    print(f"total: {total['sources']} sources ({total['written']} written), {total['skipped']} illegal skipped, "
          f"{total['failed']} failed, {time.perf_counter() - t_all:.1f} s")
    return 1 if total["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
