"""LFM2 checkpoints: HF folders and tilewise's own format, opened lazily and validated before use.

Sources:
- an HF LFM2 folder: `config.json` (model_type "lfm2"), `model.safetensors` or shards listed in
  `model.safetensors.index.json`, optional `tokenizer.json`. Tensor names may carry the `model.` prefix
  (`Lfm2ForCausalLM`, sequence-classification models) or not (`Lfm2Model`); `lm_head.weight` is ignored
  (the classifier reads the hidden state), `score.weight` (num_labels x hidden) is the classifier head.
- tilewise's format: the same folder layout, `model.safetensors` metadata {"format": "tilewise",
  "format_version": "1", "weights": "nf4"|"f16"|"f32", "config": <config.json text>}; NF4 tensors use
  bitsandbytes' serialized names (see nf4.py), so bitsandbytes-quantized HF tensors load the same way.

Safetensors files are memory-mapped and parsed here (8-byte header length, JSON header, data); every
tensor's shape and byte range is checked against the config and the file size before anything is used,
so a truncated file, a missing or misshapen tensor, or a non-LFM2 folder fails with one message.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilewise.errors import ConfigError
from tilewise.model.config import ModelConfig
from tilewise.quant.nf4 import FORMATS, QUANT_STATE_KEY, NF4Tensor, StoredTensor, decode, encode, stored_shape

FORMAT_NAME = "tilewise"
FORMAT_VERSION = 1
HEAD = "score.weight"
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": "bf16", "U8": np.uint8, "I8": np.int8,
           "I16": np.int16, "I32": np.int32, "I64": np.int64, "BOOL": np.bool_}
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "U8": 1, "I8": 1, "I16": 2, "I32": 4, "I64": 8, "BOOL": 1}


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every backbone tensor (HF `Lfm2Model` names) and its shape; the head is listed separately (`HEAD`)."""
    h, f, hd = cfg.hidden_size, cfg.ffn_dim, cfg.head_dim
    out: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (cfg.vocab_size, h)}
    for i, kind in enumerate(cfg.layer_types):
        p = f"layers.{i}."
        out[p + "operator_norm.weight"] = (h,)
        out[p + "ffn_norm.weight"] = (h,)
        if kind == "conv":
            out[p + "conv.in_proj.weight"] = (3 * h, h)
            out[p + "conv.conv.weight"] = (h, 1, cfg.conv_L_cache)
            out[p + "conv.out_proj.weight"] = (h, h)
        else:
            out[p + "self_attn.q_proj.weight"] = (cfg.num_attention_heads * hd, h)
            out[p + "self_attn.k_proj.weight"] = (cfg.num_key_value_heads * hd, h)
            out[p + "self_attn.v_proj.weight"] = (cfg.num_key_value_heads * hd, h)
            out[p + "self_attn.out_proj.weight"] = (h, cfg.num_attention_heads * hd)
            out[p + "self_attn.q_layernorm.weight"] = (hd,)
            out[p + "self_attn.k_layernorm.weight"] = (hd,)
        out[p + "feed_forward.w1.weight"] = (f, h)
        out[p + "feed_forward.w3.weight"] = (f, h)
        out[p + "feed_forward.w2.weight"] = (h, f)
    out["embedding_norm.weight"] = (h,)
    return out


def is_matrix(name: str) -> bool:
    """Tensors stored in the chosen format (nf4/f16/f32): projections, FFN and embeddings. Norms, conv taps and
    the 8-row head always stay float32 (tiny, and the head's 8 scores are what users compare)."""
    return name.endswith("proj.weight") or ".feed_forward.w" in name or name == "embed_tokens.weight"


# ---------------------------------------------------------------------------------------------------------------
# safetensors, memory-mapped


class SafetensorsFile:
    """A memory-mapped safetensors file; the header is checked against the file size on open."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as fh:
                head = fh.read(8)
                if len(head) < 8:
                    raise ConfigError(f"{self.path} is truncated or not a safetensors file ({size} bytes)",
                                      "re-download or re-create the checkpoint")
                (n_header,) = struct.unpack("<Q", head)
                if n_header > size - 8:
                    raise ConfigError(f"{self.path} is truncated: header claims {n_header} bytes, file has {size}",
                                      "re-download or re-create the checkpoint")
                header = json.loads(fh.read(n_header))
        except OSError as exc:
            raise ConfigError(f"cannot read {self.path}: {exc}", "check the path and permissions") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{self.path} has a corrupt safetensors header: {exc}",
                              "re-download or re-create the checkpoint") from exc
        if not isinstance(header, dict):
            raise ConfigError(f"{self.path} has a corrupt safetensors header", "re-create the checkpoint")
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self.entries: dict[str, dict[str, Any]] = header
        self._data_start = 8 + n_header
        data_bytes = size - self._data_start
        for name, e in header.items():
            dt, shape, (start, end) = e.get("dtype"), e.get("shape"), e.get("data_offsets", (0, -1))
            if dt not in _DTYPES:
                raise ConfigError(f"{self.path}: tensor {name!r} has unsupported dtype {dt!r}",
                                  f"store it as one of {', '.join(_DTYPES)}")
            want = int(np.prod(shape, dtype=np.int64)) * _DTYPE_BYTES[dt]
            if end - start != want:
                raise ConfigError(f"{self.path}: tensor {name!r} {dt}{shape} needs {want} bytes, header gives "
                                  f"{end - start}", "re-create the checkpoint")
            if end > data_bytes:
                raise ConfigError(f"{self.path} is truncated: tensor {name!r} ends at byte {end} of the data, the "
                                  f"file holds {data_bytes}", "re-download or re-create the checkpoint")
        self._map: np.memmap | None = None

    def names(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.entries[name]["shape"])

    def get(self, name: str) -> np.ndarray:
        """The tensor as a read-only array view of the mapped file (bfloat16 is widened to float32)."""
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        e = self.entries[name]
        start, end = e["data_offsets"]
        raw = self._map[self._data_start + start : self._data_start + end]
        dt = _DTYPES[e["dtype"]]
        if dt == "bf16":
            wide = np.zeros(raw.size // 2, dtype=np.uint32)
            wide[:] = raw.view(np.uint16)
            return (wide << 16).view(np.float32).reshape(e["shape"])
        return raw.view(dt).reshape(e["shape"])


def _save_safetensors(tensors: dict[str, np.ndarray], path: Path, metadata: dict[str, str]) -> None:
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata=metadata)


# ---------------------------------------------------------------------------------------------------------------
# the checkpoint


@dataclass
class Checkpoint:
    """A validated LFM2 checkpoint whose tensors load on first use.

    Attributes:
        config: the model config.
        weights: the storage format of the matrices: `nf4`, `f16`, `f32`, or `bf16`/`f64`/`mixed` for HF files.
        source: where it came from (a path or `preset:<name>`).
        tokenizer_path: the folder's tokenizer.json, if any.
    """

    config: ModelConfig
    weights: str
    source: str
    tokenizer_path: Path | None = None
    _loaders: dict[str, Callable[[], StoredTensor]] = field(default_factory=dict, repr=False)
    _cache: dict[str, StoredTensor] = field(default_factory=dict, repr=False)

    @property
    def has_head(self) -> bool:
        return HEAD in self._loaders

    def names(self) -> list[str]:
        return list(self._loaders)

    def get(self, name: str) -> StoredTensor:
        """The stored tensor (array or NF4Tensor)."""
        if name not in self._cache:
            try:
                loader = self._loaders[name]
            except KeyError:
                raise ConfigError(f"checkpoint {self.source} has no tensor {name!r}", "use a complete checkpoint") \
                    from None
            self._cache[name] = _finite(name, loader(), self.source)
        return self._cache[name]

    def float32(self, name: str) -> np.ndarray:
        """A tensor as float32 (NF4 dequantized)."""
        return decode(self.get(name))

    def items(self) -> Iterator[tuple[str, StoredTensor]]:
        for name in self._loaders:
            yield name, self.get(name)

    def nbytes(self) -> int:
        total = 0
        for _, t in self.items():
            total += t.nbytes
        return total

    # -- construction ------------------------------------------------------------------------------------------

    @classmethod
    def from_arrays(cls, config: ModelConfig, tensors: dict[str, StoredTensor], weights: str, source: str,
                    tokenizer_path: Path | None = None) -> Checkpoint:
        """Wrap in-memory tensors (canonical names), validating names and shapes."""
        _validate(config, {k: stored_shape(v) for k, v in tensors.items()}, source)
        for k, v in tensors.items():
            if not isinstance(v, NF4Tensor) and (k in expected_shapes(config) or k == HEAD):
                _float_dtype(k, np.asarray(v).dtype.name, source)
        ck = cls(config=config, weights=weights, source=source, tokenizer_path=tokenizer_path)
        for k, v in tensors.items():
            ck._loaders[k] = (lambda v=v: v)
        return ck

    @classmethod
    def open(cls, path: str | Path) -> Checkpoint:
        """Open an HF LFM2 folder, a tilewise folder, or a single tilewise `.safetensors` file."""
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"no model at {path}", "pass an existing folder, or a preset name (lfm2-350m, "
                              "seed-250m, tiny)")
        folder = path if path.is_dir() else path.parent
        files = _safetensors_files(path)
        opened = {f: SafetensorsFile(f) for f in sorted(set(files.values()))}
        meta = next((sf.metadata for sf in opened.values() if sf.metadata.get("format") == FORMAT_NAME), {})
        if meta:
            version = int(meta.get("format_version", "0"))
            if version > FORMAT_VERSION:
                raise ConfigError(f"{path} uses tilewise checkpoint format version {version}; this tilewise reads "
                                  f"up to {FORMAT_VERSION}", "upgrade tilewise")
            config = ModelConfig.from_hf_dict(json.loads(meta["config"]), name=folder.name)
        elif (folder / "config.json").exists():
            config = ModelConfig.from_file(folder / "config.json")
        else:
            raise ConfigError(f"{folder} has no config.json and its safetensors carry no tilewise metadata",
                              "an HF LFM2 folder needs config.json next to model.safetensors")
        # canonical name -> (file, stored name); bnb-style NF4 tensors are keyed by their base name
        index: dict[str, tuple[SafetensorsFile, str]] = {}
        for stored_name, fname in files.items():
            sf = opened[fname]
            if stored_name not in sf.entries:
                raise ConfigError(f"{fname} lacks tensor {stored_name!r} that the shard index lists",
                                  "re-download the checkpoint")
            index[_canonical(stored_name)] = (sf, stored_name)
        shapes: dict[str, tuple[int, ...]] = {}
        loaders: dict[str, Callable[[], StoredTensor]] = {}
        dtypes: set[str] = set()
        nf4: set[str] = set()
        for canon, (sf, stored_name) in index.items():
            if canon.endswith("." + QUANT_STATE_KEY):
                base = canon[: -len(QUANT_STATE_KEY) - 1]
                prefix = stored_name[: -len(QUANT_STATE_KEY) - 1]
                t = NF4Tensor.from_state_dict(lambda n, sf=sf: sf.get(n) if n in sf.entries else None, prefix)
                shapes[base] = t.shape
                loaders[base] = (lambda t=t: t)
                nf4.add(base)
                dtypes.add("nf4")
        for canon, (sf, stored_name) in index.items():
            if canon in loaders or "." + QUANT_STATE_KEY in canon or _is_nf4_part(canon, loaders):
                continue
            if canon == "lm_head.weight":
                continue
            shapes[canon] = sf.shape(stored_name)
            loaders[canon] = (lambda sf=sf, n=stored_name: sf.get(n))
            if is_matrix(canon):
                dtypes.add(sf.entries[stored_name]["dtype"].lower())
        _validate(config, shapes, str(path))
        weights = meta.get("weights") or (dtypes.pop() if len(dtypes) == 1 else "mixed")
        tok = folder / "tokenizer.json"
        ck = cls(config=config, weights=weights, source=str(path), tokenizer_path=tok if tok.exists() else None)
        ck._loaders = {k: loaders[k] for k in shapes if k in expected_shapes(config) or k == HEAD}
        for k in ck._loaders:  # from the header alone: nothing is read or cast before the dtype is known
            if k not in nf4:
                sf, stored_name = index[k]
                _float_dtype(k, sf.entries[stored_name]["dtype"], str(path))
        return ck

    # -- conversion and saving --------------------------------------------------------------------------------

    def converted(self, weights: str, blocksize: int = 64, double_quant: bool = False) -> Checkpoint:
        """The same model with its matrices stored in another format (`nf4`, `f16`, `f32`)."""
        if weights not in FORMATS:
            raise ConfigError(f"unknown weight format {weights!r}", f"use one of {', '.join(FORMATS)}")
        out = Checkpoint(config=self.config, weights=weights, source=self.source, tokenizer_path=self.tokenizer_path)
        for name in self._loaders:
            def load(name: str = name) -> StoredTensor:
                t = self.get(name)
                if not is_matrix(name):
                    return decode(t)
                if isinstance(t, NF4Tensor) and weights == "nf4" and t.blocksize == blocksize \
                        and t.double_quant == double_quant:
                    return t
                return encode(decode(t), weights, blocksize, double_quant)
            out._loaders[name] = load
        return out

    def materialize(self, workers: int | None = None) -> Checkpoint:
        """Load every tensor now and drop the loaders (and with them any reference to a source checkpoint).

        Tensors load on `workers` threads (default: one per CPU): converting to NF4 is numpy work that releases the
        GIL, and each tensor's result depends only on its own source, so the order does not matter.
        """
        import os
        from concurrent.futures import ThreadPoolExecutor

        names = list(self._loaders)
        with ThreadPoolExecutor(max_workers=max(1, workers or os.cpu_count() or 1)) as pool:
            tensors = list(pool.map(self.get, names))
        for name, t in zip(names, tensors):
            self._loaders[name] = (lambda t=t: t)
        return self

    def save(self, dst: str | Path) -> Path:
        """Write a tilewise folder: model.safetensors (with metadata), config.json, tokenizer.json if known."""
        dst = Path(dst)
        tensors: dict[str, np.ndarray] = {}
        for name, t in self.items():  # every tensor is read (and checked) before anything is written
            if isinstance(t, NF4Tensor):
                tensors.update(t.to_state_dict(name))
            else:
                tensors[name] = np.asarray(t)
        dst.mkdir(parents=True, exist_ok=True)
        cfg_text = json.dumps(self.config.to_hf_dict(), indent=2)
        meta = {"format": FORMAT_NAME, "format_version": str(FORMAT_VERSION), "weights": self.weights,
                "config": cfg_text}
        tmp = dst / "model.safetensors.partial"
        _save_safetensors(tensors, tmp, meta)
        tmp.chmod(0o644)
        tmp.replace(dst / "model.safetensors")  # never leave a half-written checkpoint under the real name
        (dst / "config.json").write_text(cfg_text + "\n")
        if self.tokenizer_path is not None and self.tokenizer_path.resolve() != (dst / "tokenizer.json").resolve():
            shutil.copyfile(self.tokenizer_path, dst / "tokenizer.json")
        return dst


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "float64", "float32", "float16")


def _float_dtype(name: str, dtype: str, source: str) -> None:
    """Refuse a weight stored as an integer or boolean: cast to float it would run as garbage, not fail."""
    if dtype not in FLOAT_DTYPES:
        raise ConfigError(f"checkpoint {source}: tensor {name!r} is stored as {dtype}, not a floating-point type "
                          "(LFM2 weights are F32, F16, BF16 or F64, or NF4 packed as bitsandbytes stores it)",
                          f"export {name} as floating point again (e.g. tensor.float() before saving); integer or "
                          "boolean values are not weights tilewise can run")


def _finite(name: str, t: StoredTensor, source: str) -> StoredTensor:
    """Refuse a tensor holding NaN or Inf (every score would come out NaN, or the model would play garbage)."""
    parts = [t.absmax, t.code, t.nested_absmax, t.nested_code, np.float32(t.nested_offset)] \
        if isinstance(t, NF4Tensor) else [t]
    bad = sum(int(a.size - np.count_nonzero(np.isfinite(a))) for a in parts
              if a is not None and np.issubdtype(np.asarray(a).dtype, np.floating))
    if bad:
        what = "values" if not isinstance(t, NF4Tensor) else "NF4 scales (absmax / code)"
        raise ConfigError(f"checkpoint {source}: tensor {name!r} has {bad} non-finite (NaN or Inf) {what}",
                          "the weights are corrupt (a diverged training run or a damaged file): re-export them "
                          "from a good checkpoint")
    return t


def _is_nf4_part(canon: str, loaders: dict[str, Any]) -> bool:
    for suffix in (".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map"):
        if canon.endswith(suffix) and canon[: -len(suffix)] in loaders:
            return True
    return False


def _canonical(name: str) -> str:
    return name[len("model."):] if name.startswith("model.") else name


def _safetensors_files(path: Path) -> dict[str, Path]:
    """Stored tensor name -> file, for a folder (single file or sharded with an index) or one file."""
    if path.is_file():
        return {n: path for n in SafetensorsFile(path).names()}
    index = path / "model.safetensors.index.json"
    single = path / "model.safetensors"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(f"{index} is not a valid shard index: {exc}", "re-download the checkpoint") from exc
        missing = sorted({f for f in weight_map.values() if not (path / f).exists()})
        if missing:
            raise ConfigError(f"{path}: shard files listed in the index are missing: {', '.join(missing)}",
                              "download every shard")
        return {n: path / f for n, f in weight_map.items()}
    if single.exists():
        return {n: single for n in SafetensorsFile(single).names()}
    others = sorted(path.glob("*.safetensors"))
    if len(others) == 1:
        return {n: others[0] for n in SafetensorsFile(others[0]).names()}
    raise ConfigError(f"{path} has no model.safetensors (or model.safetensors.index.json)",
                      "point at an HF LFM2 folder or a tilewise checkpoint")


def _validate(cfg: ModelConfig, shapes: dict[str, tuple[int, ...]], source: str) -> None:
    want = expected_shapes(cfg)
    problems = []
    missing = [n for n in want if n not in shapes]
    if missing:
        shown = ", ".join(f"{n} {want[n]}" for n in missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        problems.append(f"missing tensors: {shown}{more}")
    for name, shape in want.items():
        found = shapes.get(name)
        if found is not None and tuple(found) != shape:
            problems.append(f"{name} has shape {tuple(found)}, expected {shape}")
    if HEAD in shapes and tuple(shapes[HEAD]) != (cfg.num_labels, cfg.hidden_size):
        problems.append(f"{HEAD} has shape {tuple(shapes[HEAD])}, expected {(cfg.num_labels, cfg.hidden_size)}")
    if problems:
        if missing and len(missing) == len(want):
            problems.insert(0, "no LFM2 tensor names found (is this an LFM2 checkpoint?)")
        raise ConfigError(f"checkpoint {source} does not match its LFM2 config: " + "; ".join(problems[:12]),
                          "use the config.json that belongs to these weights, or re-export the checkpoint")


# ---------------------------------------------------------------------------------------------------------------
# presets with random weights


def random_tensors(cfg: ModelConfig, seed: int = 0, head: bool = True) -> dict[str, np.ndarray]:
    """Seeded random float32 weights for a config (never zeros), scaled so activations stay O(1).

    Projections into a stream are N(0, 1/fan_in); projections back into the residual are further scaled by
    1/sqrt(num_layers) so the residual grows to a few units over all blocks; norm weights are 1 + N(0, 0.1^2)
    so a lost norm weight shows in parity tests; conv taps are N(0, 1/L).
    """
    rng = np.random.default_rng(seed)
    res = 1.0 / np.sqrt(cfg.num_layers)
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes(cfg).items():
        if name == "embed_tokens.weight":
            std = 1.0
        elif name.endswith("norm.weight"):
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
            continue
        elif name.endswith("conv.conv.weight"):
            std = 1.0 / np.sqrt(cfg.conv_L_cache)
        elif name.endswith(("out_proj.weight", "w2.weight")):
            std = res / np.sqrt(shape[1])
        else:
            std = 1.0 / np.sqrt(shape[1])
        w = rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(std)
        out[name] = w
    if head:
        out[HEAD] = rng.standard_normal((cfg.num_labels, cfg.hidden_size), dtype=np.float32) / np.float32(
            np.sqrt(cfg.hidden_size))
    return out


def random_checkpoint(cfg: ModelConfig, seed: int = 0, weights: str = "f32", blocksize: int = 64) -> Checkpoint:
    """A checkpoint of seeded random weights in a format (see `random_tensors`)."""
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, seed), "f32", f"preset:{cfg.name}")
    return ck if weights == "f32" else ck.converted(weights, blocksize).materialize()


def save_hf_folder(cfg: ModelConfig, tensors: dict[str, np.ndarray], dst: str | Path, prefix: str = "") -> Path:
    """Write float tensors as a plain HF folder (config.json + model.safetensors), e.g. for parity tests."""
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2))
    named = {(prefix + k if k != HEAD else k): np.asarray(v) for k, v in tensors.items()}
    _save_safetensors(named, dst / "model.safetensors", {"format": "pt"})
    return dst
