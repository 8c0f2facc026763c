"""NF4 (4-bit NormalFloat) weights, bitsandbytes-compatible, plus the f16 / f32 weight formats.

Layout (identical to bitsandbytes `quantize_4bit(..., quant_type="nf4")`, so its tensors load unchanged):
- the tensor is flattened; blocks of `blocksize` (32..4096, default 64) consecutive weights share one
  float32 absmax (a short last block gets its own);
- each weight becomes the index of the NF4 code nearest to `w * (1 / absmax)` (ties go to the lower code,
  as `torch.bucketize` does); element 2i is the high nibble and 2i+1 the low nibble of byte i;
- double quantization (optional): absmax - mean(absmax) is stored 8-bit with bitsandbytes' signed dynamic
  map in blocks of 256 (each with its own float32 absmax), and the mean is kept as `nested_offset`.

Dequantization: `w = code[q] * absmax` in float32, with absmax = dynamic[qa] * absmax2 + offset when nested.
State-dict names follow bitsandbytes' serialization of `Linear4bit`: `weight`, `weight.absmax`,
`weight.quant_map`, `weight.nested_absmax`, `weight.nested_quant_map`,
`weight.quant_state.bitsandbytes__nf4` (JSON bytes: blocksize, shape, dtype, nested_*).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilewise.errors import ConfigError

NF4_CODES = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
], dtype=np.float32)  # (16,)

BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
NESTED_BLOCKSIZE = 256
FORMATS = ("nf4", "f16", "f32")
QUANT_STATE_KEY = "quant_state.bitsandbytes__nf4"


def dynamic_map() -> np.ndarray:
    """bitsandbytes' signed 8-bit dynamic map (`create_dynamic_map(signed=True)`), 256 sorted float32 values.

    Computed in float32 like bitsandbytes, but torch's `linspace` rounds differently from numpy's, so 22 entries
    differ from bitsandbytes' table in the last bit (at most 6e-8). Checkpoints carry their map (`nested_quant_map`),
    and dequantization always uses the stored one, so loading bitsandbytes tensors stays exact.
    """
    data: list[float] = []
    max_exp, non_sign = 7, 7
    for i in range(max_exp):
        n_items = 2 ** (i + non_sign - max_exp) + 1
        bounds = np.linspace(0.1, 1, n_items, dtype=np.float32)
        means = (bounds[:-1] + bounds[1:]) / np.float32(2.0)
        scale = np.float32(10.0 ** (-(max_exp - 1) + i))
        data += (means * scale).tolist() + (means * -scale).tolist()
    data += [0.0, 1.0]
    data += [0.0] * (256 - len(data))
    return np.array(sorted(data), dtype=np.float32)


_DYNAMIC = dynamic_map()


def _check_blocksize(blocksize: int, allowed: tuple[int, ...] = BLOCKSIZES) -> None:
    if blocksize not in allowed:
        raise ConfigError(f"NF4 blocksize {blocksize} is not supported",
                          f"use one of {', '.join(map(str, allowed))} (bitsandbytes' sizes; 64 is the default)")


def _blockwise_scale(flat: np.ndarray, blocksize: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-block absmax and w/absmax clamped to [-1, 1], the way bitsandbytes computes them in float32."""
    n = flat.size
    full = n - n % blocksize
    blocks = flat[:full].reshape(-1, blocksize)  # (n_full_blocks, blocksize)
    absmax = np.abs(blocks).max(axis=1) if full else np.zeros(0, np.float32)
    recip = np.float32(1.0) / np.maximum(absmax, np.float32(1e-38))
    scaled = np.clip(blocks * recip[:, None], -1, 1).reshape(-1)
    if full < n:
        am = np.maximum(np.abs(flat[full:]).max(), np.float32(1e-38)).astype(np.float32)
        absmax = np.concatenate([absmax, am[None]])
        scaled = np.concatenate([scaled, np.clip(flat[full:] / am, -1, 1)])
    return absmax.astype(np.float32), scaled.astype(np.float32)


def _dequant_blocks(values: np.ndarray, absmax: np.ndarray, blocksize: int) -> np.ndarray:
    n = values.size
    full = n - n % blocksize
    out = np.empty(n, dtype=np.float32)
    out[:full] = (values[:full].reshape(-1, blocksize) * absmax[: full // blocksize, None]).reshape(-1)
    if full < n:
        out[full:] = values[full:] * absmax[-1]
    return out


def quantize_blockwise_8bit(x: np.ndarray, blocksize: int = NESTED_BLOCKSIZE,
                            code: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """8-bit blockwise quantization with a sorted code (bitsandbytes `quantize_blockwise`).

    Returns:
        (q (n,) uint8, absmax (n_blocks,) float32).
    """
    code = _DYNAMIC if code is None else code
    absmax, scaled = _blockwise_scale(np.asarray(x, dtype=np.float32).reshape(-1), blocksize)
    bounds = (code[:-1] + code[1:]) / np.float32(2)  # (255,)
    return np.searchsorted(bounds, scaled, side="left").astype(np.uint8), absmax


def dequantize_blockwise_8bit(q: np.ndarray, absmax: np.ndarray, blocksize: int = NESTED_BLOCKSIZE,
                              code: np.ndarray | None = None) -> np.ndarray:
    """Inverse of `quantize_blockwise_8bit`: code[q] * absmax per block, float32."""
    code = _DYNAMIC if code is None else code
    return _dequant_blocks(code[q.reshape(-1)], absmax, blocksize)


@dataclass(frozen=True, eq=False)
class NF4Tensor:
    """A packed NF4 tensor.

    Attributes:
        packed: (ceil(n / 2),) uint8, high nibble first.
        absmax: (n_blocks,) float32, or uint8 codes of (absmax - nested_offset) when double-quantized.
        shape: the original tensor shape.
        nested_absmax: (ceil(n_blocks / 256),) float32 when double-quantized, else None.
    """

    packed: np.ndarray
    absmax: np.ndarray
    shape: tuple[int, ...]
    blocksize: int = 64
    code: np.ndarray = field(default_factory=NF4_CODES.copy)
    nested_absmax: np.ndarray | None = None
    nested_code: np.ndarray | None = None
    nested_offset: float = 0.0
    nested_blocksize: int = NESTED_BLOCKSIZE
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def double_quant(self) -> bool:
        return self.nested_absmax is not None

    @property
    def nbytes(self) -> int:
        n = self.packed.nbytes + self.absmax.nbytes
        return n + (self.nested_absmax.nbytes if self.nested_absmax is not None else 0)

    def block_absmax(self) -> np.ndarray:
        """The float32 absmax of every block (undoing double quantization), (n_blocks,)."""
        if self.nested_absmax is None:
            return self.absmax.astype(np.float32, copy=False)
        code = _DYNAMIC if self.nested_code is None else self.nested_code
        am = dequantize_blockwise_8bit(self.absmax, self.nested_absmax, self.nested_blocksize, code)
        return am + np.float32(self.nested_offset)

    def codes(self) -> np.ndarray:
        """The 4-bit code indices, (n,) uint8."""
        out = np.empty(self.packed.size * 2, dtype=np.uint8)
        out[0::2] = self.packed >> 4
        out[1::2] = self.packed & 0x0F
        return out[: self.numel]

    def dequantize(self) -> np.ndarray:
        """float32 weights with the original shape."""
        return dequantize_nf4(self)

    def to_state_dict(self, prefix: str = "weight") -> dict[str, np.ndarray]:
        """bitsandbytes' serialized names for this tensor (see the module docstring)."""
        meta: dict[str, Any] = {"quant_type": "nf4", "blocksize": self.blocksize, "dtype": self.dtype,
                                "shape": list(self.shape)}
        out = {prefix: self.packed.reshape(-1, 1), f"{prefix}.absmax": self.absmax,
               f"{prefix}.quant_map": self.code}
        if self.nested_absmax is not None:
            meta.update(nested_blocksize=self.nested_blocksize, nested_dtype="float32",
                        nested_offset=float(self.nested_offset))
            out[f"{prefix}.nested_absmax"] = self.nested_absmax
            out[f"{prefix}.nested_quant_map"] = _DYNAMIC if self.nested_code is None else self.nested_code
        out[f"{prefix}.{QUANT_STATE_KEY}"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8).copy()
        return out

    @classmethod
    def from_state_dict(cls, get: Any, prefix: str = "weight") -> NF4Tensor:
        """Rebuild from bitsandbytes-style tensors; `get(name)` returns an array or None when absent."""
        raw = get(f"{prefix}.{QUANT_STATE_KEY}")
        if raw is None:
            raise ConfigError(f"NF4 tensor {prefix!r} has no {QUANT_STATE_KEY} entry",
                              "re-create the checkpoint with `tilewise convert ... --format nf4`")
        try:
            meta = json.loads(bytes(np.asarray(raw, dtype=np.uint8).reshape(-1)).decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"NF4 tensor {prefix!r} has an unreadable quant state: {exc}",
                              "re-create the checkpoint") from exc
        if meta.get("quant_type") != "nf4":
            raise ConfigError(f"tensor {prefix!r} is 4-bit {meta.get('quant_type')!r}, not nf4",
                              "tilewise reads NF4 only; re-quantize with quant_type='nf4'")
        packed, absmax = get(prefix), get(f"{prefix}.absmax")
        if packed is None or absmax is None:
            raise ConfigError(f"NF4 tensor {prefix!r} lacks its packed data or absmax", "re-create the checkpoint")
        t = cls(
            packed=np.asarray(packed, dtype=np.uint8).reshape(-1),
            absmax=np.asarray(absmax).reshape(-1),
            shape=tuple(int(s) for s in meta["shape"]),
            blocksize=int(meta["blocksize"]),
            code=np.asarray(get(f"{prefix}.quant_map") if get(f"{prefix}.quant_map") is not None else NF4_CODES,
                            dtype=np.float32),
            nested_absmax=None if "nested_offset" not in meta else np.asarray(get(f"{prefix}.nested_absmax"),
                                                                             dtype=np.float32).reshape(-1),
            nested_code=None if "nested_offset" not in meta else np.asarray(get(f"{prefix}.nested_quant_map"),
                                                                           dtype=np.float32),
            nested_offset=float(meta.get("nested_offset", 0.0)),
            nested_blocksize=int(meta.get("nested_blocksize", NESTED_BLOCKSIZE)),
            dtype=str(meta.get("dtype", "float32")),
        )
        t.check(prefix)
        return t

    def check(self, name: str = "tensor") -> None:
        """Raise ConfigError if the packed sizes do not fit the shape and blocksize."""
        _check_blocksize(self.blocksize)
        n = self.numel
        n_blocks = -(-n // self.blocksize)
        problems = []
        if self.packed.size != (n + 1) // 2:
            problems.append(f"packed has {self.packed.size} bytes, expected {(n + 1) // 2}")
        if self.absmax.size != n_blocks:
            problems.append(f"absmax has {self.absmax.size} entries, expected {n_blocks}")
        if self.code.shape != (16,):
            problems.append(f"quant_map has shape {self.code.shape}, expected (16,)")
        if self.nested_absmax is not None:
            want = -(-n_blocks // self.nested_blocksize)
            if self.absmax.dtype != np.uint8:
                problems.append(f"double-quantized absmax is {self.absmax.dtype}, expected uint8")
            if self.nested_absmax.size != want:
                problems.append(f"nested_absmax has {self.nested_absmax.size} entries, expected {want}")
            if self.nested_code is not None and self.nested_code.shape != (256,):
                problems.append(f"nested_quant_map has shape {self.nested_code.shape}, expected (256,)")
        if problems:
            raise ConfigError(f"NF4 tensor {name!r} with shape {self.shape}, blocksize {self.blocksize}: "
                              + "; ".join(problems), "re-create the checkpoint")


def quantize_nf4(w: np.ndarray, blocksize: int = 64, double_quant: bool = False) -> NF4Tensor:
    """Quantize a float tensor to NF4 (bitsandbytes' rounding and layout).

    Args:
        w: any-shape float array.
        blocksize: weights per absmax block (32..4096).
        double_quant: also quantize the absmax values to 8 bits (blocks of 256).

    Returns:
        The packed tensor.
    """
    _check_blocksize(blocksize)
    w = np.asarray(w)
    if not np.issubdtype(w.dtype, np.floating):
        raise ConfigError(f"cannot NF4-quantize a {w.dtype} tensor", "pass float weights")
    flat = w.astype(np.float32, copy=False).reshape(-1)
    if flat.size and not np.isfinite(flat).all():
        raise ConfigError("cannot NF4-quantize a tensor holding NaN or inf", "check the weights")
    absmax, scaled = _blockwise_scale(flat, blocksize)
    bounds = (NF4_CODES[:-1] + NF4_CODES[1:]) / np.float32(2)  # (15,)
    q = np.searchsorted(bounds, scaled, side="left").astype(np.uint8)
    if q.size % 2:
        q = np.concatenate([q, np.full(1, 7, np.uint8)])  # bnb pads with 0.0, i.e. code 7
    packed = (q[0::2] << 4) | q[1::2]
    dtype = {np.dtype(np.float16): "float16", np.dtype(np.float64): "float32"}.get(w.dtype, "float32")
    if not double_quant:
        return NF4Tensor(packed=packed, absmax=absmax, shape=tuple(w.shape), blocksize=blocksize, dtype=dtype)
    offset = np.float32(absmax.mean(dtype=np.float32))
    qa, absmax2 = quantize_blockwise_8bit(absmax - offset, NESTED_BLOCKSIZE)
    return NF4Tensor(packed=packed, absmax=qa, shape=tuple(w.shape), blocksize=blocksize, nested_absmax=absmax2,
                     nested_code=_DYNAMIC, nested_offset=float(offset), dtype=dtype)


def dequantize_nf4(t: NF4Tensor) -> np.ndarray:
    """float32 weights of an NF4 tensor: code[q] * absmax per block (bitsandbytes' formula)."""
    values = np.take(t.code.astype(np.float32, copy=False), t.codes())  # (n,)
    return _dequant_blocks(values, t.block_absmax(), t.blocksize).reshape(t.shape)


def roundtrip_stats(w: np.ndarray, t: NF4Tensor | None = None, blocksize: int = 64,
                    double_quant: bool = False) -> dict[str, float]:
    """Error of quantize -> dequantize against the original weights.

    Returns:
        max_abs, mean_abs, rmse, rel_frobenius (||w - w'|| / ||w||) and bits_per_weight.
    """
    w64 = np.asarray(w, dtype=np.float64)
    t = quantize_nf4(w, blocksize, double_quant) if t is None else t
    err = dequantize_nf4(t).astype(np.float64) - w64
    norm = float(np.linalg.norm(w64))
    return {
        "max_abs": float(np.abs(err).max()) if err.size else 0.0,
        "mean_abs": float(np.abs(err).mean()) if err.size else 0.0,
        "rmse": float(np.sqrt(np.mean(err**2))) if err.size else 0.0,
        "rel_frobenius": float(np.linalg.norm(err) / norm) if norm else 0.0,
        "bits_per_weight": 8.0 * t.nbytes / max(t.numel, 1),
    }


StoredTensor = NF4Tensor | np.ndarray


def encode(w: np.ndarray, fmt: str, blocksize: int = 64, double_quant: bool = False) -> StoredTensor:
    """Store a float weight in a format: `nf4` (packed), `f16` or `f32` (plain arrays)."""
    if fmt == "nf4":
        return quantize_nf4(w, blocksize, double_quant)
    if fmt == "f16":
        return np.asarray(w, dtype=np.float16)
    if fmt == "f32":
        return np.asarray(w, dtype=np.float32)
    raise ConfigError(f"unknown weight format {fmt!r}", f"use one of {', '.join(FORMATS)}")


def decode(t: StoredTensor) -> np.ndarray:
    """float32 array of a stored weight in any format."""
    if isinstance(t, NF4Tensor):
        return dequantize_nf4(t)
    return np.asarray(t, dtype=np.float32)


def stored_shape(t: StoredTensor) -> tuple[int, ...]:
    return t.shape if isinstance(t, NF4Tensor) else tuple(np.shape(t))


# ---- the arrays kernels read ----------------------------------------------------------------------------------
KERNEL_BLOCKSIZE = 64  # the GPU kernels index one absmax per 64 inputs of a row


def weight_arrays(w: StoredTensor, fmt: str) -> dict[str, np.ndarray]:
    """The arrays a kernel reads for one (out, in) weight in a format.

    nf4: {"w": the packed bytes as u32 words (8 weights each), "absmax": (out * in / 64,) float32}; a float
    array is quantized first, an NF4Tensor of another blocksize is re-blocked to 64. f16: {"w": pairs of f16
    as u32}. f32: {"w"}.
    """
    if fmt == "nf4":
        t = w if isinstance(w, NF4Tensor) else quantize_nf4(np.asarray(w, dtype=np.float32), KERNEL_BLOCKSIZE)
        if t.blocksize != KERNEL_BLOCKSIZE:
            t = quantize_nf4(t.dequantize(), KERNEL_BLOCKSIZE)
        if len(t.shape) != 2 or t.shape[1] % KERNEL_BLOCKSIZE:
            raise ConfigError(f"NF4 kernels need (out, in) weights with in % {KERNEL_BLOCKSIZE} == 0, got {t.shape}",
                              "use f16 or f32 weights for this tensor")
        if not np.array_equal(np.asarray(t.code, np.float32), NF4_CODES):
            raise ConfigError("the NF4 tensor uses a custom quant_map; the kernels have the standard codes built in",
                              "re-quantize it with the standard NF4 codes (tilewise convert --format nf4)")
        return {"w": np.ascontiguousarray(t.packed.reshape(-1)).view(np.uint32),
                "absmax": np.ascontiguousarray(t.block_absmax().astype(np.float32))}
    arr = decode(w)
    if fmt == "f16":
        return {"w": np.ascontiguousarray(arr.astype(np.float16)).view(np.uint32)}
    if fmt == "f32":
        return {"w": np.ascontiguousarray(arr.astype(np.float32))}
    raise ConfigError(f"unknown weight format {fmt!r}", f"use one of {', '.join(FORMATS)}")


def weight_values(arrays: dict[str, np.ndarray], fmt: str, n: int, k: int) -> np.ndarray:
    """float64 (n, k) weights exactly as a kernel sees `weight_arrays(...)` (what a reference multiplies)."""
    if fmt == "nf4":
        t = NF4Tensor(packed=arrays["w"].view(np.uint8), absmax=arrays["absmax"], shape=(n, k),
                      blocksize=KERNEL_BLOCKSIZE)
        return dequantize_nf4(t).astype(np.float64)
    if fmt == "f16":
        return arrays["w"].view(np.float16).reshape(n, k).astype(np.float64)
    return arrays["w"].reshape(n, k).astype(np.float64)
