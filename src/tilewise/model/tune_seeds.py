"""The hand-picked configs `tilewise tune model` measures beside a random sample: the FMA kernels' tiled and split-K
seeds, the short-row ones, and tiles whose row count is fitted to a decision's length."""

from __future__ import annotations

import math
from typing import Any

# hand-picked starting points (big per-thread tiles), measured next to a random sample of the space; illegal ones
# (e.g. 8x8 paired with F16A: 192 accumulator registers, or a prefetch needing more than 32 registers) drop out.
# Keys left out take PF=0 and CL="block". docs/journal/webgpu-runtime.md says which runs chose them.
_TILE = ("BM", "BN", "BK", "TM", "TN")
# the tiles measured since the first runtime (no prefetch, block columns)
_SEED_TILED_BASE = [dict(zip(_TILE, v)) for v in (
    (64, 64, 16, 8, 8), (128, 64, 16, 8, 8), (128, 128, 8, 8, 8), (64, 64, 8, 8, 8), (64, 32, 16, 4, 4),
    (32, 64, 16, 4, 4), (128, 64, 8, 8, 4), (64, 128, 8, 4, 8), (64, 64, 16, 4, 8), (128, 64, 16, 8, 4),
    (32, 32, 16, 4, 4), (64, 64, 32, 4, 4), (32, 64, 16, 2, 4), (16, 64, 16, 1, 4), (32, 128, 16, 2, 8))]
# register prefetch + strided columns (bank-conflict-free vec4 reads; TN=4 has one vec4, so block) on the big
# per-thread tiles: 8x8 / 4x8 / 8x4 on 64/128-row x 64/128-column tiles, K steps of 16 and 32 (8x8 on 64 columns
# with K step 32 is left out: its activation prefetch alone is 32 registers)
_SEED_TILED_PF = [
    {"BM": bm, "BN": bn, "BK": bk, "TM": tm, "TN": tn, "PF": 1, "CL": "strided" if tn >= 8 else "block"}
    for tm, tn in ((8, 8), (4, 8), (8, 4)) for bm in (64, 128) for bn in (64, 128) for bk in (16, 32)
    if not (tm * tn == 64 and bn == 64 and bk == 32)]
# each change alone on the 64x64 8x8 tile, to tell the two apart
_SEED_TILED_ONE = [{"BM": 64, "BN": 64, "BK": 16, "TM": 8, "TN": 8, "CL": "strided"},
                   {"BM": 64, "BN": 64, "BK": 16, "TM": 8, "TN": 8, "PF": 1}]
# 192 columns fill a large GPU in whole waves for the gate/up pair at a prefix-cached decision's rows
_SEED_TILED_WIDE = [{"BM": 64, "BN": 192, "BK": 16, "TM": 8, "TN": 4, "PF": 1}]
# no double-buffered (DB=1) seeds: as seeds they lost at every shape and row count measured and made tuning longer;
# the random sample still draws DB=1 configs
# the K step's loop unrolled (UK=1, see SEED_SPLITK) on the tiles where it helped the gate/up pair
_SEED_TILED_UK = [{"BM": 128, "BN": 128, "BK": 32, "TM": 8, "TN": 4, "PF": 1, "UK": 1},
                  {"BM": 128, "BN": 128, "BK": 32, "TM": 4, "TN": 8, "PF": 1, "CL": "strided", "UK": 1}]
SEED_TILED: tuple[dict[str, Any], ...] = (*_SEED_TILED_BASE, *_SEED_TILED_PF, *_SEED_TILED_ONE, *_SEED_TILED_WIDE,
                                          *_SEED_TILED_UK)
# split-K: the tiles that did best unsplit, cut into 2 or 4 slices of K; then the big per-thread tiles with
# prefetch and strided columns
_SPLIT = (*_TILE, "KS")
# split-K with prefetch and strided columns on the big per-thread tiles
_SPLITK_PF = [dict(zip(_SPLIT, v), PF=1, CL="strided" if v[4] >= 8 else "block") for v in (
    (64, 64, 16, 8, 8, 2), (64, 64, 16, 8, 8, 4), (64, 64, 16, 4, 8, 4), (64, 64, 16, 8, 4, 4),
    (128, 64, 16, 8, 8, 4), (64, 128, 16, 8, 8, 4), (128, 128, 16, 8, 8, 8), (64, 64, 32, 4, 8, 4),
    # eight K slices of a 64x128 tile: more workgroups for the narrow 1024-column outputs
    (64, 128, 32, 8, 8, 8), (64, 64, 32, 8, 4, 4))]
# UK=1 (the K step's loop unrolled in the source) helps most split-K tiles and a few tiled ones and hurts others,
# so each prefetching split-K seed is offered both ways, the tiled seeds only on the tiles where it can win.
SEED_SPLITK: tuple[dict[str, Any], ...] = (*(dict(zip(_SPLIT, v)) for v in (
    (64, 64, 16, 4, 4, 2), (64, 64, 16, 4, 4, 4), (64, 64, 32, 4, 4, 2), (64, 64, 32, 4, 4, 4),
    (64, 64, 16, 8, 8, 4), (128, 64, 16, 8, 4, 4), (32, 64, 16, 4, 4, 2), (64, 32, 16, 4, 4, 4))),
    *_SPLITK_PF, *({**v, "UK": 1} for v in _SPLITK_PF))
# tiles whose row count splits the decision's rows into a few blocks with little padding (346 rows: 2 x 176,
# 3 x 120, 4 x 88 instead of 3 x 128 = 384), with column counts that fill the GPU in whole waves (seed 001: padding
# decides speed-ups at one length). `fitted_seeds(seq, kind)` sizes them.
_FIT_TILED = (  # (row blocks, BN, BK, TM, TN, UK)
    (2, 72, 32, 4, 8, 0), (2, 72, 32, 8, 4, 0), (3, 128, 16, 4, 8, 0), (3, 128, 32, 8, 4, 1))
_FIT_SPLITK = (  # (row blocks, BN, BK, TM, TN, KS, UK)
    (2, 128, 16, 8, 8, 8, 0), (4, 128, 16, 4, 8, 8, 0), (2, 128, 16, 8, 8, 8, 1), (4, 128, 16, 4, 8, 8, 1))


def fitted_rows(seq: int, blocks: int) -> int:
    """The row tile (a multiple of 8) that covers `seq` rows in `blocks` blocks: 346 -> 176 (2), 120 (3), 88 (4)."""
    return 8 * math.ceil(seq / blocks / 8)


def fitted_seeds(seq: int, kind: str) -> list[dict[str, Any]]:
    """Hand-picked tiled / split-K seeds whose row tile is fitted to a `seq`-row decision (prefetch on)."""
    if kind == "tiled":
        return [{"BM": fitted_rows(seq, j), "BN": bn, "BK": bk, "TM": tm, "TN": tn, "PF": 1, "UK": uk,
                 "CL": "strided" if tn >= 8 else "block"} for j, bn, bk, tm, tn, uk in _FIT_TILED]
    return [{"BM": fitted_rows(seq, j), "BN": bn, "BK": bk, "TM": tm, "TN": tn, "KS": ks, "PF": 1, "UK": uk,
             "CL": "strided" if tn >= 8 else "block"} for j, bn, bk, tm, tn, ks, uk in _FIT_SPLITK]


SEED_ROWS = ((128, 4, 1, 8), (256, 8, 1, 16), (64, 2, 4, 8), (128, 2, 8, 8), (256, 4, 4, 16), (128, 1, 8, 32),
             (256, 2, 2, 32), (64, 1, 4, 16))
