"""Where the wgmma matmul kinds' time goes (experiment): their machine code and a hardware profile of one launch,
beside cuBLAS f16 on the same shape.

    python3 experiments/cuda_wg_profile.py sass --out OUT [--kind wgr]  # nvcc + cuobjdump: the configs' SASS
    python3 experiments/cuda_wg_profile.py launch --which wg:conv.in_proj [--repeat 5]   # the launches to profile
    ncu --kernel-name regex:nf4_mm_wg --launch-skip 2 --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats --section SchedulerStats --section Occupancy \
        python3 experiments/cuda_wg_profile.py launch --which wg:conv.in_proj

`sass` writes each config's SASS and a count of its key instructions (HGMMA, the warpgroup waits, barriers,
cp.async, shared loads and stores) per config into OUT/sass-summary.json. `launch` runs one matmul of the
lfm2-350m shapes at 346 rows on the winning `wg` or `wgr` configs of their records (or cuBLAS f16 through CuPy
with `--which cublas:SHAPE`) a few times, checking the output against float64 once.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tilewise.kernels.cudasrc import MODEL_HEADERS
from tilewise.kernels.matmul import cuda as mm

# shape (M, N, K), epilogue, norm and the config that won it (bench/results/2026-12-01-h200-cuda-wgmma, call P)
CASES = {
    "ffn.gate_up": ((346, 4608, 1024), "swiglu", True, {"BM": 128, "BN": 128, "MT": 1, "ST": 4, "KS": 1, "MB": 1}),
    "conv.in_proj": ((346, 3072, 1024), "none", True, {"BM": 192, "BN": 64, "MT": 1, "ST": 4, "KS": 1, "MB": 1}),
    "ffn.down": ((346, 1024, 4608), "residual", False, {"BM": 192, "BN": 64, "MT": 1, "ST": 4, "KS": 4, "MB": 1}),
    "attn.qkv": ((346, 2048, 1024), "none", True, {"BM": 128, "BN": 64, "MT": 1, "ST": 4, "KS": 1, "MB": 2}),
}
# the wgr kind's winners (bench/results/2026-12-03-h200-wgr, call 3)
WGR = {"ffn.gate_up": {"BF": 128, "BT": 120, "ST": 4, "KS": 1, "MB": 1},
       "conv.in_proj": {"BF": 64, "BT": 176, "ST": 4, "KS": 1, "MB": 1},
       "ffn.down": {"BF": 64, "BT": 88, "ST": 6, "KS": 4, "MB": 2},
       "attn.qkv": {"BF": 64, "BT": 176, "ST": 4, "KS": 1, "MB": 1}}
SIG = ("(const unsigned short *, const unsigned *, const float *, const unsigned *, const float *, float *, int, "
       "int, int)")
COUNT = ("HGMMA", "WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR", "BAR.SYNC", "LDGSTS", "LDGDEPBAR", "DEPBAR", "LDS",
         "STS", "LDG", "FMUL", "F2FP", "PRMT", "LOP3", "HMUL2")


def case(kind: str, name: str) -> tuple[mm.CudaMatmul, object]:
    """The template and winning config of one shape for the wg or wgr kind (`wgr1`: wgr with DEC 1, the register
    code table)."""
    _, epi, norm, cfg = CASES[name]
    tpl = mm.CudaMatmul("wgr" if kind.startswith("wgr") else kind, "nf4", epi, norm)
    return tpl, tpl.config_of({**WGR[name], "DEC": int(kind == "wgr1"), "SR": 0} if kind.startswith("wgr") else cfg)


def sass(out: Path, kind: str = "wg") -> None:
    out.mkdir(parents=True, exist_ok=True)
    src = Path(mm.__file__).parent
    entries = {name: case(kind, name)[0].entry(case(kind, name)[1]) for name in CASES}
    heads = [src.parent / h for h in MODEL_HEADERS]  # the model sources' headers first (cudasrc.model_source)
    body = "".join(f'#include "{p}"\n' for p in [*heads, *(src / f for f in mm.SOURCE_FILES)])
    sig = SIG[:-1] + ", const __grid_constant__ TmaMap, float *, unsigned *)" if kind.startswith("wgr") else SIG
    body += "".join(f"template __global__ void {e}{sig};\n" for e in sorted(set(entries.values())))
    (out / "wg.cu").write_text(body)
    arch = "-gencode=arch=compute_90a,code=sm_90a"
    r = subprocess.run(["nvcc", "-std=c++17", arch, "-cubin", "-Xptxas", "-v", "-o", str(out / "wg.cubin"),
                        str(out / "wg.cu")], capture_output=True, text=True)
    (out / "ptxas.txt").write_text(r.stderr)
    if r.returncode:
        sys.exit(r.stderr[-3000:])
    tool = shutil.which("cuobjdump")
    if tool is None:
        sys.exit("cuobjdump (CUDA toolkit) not found: the cubin and ptxas log are in " + str(out))
    dump = subprocess.run([tool, "-sass", str(out / "wg.cubin")], capture_output=True, text=True).stdout
    (out / "wg.sass").write_text(dump)
    summary = {}
    for block in dump.split("Function : ")[1:]:
        name = block.split("\n", 1)[0].strip()
        ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", block)
        summary[name] = {k: sum(1 for o in ops if o == k or o.startswith(k + ".")) for k in COUNT}
        summary[name]["instructions"] = len(ops)
    (out / "sass-summary.json").write_text(json.dumps({"entries": entries, "summary": summary}, indent=1))
    for name, s in summary.items():
        print(name[:60], s)


def launch(which: str, repeat: int) -> None:
    import numpy as np

    from tilewise.devices import get_device
    from tilewise.tune.verify import compare

    kind, name = which.split(":")
    shape, epi, _, _ = CASES[name]
    dev = get_device("cuda")
    if kind == "cublas":
        import cupy as cp

        m, n, k = shape
        sets = 2 if epi == "swiglu" else 1
        x = cp.random.standard_normal((m, k), dtype=cp.float32).astype(cp.float16)
        w = cp.random.standard_normal((n * sets, k), dtype=cp.float32).astype(cp.float16)
        for _ in range(repeat):
            y = x @ w.T
        cp.cuda.Device().synchronize()
        print("cublas", name, y.shape)
        return
    tpl, config = case(kind, name)
    host = tpl.make_inputs(shape, np.random.default_rng(0))
    bufs = tpl.upload(dev, host, shape)
    prog = tpl.compile(dev, config, shape)
    launches = tpl.launches(prog, bufs, config, shape)
    for i in range(repeat):
        tpl.poison(dev, bufs, shape)
        dev.run(launches)
        dev.synchronize()
        if i == 0:
            chk = compare(tpl.read_output(dev, bufs, shape), tpl.reference(host, shape), tpl.dtype)
            print(name, tpl.describe(config), "ok" if chk.ok else "WRONG", chk.message)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sass")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--kind", default="wg", choices=["wg", "wgr", "wgr1"])
    la = sub.add_parser("launch")
    la.add_argument("--which", default="wg:conv.in_proj",
                    help="wg:SHAPE, wgr:SHAPE, wgr1:SHAPE (DEC 1) or cublas:SHAPE, SHAPE one of CASES")
    la.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if args.cmd == "sass":
        sass(args.out, args.kind)
    else:
        launch(args.which, args.repeat)


if __name__ == "__main__":
    main()
