"""NF4: codes, nearest-code rounding, packing, blocks, double quantization, and bitsandbytes agreement."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tilewise.errors import ConfigError
from tilewise.quant import nf4

DESIGN_CODES = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0]


def test_codes_are_the_bitsandbytes_table():
    assert nf4.NF4_CODES.dtype == np.float32
    np.testing.assert_array_equal(nf4.NF4_CODES, np.array(DESIGN_CODES, np.float32))


def _brute_force(w: np.ndarray, blocksize: int) -> tuple[np.ndarray, np.ndarray]:
    """Independent formula: per block absmax, nearest code (lower on ties) of w * (1/absmax)."""
    flat = w.astype(np.float32).reshape(-1)
    q = np.empty(flat.size, np.uint8)
    absmax = []
    for s in range(0, flat.size, blocksize):
        blk = flat[s : s + blocksize]
        am = np.float32(np.abs(blk).max())
        absmax.append(am)
        scaled = blk * (np.float32(1) / am) if blk.size == blocksize else blk / am
        d = np.abs(scaled[:, None].astype(np.float64) - nf4.NF4_CODES[None, :].astype(np.float64))
        q[s : s + blk.size] = d.argmin(axis=1)
    return q, np.array(absmax, np.float32)


@pytest.mark.parametrize("shape,blocksize", [((16, 128), 64), ((7, 33), 32), ((3, 1000), 128), ((4096 + 10,), 4096),
                                             ((5,), 64)])
def test_quantize_picks_nearest_code_per_block(rng, shape, blocksize):
    w = (rng.standard_normal(shape) * rng.uniform(0.01, 3)).astype(np.float32)
    t = nf4.quantize_nf4(w, blocksize)
    q, absmax = _brute_force(w, blocksize)
    np.testing.assert_array_equal(t.absmax, absmax)
    np.testing.assert_array_equal(t.codes(), q)
    # dequantization is the formula code[q] * absmax of the element's block
    blocks = np.arange(q.size) // blocksize
    np.testing.assert_array_equal(t.dequantize().reshape(-1), nf4.NF4_CODES[q] * absmax[blocks])
    assert t.dequantize().shape == shape


def test_packing_is_high_nibble_first():
    # block absmax 1.0, so each value is exactly its code
    w = nf4.NF4_CODES[[15, 0, 7, 8, 3, 12, 1, 14, 5]].copy()
    t = nf4.quantize_nf4(w, 32)
    np.testing.assert_array_equal(t.packed, np.array([0xF0, 0x78, 0x3C, 0x1E, 0x57], np.uint8))
    np.testing.assert_array_equal(t.dequantize(), w)


def test_zero_block_and_bad_inputs(rng):
    w = np.zeros(128, np.float32)
    w[64:] = rng.standard_normal(64)
    t = nf4.quantize_nf4(w, 64)
    assert np.all(t.dequantize()[:64] == 0)
    with pytest.raises(ConfigError, match="blocksize 48"):
        nf4.quantize_nf4(w, 48)
    with pytest.raises(ConfigError, match="NaN"):
        nf4.quantize_nf4(np.array([1.0, np.nan], np.float32))
    with pytest.raises(ConfigError, match="weight format"):
        nf4.encode(w, "int8")


@pytest.mark.parametrize("blocksize", [32, 64, 256])
def test_roundtrip_error_statistics(rng, blocksize):
    w = rng.standard_normal((64, 256)).astype(np.float32)
    s = nf4.roundtrip_stats(w, blocksize=blocksize)
    # NF4 on Gaussian weights: ~9-11% relative error, max error below half the widest code gap times absmax
    assert 0.05 < s["rel_frobenius"] < 0.13
    assert s["max_abs"] <= 0.5 * 0.3038 * np.abs(w).max() + 1e-6
    assert s["bits_per_weight"] == pytest.approx(4 + 32 / blocksize)
    err = nf4.dequantize_nf4(nf4.quantize_nf4(w, blocksize)) - w
    assert s["rmse"] == pytest.approx(float(np.sqrt(np.mean(err.astype(np.float64) ** 2))), rel=1e-6)


def test_double_quant_formula_and_error(rng):
    w = (rng.standard_normal((40, 512)) * 0.02).astype(np.float32)
    single = nf4.quantize_nf4(w, 64)
    t = nf4.quantize_nf4(w, 64, double_quant=True)
    assert t.absmax.dtype == np.uint8 and t.nested_absmax.size == -(-single.absmax.size // 256)
    np.testing.assert_array_equal(t.packed, single.packed)  # codes do not depend on how absmax is stored
    # absmax = dynamic[qa] * absmax2[block of 256] + offset
    blocks = np.arange(t.absmax.size) // 256
    am = nf4.dynamic_map()[t.absmax] * t.nested_absmax[blocks] + np.float32(t.nested_offset)
    np.testing.assert_array_equal(t.block_absmax(), am)
    assert np.abs(am - single.absmax).max() < 0.01 * single.absmax.max()
    assert t.nbytes < single.nbytes
    assert nf4.roundtrip_stats(w, t)["rel_frobenius"] < 1.02 * nf4.roundtrip_stats(w, single)["rel_frobenius"]


@pytest.mark.parametrize("double_quant", [False, True])
def test_state_dict_roundtrip(rng, double_quant):
    w = rng.standard_normal((24, 100)).astype(np.float32)
    t = nf4.quantize_nf4(w, 32, double_quant)
    sd = t.to_state_dict("layers.0.w")
    meta = json.loads(bytes(sd["layers.0.w." + nf4.QUANT_STATE_KEY]).decode())
    assert meta["quant_type"] == "nf4" and meta["shape"] == [24, 100] and meta["blocksize"] == 32
    back = nf4.NF4Tensor.from_state_dict(sd.get, "layers.0.w")
    np.testing.assert_array_equal(back.dequantize(), t.dequantize())
    sd["layers.0.w.absmax"] = sd["layers.0.w.absmax"][:-1]
    with pytest.raises(ConfigError, match="absmax has"):
        nf4.NF4Tensor.from_state_dict(sd.get, "layers.0.w")


def test_f16_and_f32_formats(rng):
    w = rng.standard_normal((8, 8)).astype(np.float32)
    np.testing.assert_array_equal(nf4.decode(nf4.encode(w, "f32")), w)
    h = nf4.encode(w, "f16")
    assert h.dtype == np.float16
    np.testing.assert_array_equal(nf4.decode(h), w.astype(np.float16).astype(np.float32))


def test_agrees_with_bitsandbytes(rng):
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes.functional")
    np.testing.assert_array_equal(nf4.NF4_CODES, bnb.get_4bit_type("nf4", device="cpu").numpy())
    for shape, bs in [((32, 192), 64), ((17, 70), 32), ((3, 5000), 4096)]:
        w = rng.standard_normal(shape).astype(np.float32)
        packed, state = bnb.quantize_4bit(torch.from_numpy(w), blocksize=bs, quant_type="nf4")
        t = nf4.quantize_nf4(w, bs)
        np.testing.assert_array_equal(packed.numpy().reshape(-1), t.packed)
        np.testing.assert_array_equal(state.absmax.numpy(), t.absmax)
        np.testing.assert_array_equal(bnb.dequantize_4bit(packed, state).numpy(), t.dequantize())
        # and bitsandbytes' dequantization of our double-quantized tensor, read through its own state loader
        dq = nf4.quantize_nf4(w, bs, double_quant=True)
        sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in dq.to_state_dict("weight").items()}
        qs = bnb.QuantState.from_dict({k[len("weight."):]: v for k, v in sd.items() if k != "weight"}, device="cpu")
        np.testing.assert_array_equal(bnb.dequantize_4bit(sd["weight"], qs).numpy(), dq.dequantize())


def test_the_cuda_code_tables_are_the_codes():
    """The CUDA sources' NF4 code tables (constant memory, read by the matmuls' decodes and the row kernels) hold
    the bitsandbytes codes."""
    import re
    from importlib import resources

    kernels = resources.files("tilewise.kernels")

    def table(path: str, name: str) -> np.ndarray:
        text = kernels.joinpath(path).read_text()
        body = re.search(name + r"\[16\] = \{([^}]*)\}", text).group(1)
        return np.array([float(v.strip().rstrip("f")) for v in body.split(",") if v.strip()], np.float32)

    np.testing.assert_array_equal(table("matmul/matmul.cu", "NF4_CODE"), nf4.NF4_CODES)
    np.testing.assert_array_equal(table("rowops/rowops.cu", "ROW_NF4_CODE"), nf4.NF4_CODES)
