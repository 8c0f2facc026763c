"""Large WGSL GEMM shapes are verified at a small shape that still exercises every edge guard."""

import pytest

from tilewise.devices.profiles import get_profile
from tilewise.kernels.gemm.webgpu import VERIFY_SHAPE, WgslGemm


@pytest.fixture(scope="module")
def tpl():
    return WgslGemm()


def test_big_shapes_verify_small_with_partial_tiles(tpl):
    limits = get_profile("h200-vulkan")
    configs = tpl.space("large").sample(200, seed=3, limits=limits) + tpl.space("seed").legal(limits)
    assert len(configs) > 50
    M, N, K = VERIFY_SHAPE
    for c in configs:
        assert tpl.verify_shape(c, (4096, 4096, 4096)) == VERIFY_SHAPE
        assert M % c["BM"] and N % c["BN"], c
        assert c["BM"] < M and c["BN"] < N and c["BK"] < K, c
        assert K % c["BK"] or c["BK"] == 4, c


def test_small_shapes_verify_as_they_are(tpl):
    c = tpl.default_config()
    assert tpl.verify_shape(c, (96, 128, 64)) == (96, 128, 64)
