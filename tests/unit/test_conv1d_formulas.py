"""The WGSL and TVM-CUDA conv1d templates share one register and shared-memory formula, keyed by scope name."""

import itertools

from tilewise.kernels.conv1d import tiling, tvm_cuda
from tilewise.kernels.space import Config


def _cfg(stage, nt=64, tpt=4, rk=8):
    return Config((("NT", nt), ("TPT", tpt), ("RK", rk), ("STAGE", stage)))


def test_scopes_map_between_wgsl_and_cuda():
    for nt, tpt, rk in itertools.product([32, 256], [1, 8], [1, 16]):
        window = tpt + (tpt + rk - 1) + rk
        smem = 4 * (nt * tpt + 2 * rk - 1)
        assert tiling.registers(_cfg("private", nt, tpt, rk)) == window
        assert tvm_cuda.registers(_cfg("local", nt, tpt, rk)) == window
        assert tiling.storage_bytes(_cfg("workgroup", nt, tpt, rk)) == smem
        assert tvm_cuda.shared_bytes(_cfg("shared", nt, tpt, rk)) == smem
        # a scope name of the other language stages nothing here
        assert tvm_cuda.registers(_cfg("private", nt, tpt, rk)) == tpt
        assert tvm_cuda.shared_bytes(_cfg("workgroup", nt, tpt, rk)) == 0
        assert tiling.storage_bytes(_cfg("global", nt, tpt, rk)) == 0
