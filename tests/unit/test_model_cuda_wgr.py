"""The wgr kind's generated register-A wgmma functions: the checked-in `matmul_wgr_ops.cu` is what `cuda_wgr_ops.py`
generates, with one function per token tile the space offers, each with its n / 2 accumulators."""

from __future__ import annotations

import re

from tilewise.kernels.matmul import cuda as mm
from tilewise.kernels.matmul import cuda_wgr_ops as wgr_ops


def test_the_checked_in_file_is_the_generated_one():
    assert wgr_ops.PATH.read_text() == wgr_ops.source(), "regenerate: python -m tilewise.kernels.matmul.cuda_wgr_ops"


def test_every_token_tile_of_the_space_has_its_wgmma_with_n_over_2_accumulators():
    text = wgr_ops.source()
    assert set(mm.WGR_VALUES["BT"]) <= set(wgr_ops.WGR_NS)
    for n in wgr_ops.WGR_NS:
        fn = re.search(rf"void wgmma_rs_n{n}\(.*?\n}}\n", text, re.S)
        assert fn, n
        body = fn.group(0)
        assert f"m64n{n}k16.f32.f16.f16" in body
        assert body.count('"+f"') == n // 2
        # the A fragment follows the accumulators, then the descriptor
        assert f"{{%{n // 2}, %{n // 2 + 1}, %{n // 2 + 2}, %{n // 2 + 3}}}, %{n // 2 + 4}," in body
        assert f"constexpr (N == {n}) wgmma_rs_n{n}(d, a, db)" in text
