"""The generated wgmma instructions: the checked-in `matmul_wgmma_ops.cu` is what `cuda_wgmma_ops.py` generates,
with a function for every n size the wgmma kinds' spaces offer, each with its n / 2 accumulators and its operands
in order."""

from __future__ import annotations

import re

from tilewise.kernels.matmul import cuda as mm
from tilewise.kernels.matmul import cuda_wgmma_ops as ops


def test_the_checked_in_file_is_the_generated_one():
    assert ops.PATH.read_text() == ops.source(), "regenerate: python -m tilewise.kernels.matmul.cuda_wgmma_ops"


def test_every_tile_width_of_the_spaces_has_its_wgmma_with_n_over_2_accumulators():
    text = ops.source()
    assert set(mm.WG_VALUES["BN"]) <= set(ops.WGMMA_SS_NS) and set(mm.WS_VALUES["BN"]) <= set(ops.WGMMA_SS_NS)
    assert set(mm.WGR_VALUES["BT"]) <= set(ops.WGMMA_RS_NS)
    for n, name, rest, call in [
        *((n, f"wgmma_n{n}", f"}}, %{n // 2}, %{n // 2 + 1}, 1, 1, 1, 0, 0;", f"wgmma_n{n}(d, da, db)")
          for n in ops.WGMMA_SS_NS),
        *((n, f"wgmma_rs_n{n}", f"}}, {{%{n // 2}, %{n // 2 + 1}, %{n // 2 + 2}, %{n // 2 + 3}}}, %{n // 2 + 4}, "
           "1, 1, 1, 0;", f"wgmma_rs_n{n}(d, a, db)") for n in ops.WGMMA_RS_NS)]:
        fn = re.search(rf"void {name}\(.*?\n}}\n", text, re.S)
        assert fn, name
        body = fn.group(0)
        assert f"m64n{n}k16.f32.f16.f16" in body and body.count('"+f"') == n // 2, name
        assert f"%{n // 2 - 1}{rest}" in body, name  # the accumulators, then A (descriptor or registers), B
        assert f"constexpr (N == {n}) {call}" in text, name
