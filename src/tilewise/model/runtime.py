"""The classifier runtime: `load()`, the device-independent `Model` and `State`, and the CPU executor.

Split so that another device only has to add an executor:
- `Model` (any device): token-id checks, positions, the branching contract (`extend` returns a new State and
  never changes its input, so many decisions branch from one cached prefix), `hidden()` and `scores()`.
- `State` (any device): token count, the final-normed hidden state of the last position (a host array: it is
  all the classifier reads) and the executor's own per-layer caches (opaque to `Model`).
- `Executor` (one per device): `forward(ids, state, final_row_slicing)` -> (last hidden, caches). The row
  plan of final-row slicing (`mixer_rows` below) is shared: in the last block only the last row's mixer output,
  FFN and final norm are computed, while the K/V rows and conv state every later token needs are kept.
- `CPUExecutor`: numpy float32 with BLAS; NF4/f16 weights are dequantized once at load and cached as float32;
  q/k/v and w1/w3 are fused into one matrix each so every block issues few, large GEMMs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tilewise.errors import ConfigError, DeviceUnavailable, TilewiseError
from tilewise.model.checkpoint import HEAD, Checkpoint, random_checkpoint
from tilewise.model.config import PRESETS, ModelConfig
from tilewise.quant.nf4 import FORMATS

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "default"
KNOWN_DEVICES = ("cpu", "webgpu", "cuda", "auto")


@dataclass(frozen=True, eq=False)
class State:
    """The model after some tokens; immutable (extend() returns a new one).

    Attributes:
        n_tokens: tokens consumed so far (the next token's position).
        last_hidden: (hidden,) float32, final-normed hidden state at the last position (read-only).
        caches: the executor's per-layer continuation state (conv rows, K/V); never modified in place.
        owner: id of the Model that made it (a state cannot move between models).
    """

    n_tokens: int
    last_hidden: np.ndarray
    caches: Any
    owner: int


class Executor(Protocol):
    """What a device contributes: the forward pass over new tokens with continuation state."""

    device_name: str

    def forward(self, ids: np.ndarray, start: int, caches: Any, final_row_slicing: bool) -> tuple[np.ndarray, Any]:
        """Run new tokens `ids` (n,) at positions start..start+n-1 after `caches` (None at the start).

        Returns:
            ((hidden,) float32 final-normed hidden state of the last new token, new caches). The input caches
            must not be modified.
        """
        ...


def mixer_rows(layer: int, num_layers: int, n_rows: int, final_row_slicing: bool) -> slice:
    """Rows of a block whose mixer output, FFN and residual are needed: all, except in the last block (then
    only the last row, which is all the classifier reads)."""
    if final_row_slicing and layer == num_layers - 1:
        return slice(n_rows - 1, n_rows)
    return slice(0, n_rows)


class Model:
    """An LFM2 classifier on one device; see the module docstring for the contract."""

    def __init__(self, checkpoint: Checkpoint, executor: Executor, head: np.ndarray | None,
                 tokenizer: Any = None) -> None:
        self.config: ModelConfig = checkpoint.config
        self.checkpoint = checkpoint
        self.executor = executor
        self.device = executor.device_name
        self.weights = checkpoint.weights
        self.tokenizer = tokenizer
        self.final_row_slicing = True
        self._head = head  # (num_labels, hidden) float32 or None

    def __repr__(self) -> str:
        c = self.config
        return (f"Model({c.name}: {c.num_layers} blocks, hidden {c.hidden_size}, ffn {c.ffn_dim}, vocab "
                f"{c.vocab_size}, weights {self.weights}, device {self.device})")

    def encode(self, text: str) -> list[int]:
        """Token ids of a text prompt (the chat template's special tokens are written in the text itself)."""
        if self.tokenizer is None:
            raise ConfigError(f"model {self.checkpoint.source} has no tokenizer.json, so it cannot read text",
                              "pass token ids, or put the model's tokenizer.json in its folder")
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def _ids(self, ids: Sequence[int] | np.ndarray | str, start: int) -> np.ndarray:
        if isinstance(ids, str):
            ids = self.encode(ids)
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ConfigError(f"token ids must be a 1-D sequence of integers, got shape {arr.shape} of {arr.dtype}",
                              "pass a list of token ids (batch size is 1)")
        if arr.size == 0:
            raise ConfigError("no token ids given", "pass at least one token id")
        bad = (arr < 0) | (arr >= self.config.vocab_size)
        if bad.any():
            first = int(np.argmax(bad))
            raise ConfigError(f"token id {int(arr[first])} at index {first} is outside the vocabulary "
                              f"(0..{self.config.vocab_size - 1})", "tokenize with this model's tokenizer")
        if start + arr.size > self.config.max_position_embeddings:
            raise ConfigError(f"sequence of {start + arr.size} tokens exceeds the model's "
                              f"{self.config.max_position_embeddings} positions", "shorten the prompt")
        return arr.astype(np.int64)

    def prefill(self, token_ids: Sequence[int] | np.ndarray | str) -> State:
        """Run a prompt from the start.

        Args:
            token_ids: (n,) token ids (or text, when the model has a tokenizer).

        Returns:
            The state after the prompt.
        """
        ids = self._ids(token_ids, 0)
        hidden, caches = self.executor.forward(ids, 0, None, self.final_row_slicing)
        return self._state(ids.size, hidden, caches)

    def extend(self, state: State, token_ids: Sequence[int] | np.ndarray | str) -> State:
        """Continue from a state with more tokens; `state` itself is left unchanged (branch freely).

        Args:
            state: a state from this model's prefill() or extend().
            token_ids: (n,) token ids to append.

        Returns:
            A new state.
        """
        self._check_state(state)
        ids = self._ids(token_ids, state.n_tokens)
        hidden, caches = self.executor.forward(ids, state.n_tokens, state.caches, self.final_row_slicing)
        return self._state(state.n_tokens + ids.size, hidden, caches)

    def hidden(self, state: State) -> np.ndarray:
        """(hidden,) float32 final-normed hidden state at the last position."""
        self._check_state(state)
        return state.last_hidden.copy()

    def scores(self, state: State) -> np.ndarray:
        """(num_labels,) = (8,) float32 classifier scores at the last position."""
        self._check_state(state)
        if self._head is None:
            raise ConfigError(f"checkpoint {self.checkpoint.source} has no classifier head ({HEAD}, "
                              f"{self.config.num_labels} x {self.config.hidden_size})",
                              "use hidden(state), or load a checkpoint trained with a classifier head")
        return self._head @ state.last_hidden

    def _state(self, n_tokens: int, hidden: np.ndarray, caches: Any) -> State:
        hidden = np.array(hidden, dtype=np.float32)
        hidden.setflags(write=False)
        return State(n_tokens=n_tokens, last_hidden=hidden, caches=caches, owner=id(self))

    def _check_state(self, state: State) -> None:
        if not isinstance(state, State):
            raise ConfigError(f"expected a State from prefill() or extend(), got {type(state).__name__}",
                              "pass the state a previous call returned")
        if state.owner != id(self):
            raise ConfigError("this state belongs to another model", "continue a state on the model that made it")


# ---------------------------------------------------------------------------------------------------------------
# CPU executor


@dataclass(frozen=True)
class _CPULayer:
    kind: str
    operator_norm: np.ndarray  # (H,)
    ffn_norm: np.ndarray  # (H,)
    w13: np.ndarray  # (2F, H): w1 rows then w3 rows, one GEMM for gate and up
    w2: np.ndarray  # (H, F)
    mix_in: np.ndarray  # conv: in_proj (3H, H); attention: q, k, v rows stacked ((nh + 2 nkv) hd, H)
    mix_out: np.ndarray  # (H, H) or (H, nh hd)
    conv_taps: np.ndarray | None = None  # (H, L)
    q_norm: np.ndarray | None = None  # (hd,)
    k_norm: np.ndarray | None = None  # (hd,)


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.einsum("...i,...i->...", x, x)[..., None] / np.float32(x.shape[-1])
    return x * (w / np.sqrt(ms + np.float32(eps)))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


class CPUExecutor:
    """float32 numpy/BLAS executor; weights dequantized once at construction."""

    device_name = "cpu"

    def __init__(self, checkpoint: Checkpoint, device: str = "cpu") -> None:
        cfg = self.cfg = checkpoint.config
        f32 = checkpoint.float32
        self.embed = f32("embed_tokens.weight")  # (V, H)
        self.final_norm = f32("embedding_norm.weight")
        layers = []
        for i, kind in enumerate(cfg.layer_types):
            p = f"layers.{i}."
            w13 = np.concatenate([f32(p + "feed_forward.w1.weight"), f32(p + "feed_forward.w3.weight")])
            common = dict(kind=kind, operator_norm=f32(p + "operator_norm.weight"), ffn_norm=f32(p + "ffn_norm.weight"),
                          w13=w13, w2=np.ascontiguousarray(f32(p + "feed_forward.w2.weight")))
            if kind == "conv":
                layers.append(_CPULayer(**common, mix_in=np.ascontiguousarray(f32(p + "conv.in_proj.weight")),
                                        mix_out=np.ascontiguousarray(f32(p + "conv.out_proj.weight")),
                                        conv_taps=np.ascontiguousarray(f32(p + "conv.conv.weight")[:, 0, :])))
            else:
                a = p + "self_attn."
                qkv = np.concatenate([f32(a + "q_proj.weight"), f32(a + "k_proj.weight"), f32(a + "v_proj.weight")])
                layers.append(_CPULayer(**common, mix_in=qkv, mix_out=np.ascontiguousarray(f32(a + "out_proj.weight")),
                                        q_norm=f32(a + "q_layernorm.weight"), k_norm=f32(a + "k_layernorm.weight")))
        self.layers = tuple(layers)
        hd = cfg.head_dim
        # HF computes inv_freq and the angles in float32; doing the same keeps RoPE bit-close at long positions
        self.inv_freq = (np.float32(1.0) / (np.float32(cfg.rope_theta) ** (
            np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)))).astype(np.float32)

    def weight_bytes(self) -> int:
        total = self.embed.nbytes + self.final_norm.nbytes
        for lay in self.layers:
            for v in vars(lay).values():
                if isinstance(v, np.ndarray):
                    total += v.nbytes
        return total

    def forward(self, ids: np.ndarray, start: int, caches: Any, final_row_slicing: bool) -> tuple[np.ndarray, Any]:
        cfg = self.cfg
        n, eps = ids.size, cfg.norm_eps
        H, L = cfg.hidden_size, cfg.conv_L_cache
        nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        x = self.embed[ids]  # (n, H), a copy
        angles = np.arange(start, start + n, dtype=np.float32)[:, None] * self.inv_freq[None, :]  # (n, hd/2)
        cos, sin = np.cos(angles), np.sin(angles)
        new_caches: list[Any] = []
        for i, lay in enumerate(self.layers):
            rows = mixer_rows(i, len(self.layers), n, final_row_slicing)
            h = _rms_norm(x, lay.operator_norm, eps)
            if lay.kind == "conv":
                prev = np.zeros((L, H), np.float32) if caches is None else caches[i]  # (L, H)
                # Bx rows needed: all when every row is output; in the sliced last block only the last L rows
                # (the new conv state, which also holds the L - 1 predecessors of the one output row)
                lo = 0 if rows.start == 0 else max(0, min(rows.start - (L - 1), n - L))
                bcx = h[lo:] @ lay.mix_in.T  # (n - lo, 3H)
                b, c, xs = bcx[:, :H], bcx[:, H:2 * H], bcx[:, 2 * H:]
                seq = np.concatenate([prev, b * xs])  # (L + n - lo, H); row L + t - lo holds token t's Bx
                new_caches.append(seq[-L:].copy())
                m = rows.stop - rows.start
                base = L + rows.start - lo - (L - 1)  # seq row of tap 0 for the first output row
                conv = lay.conv_taps[:, 0] * seq[base : base + m]
                for j in range(1, L):
                    conv += lay.conv_taps[:, j] * seq[base + j : base + j + m]
                cc = c[rows.start - lo : rows.stop - lo]
                mixed = (cc * conv) @ lay.mix_out.T  # (m, H)
            else:
                k_v = h @ lay.mix_in[nh * hd:].T  # (n, 2 nkv hd): every row's K/V is kept for later tokens
                q = h[rows] @ lay.mix_in[: nh * hd].T  # (m, nh hd): queries only for the output rows
                m = q.shape[0]
                k = _rope(_rms_norm(k_v[:, : nkv * hd].reshape(n, nkv, hd), lay.k_norm, eps), cos, sin)
                v = k_v[:, nkv * hd:].reshape(n, nkv, hd)
                q = _rope(_rms_norm(q.reshape(m, nh, hd), lay.q_norm, eps), cos[rows], sin[rows])
                if caches is None:
                    keys, values = k.transpose(1, 0, 2).copy(), v.transpose(1, 0, 2).copy()  # (nkv, n, hd)
                else:
                    pk, pv = caches[i]
                    keys = np.concatenate([pk, k.transpose(1, 0, 2)], axis=1)  # (nkv, start + n, hd)
                    values = np.concatenate([pv, v.transpose(1, 0, 2)], axis=1)
                new_caches.append((keys, values))
                mixed = _attention(q, keys, values, start + rows.start, nkv) @ lay.mix_out.T  # (m, H)
            x = x[rows] + mixed  # final-row slicing drops the other rows of the residual here
            f = _rms_norm(x, lay.ffn_norm, eps)
            gu = f @ lay.w13.T  # (m, 2F)
            F = gu.shape[1] // 2
            x = x + (_silu(gu[:, :F]) * gu[:, F:]) @ lay.w2.T
        hidden = _rms_norm(x[-1], self.final_norm, eps)  # (H,)
        return hidden, tuple(new_caches)


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE on (n, heads, hd) with (n, hd/2) tables (HF's layout repeats them for both halves)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def _attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, q_start: int, nkv: int) -> np.ndarray:
    """Causal GQA at batch 1: q (m, nh, hd) at positions q_start.., keys/values (nkv, T, hd) -> (m, nh hd).

    The query heads that share a KV head are stacked into one (group * m, hd) matrix, so each KV head costs
    two GEMMs and K/V are never repeated.
    """
    m, nh, hd = q.shape
    T = keys.shape[1]
    group = nh // nkv
    qg = q.reshape(m, nkv, group, hd).transpose(1, 2, 0, 3).reshape(nkv, group * m, hd)  # (nkv, group m, hd)
    s = np.matmul(qg, keys.transpose(0, 2, 1)) * np.float32(1.0 / np.sqrt(hd))  # (nkv, group m, T)
    s = s.reshape(nkv, group, m, T)
    q_pos = q_start + np.arange(m)
    future = np.arange(T)[None, :] > q_pos[:, None]  # (m, T)
    if future.any():
        s[:, :, future] = -np.inf
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    out = np.matmul(s.reshape(nkv, group * m, T), values)  # (nkv, group m, hd)
    return out.reshape(nkv, group, m, hd).transpose(2, 0, 1, 3).reshape(m, nh * hd)


def _webgpu_executor(ck: Checkpoint, device: str = "webgpu") -> Any:
    from tilewise.model.webgpu import WebGPUExecutor  # no GPU library is imported until a WebGPU model is loaded

    return WebGPUExecutor(ck, device=device)


# device kind -> executor factory, called as factory(checkpoint, device_string) (the string keeps an index, "webgpu:1")
EXECUTORS: dict[str, Any] = {"cpu": CPUExecutor, "webgpu": _webgpu_executor}


# ---------------------------------------------------------------------------------------------------------------
# load


def open_checkpoint(path_or_preset: str | Path, weights: str = "nf4", seed: int = 0) -> Checkpoint:
    """The checkpoint behind a preset name, `default`, or a path, with its matrices in `weights` format."""
    if weights not in FORMATS:
        raise ConfigError(f"unknown weights format {weights!r}", f"use one of {', '.join(FORMATS)}")
    name = str(path_or_preset)
    if name == "default":
        if not ((DEFAULT_MODEL_DIR / "config.json").exists() or (DEFAULT_MODEL_DIR / "model.safetensors").exists()):
            raise TilewiseError(f"no bundled model is present (expected it in {DEFAULT_MODEL_DIR})",
                                f"pass a preset ({', '.join(PRESETS)}) with seeded random weights, or the path of "
                                "an HF LFM2 folder or a tilewise checkpoint")
        ck = Checkpoint.open(DEFAULT_MODEL_DIR)
    elif name in PRESETS and not Path(name).exists():
        return random_checkpoint(PRESETS[name], seed=seed, weights=weights)
    else:
        if not Path(name).exists():
            raise ConfigError(f"{name!r} is neither a model preset nor an existing path",
                              f"use one of {', '.join(PRESETS)}, 'default', or a model folder")
        ck = Checkpoint.open(name)
    return ck if ck.weights == weights else ck.converted(weights)


def load(path_or_preset: str | Path = "default", device: str = "cpu", weights: str = "nf4", seed: int = 0) -> Model:
    """Load a classifier model onto a device.

    Args:
        path_or_preset: `default` (the bundled model), a preset (`lfm2-350m`, `seed-250m`, `tiny`: seeded random
            weights), or a path to an HF LFM2 folder / tilewise checkpoint.
        device: `cpu` (or `auto`, which is the CPU until a GPU executor exists).
        weights: the storage format the matrices run from: `nf4`, `f16` or `f32`.
        seed: the seed of a preset's random weights.

    Returns:
        The Model (prefill / extend / hidden / scores).
    """
    _device_name(device)  # a bad device fails before any weights are read
    ck = open_checkpoint(path_or_preset, weights=weights, seed=seed)
    return from_checkpoint(ck, device=device)


def _device_name(device: str) -> str:
    dev = str(device).split(":", 1)[0]
    if dev not in KNOWN_DEVICES:
        raise ConfigError(f"unknown device {device!r}", f"use one of {', '.join(KNOWN_DEVICES)}")
    if dev == "auto":
        dev = "cpu"
    if dev not in EXECUTORS:
        raise DeviceUnavailable(f"the model runtime has no executor for {dev!r} yet",
                                "use device='cpu' (the CPU executor) for now")
    return dev


def from_checkpoint(ck: Checkpoint, device: str = "cpu") -> Model:
    """Build a Model from an opened (or in-memory) checkpoint; its weights run in the checkpoint's format.

    Args:
        ck: the checkpoint (see `Checkpoint.open`, `Checkpoint.from_arrays`, `Checkpoint.converted`).
        device: as in `load`.

    Returns:
        The Model.
    """
    executor = EXECUTORS[_device_name(device)](ck, str(device))
    head = ck.float32(HEAD).astype(np.float32) if ck.has_head else None
    tokenizer = None
    if ck.tokenizer_path is not None:
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(ck.tokenizer_path))
        except Exception as exc:  # the tokenizers library raises its own exception type
            raise ConfigError(f"cannot read {ck.tokenizer_path}: {exc}", "replace tokenizer.json") from exc
        if tokenizer.get_vocab_size() > ck.config.vocab_size:
            raise ConfigError(f"{ck.tokenizer_path} has {tokenizer.get_vocab_size()} tokens but the model's vocabulary"
                              f" is {ck.config.vocab_size}", "use the tokenizer that belongs to the model")
    return Model(ck, executor, head, tokenizer)
