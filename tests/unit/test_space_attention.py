"""The attention kernel's space: the key-split parameter KT and the rules that guard it."""

from __future__ import annotations

from tilewise.devices.profiles import PROFILES
from tilewise.kernels.attention.webgpu import attention_source, attention_space, attention_storage_bytes

LIMITS = PROFILES["h200-vulkan"]


def test_every_grid_point_is_judged_and_the_reasons_carry_numbers():
    space = attention_space(64)
    legal = [c for c in space if space.is_legal(c, LIMITS)]
    assert {c.KT for c in legal} == {1, 2, 4, 8}
    assert {c.LZ for c in legal} == {0, 1}
    for c in space:
        why = space.why_illegal(c, LIMITS)
        assert bool(why) == (c.BQ * c.KT > 1024 or c.KT > c.BKV or attention_storage_bytes(c, 64) > 49152)
    why = space.why_illegal(space.config(BQ=128, BKV=64, KT=2, LZ=0), LIMITS)
    assert why == ["workgroup_storage: K and V tiles (2*BKV*D*4) plus the KT-slice merge (BQ*D*4 + 2*BQ*KT*4) = "
                   "67584 bytes > max_workgroup_storage_bytes 49152"]
    assert space.why_illegal(space.config(BQ=16, BKV=8, KT=8, LZ=1), LIMITS) == []
    assert space.why_illegal(space.config(BQ=128, BKV=8, KT=8, LZ=0), LIMITS) == []  # 1024 threads: the limit itself
    assert space.why_illegal(space.config(BQ=16, BKV=8, KT=8, LZ=1).replace(KT=16), LIMITS) == [
        "slices_fill_tile: KT=16 key slices > BKV=8 keys per tile: some threads would never see a key"]


def test_one_thread_per_query_has_no_merge_and_the_split_has_one():
    one = attention_source({"BQ": 32, "BKV": 16}, 16, 8, 64)
    assert attention_source({"BQ": 32, "BKV": 16, "KT": 1}, 16, 8, 64) == one
    assert "Ms" not in one and "@workgroup_size(32)" in one
    assert attention_source({"BQ": 32, "BKV": 16, "KT": 1, "LZ": 0}, 16, 8, 64) == one
    lazy = attention_source({"BQ": 32, "BKV": 16, "LZ": 1}, 16, 8, 64)
    assert lazy != one and "if (s > mx)" in lazy and "if (s > mx)" not in one
    split = attention_source({"BQ": 32, "BKV": 16, "KT": 4}, 16, 8, 64)
    assert "@workgroup_size(128)" in split and "var<workgroup> Os" in split
