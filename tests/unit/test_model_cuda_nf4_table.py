"""wgr's DEC 1 code table (`nf4_table` in matmul_wgr_decode.cu) is written as literal words: read back through the
byte permutes `nf4_lookup4` makes of them, every nibble gives nf4's code rounded to f16 (the rounding `f16_bits`,
cvt.rn, gives), bit for bit. No nvcc needed: the words are parsed from the source."""

from __future__ import annotations

import re
from importlib import resources

import numpy as np

from tilewise.quant.nf4 import NF4_CODES


def table_words() -> tuple[list[int], list[int]]:
    text = (resources.files("tilewise.kernels.matmul") / "matmul_wgr_decode.cu").read_text()
    body = re.search(r"Nf4Table nf4_table\(\) \{\n  return Nf4Table\{(.*?)\};\n\}", text, re.S)
    assert body, "nf4_table() is no longer one return of literal words: update this test with it"
    groups = re.findall(r"\{([^{}]*)\}", body.group(1))
    lo, hi = ([int(w.strip().rstrip("u"), 16) for w in g.split(",")] for g in groups)
    assert len(lo) == len(hi) == 4
    return lo, hi


def prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32's default mode, for selector nibbles 0..7 (no sign replication): byte j of the result is byte
    sel_j of the 8 bytes b:a."""
    pool = (b << 32 | a).to_bytes(8, "little")
    return int.from_bytes(bytes(pool[(sel >> (4 * j)) & 7] for j in range(4)), "little")


def test_every_nibble_reads_back_nf4s_code_in_f16():
    lo, hi = table_words()
    want = NF4_CODES.astype(np.float16).view(np.uint16)
    rng = np.random.default_rng()
    for nibbles in [list(range(16)), *rng.integers(0, 16, (64, 4)).tolist()]:
        for i in range(0, len(nibbles), 4):
            quad = nibbles[i:i + 4]
            sel = sum((n & 7) << (4 * j) for j, n in enumerate(quad))
            m = sum((0xFF if n >= 8 else 0) << (8 * j) for j, n in enumerate(quad))
            lo_b = (prmt(lo[0], lo[1], sel) & ~m) | (prmt(lo[2], lo[3], sel) & m)  # as nf4_lookup4
            hi_b = (prmt(hi[0], hi[1], sel) & ~m) | (prmt(hi[2], hi[3], sel) & m)
            got = [((hi_b >> (8 * j)) & 0xFF) << 8 | ((lo_b >> (8 * j)) & 0xFF) for j in range(len(quad))]
            assert got == [int(want[n]) for n in quad], quad
