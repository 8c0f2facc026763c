"""The wgmma matmul kinds (wg, or ws with its producer warpgroup) outside the test suite: f16 and nf4 weights,
tiles of 64 to 384 rows, each output against float64, and for f16 weights at one tile a one-hot x that shows which
W element each output took (for a layout bug).

    PYTHONPATH=src python3 experiments/cuda_wg_diag.py [wg|ws]
"""
import argparse
import sys

import numpy as np

from tilewise.devices import get_device
from tilewise.kernels.matmul import cuda as mm
from tilewise.tune.verify import compare


def run(dev, rng, tpl, cfg, shape, host=None):
    host = host or tpl.make_inputs(shape, rng)
    bufs = tpl.upload(dev, host, shape)
    tpl.poison(dev, bufs, shape)
    prog = tpl.compile(dev, cfg, shape)
    print("  compiled", prog.meta.get("registers"), "regs", prog.meta.get("local_bytes"), "local bytes", flush=True)
    dev.run(tpl.launches(prog, bufs, cfg, shape))
    dev.synchronize()
    return host, tpl.read_output(dev, bufs, shape), tpl.reference(host, shape)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", nargs="?", default="wg", choices=("wg", "ws"), help="the wgmma kind to check")
    kind = ap.parse_args().kind
    dev = get_device("cuda")
    rng = np.random.default_rng(0)
    ok_all = True
    for fmt, cfgd, shape in [("f16", {"BM": 64, "BN": 64, "MT": 1, "ST": 4, "KS": 1, "MB": 1}, (64, 64, 64)),
                             ("f16", {"BM": 384, "BN": 64, "MT": 2, "ST": 4, "KS": 1, "MB": 1}, (346, 1056, 1024)),
                             ("nf4", {"BM": 64, "BN": 64, "MT": 1, "ST": 4, "KS": 1, "MB": 1}, (64, 64, 128)),
                             ("nf4", {"BM": 384, "BN": 64, "MT": 2, "ST": 4, "KS": 1, "MB": 1}, (346, 1056, 1024)),
                             ("nf4", {"BM": 192, "BN": 64, "MT": 1, "ST": 4, "KS": 2, "MB": 1}, (346, 1056, 1024))]:
        tpl = mm.CudaMatmul(kind, fmt, "none", False)
        cfg = tpl.config_of(cfgd)
        print(fmt, cfgd, shape, flush=True)
        try:
            host, out, ref = run(dev, rng, tpl, cfg, shape)
        except Exception as exc:
            print("  FAILED to run:", type(exc).__name__, str(exc)[:800])
            ok_all = False
            continue
        chk = compare(out, ref, tpl.dtype)
        print("  ok" if chk.ok else "  WRONG", chk.message[:300], flush=True)
        if not chk.ok:
            ok_all = False
            err = np.abs(out - ref)
            m, n = ref.shape
            bm = err[: m // 8 * 8, : n // 8 * 8].reshape(m // 8, 8, n // 8, 8).max(axis=(1, 3))
            np.set_printoptions(linewidth=250, precision=2, suppress=True)
            print("  max |err| per 8x8 block (first 16x16 blocks):\n", bm[:16, :16])
            print("  out[0:4,0:8]\n", out[:4, :8], "\n  ref[0:4,0:8]\n", ref[:4, :8])
            print("  zero outputs:", int((out == 0).sum()), "nan:", int(np.isnan(out).sum()))
            if fmt == "f16" and shape[2] == 64:
                # one-hot x: out[i, n] = W[n, i % 64]; find which W entry each output took
                k = shape[2]
                x = np.zeros((shape[0], k), np.float32)
                x[np.arange(shape[0]), np.arange(shape[0]) % k] = 1.0
                host2 = dict(host)
                host2["x"] = x
                _, out2, ref2 = run(dev, rng, tpl, cfg, shape, host2)
                W = ref2.T  # (N, K) via the reference: ref2[i, n] = W[n, i]
                wvals = {}
                for nn in range(shape[1]):
                    for kk in range(k):
                        wvals.setdefault(round(float(W[nn, kk]), 4), (nn, kk))
                for i, j in [(0, 0), (0, 1), (0, 2), (0, 8), (1, 0), (8, 0), (16, 0), (0, 16), (15, 7), (63, 63)]:
                    v = round(float(out2[i, j]), 4)
                    print(f"  out[{i},{j}] = {v} <- W{wvals.get(v)} (want W({j},{i}))")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
