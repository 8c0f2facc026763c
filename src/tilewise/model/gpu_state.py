"""What the GPU executors (`model/webgpu.py`, `model/cuda.py`) share: the GPU side of a State (K/V and conv caches,
pooled per capacity and handed back when the State is collected), a decision's labelled launch list, and the checks
every decision passes before it is planned."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilewise.devices.base import Buffer, Launch
from tilewise.errors import ConfigError, LaunchError
from tilewise.model.checkpoint import HEAD
from tilewise.model.runtime import block_rows, tail_capacity

MIN_CACHE_POSITIONS = 512
MAX_CACHED_PLANS = 64  # decision plans kept per executor (a game uses a handful of prompt lengths)


@dataclass(eq=False)
class GPUCaches:
    """The GPU side of a State: K/V rows per attention layer, last conv_L_cache-1 Bx rows per conv layer."""

    capacity: int  # positions the K/V buffers hold
    kv: dict[int, tuple[Buffer, Buffer]]  # layer -> (k, v), each (capacity, Hkv * D) f32
    conv: dict[int, Buffer]  # layer -> (L - 1, H) f32
    generation: int
    n_tokens: int = 0
    scores: np.ndarray | None = None  # (labels,) computed on the GPU (the Model recomputes from hidden)
    #: (pool, weak reference to the executor) the buffers go back to when this is collected (`take_caches`)
    home: tuple[list[tuple[Any, Any]], Any] | None = field(default=None, repr=False)

    def __del__(self) -> None:
        # __del__ rather than weakref.finalize: this runs once per decision, in series with the GPU, and costs a
        # tenth of a finalizer's registration and call
        if self.home is not None:
            free, owner = self.home
            ex = owner()
            if ex is not None and ex.generation == self.generation:
                free.append((self.kv, self.conv))


class Plan:
    """Launches of one decision, with an op label per launch (for per-op timing); the CUDA executor keeps the plan's
    captured graph on it (`graph`: None until the first run, False where it runs launch by launch), so the graph
    is dropped with the plan."""

    def __init__(self, tokens: int = 0) -> None:
        self.launches: list[Launch] = []
        self.labels: list[str] = []
        self.tokens = tokens  # token ids the decision writes before its launches
        self.graph: Any = None
        self.graph_pdl = False  # whether `graph` was captured with programmatic dependent launch
        self.zero_copy = False  # the kernels read the ids from and write the result row into pinned host arrays
        self.keep: list[Any] = []  # buffers only this plan's launches read (`fuse_rope`'s RopeOut records)

    def add(self, label: str, launches: Launch | Sequence[Launch]) -> None:
        for launch in [launches] if isinstance(launches, Launch) else launches:
            self.launches.append(launch)
            self.labels.append(label)


def cache_capacity(positions: int, max_positions: int) -> int:
    """Positions a cache (or RoPE table) is made for: a power of two of at least `MIN_CACHE_POSITIONS`, so a few
    sizes serve every prompt length."""
    return min(max(MIN_CACHE_POSITIONS, 1 << (positions - 1).bit_length()), max_positions)


def begin_decision(ex: Any, n: int, start: int, caches: GPUCaches | None, runtime: str,
                   check_fits: Callable[[str, int], None] | None = None) -> GPUCaches:
    """What every decision of executor `ex` does before its launches are planned: refuse caches from before a device
    loss and sequences longer than the model's positions, grow the row buffers and the RoPE table (`ex._ensure_rows`,
    `ex._ensure_rope`), and take the new state's caches from the pool."""
    if caches is not None and caches.generation != ex.generation:
        raise LaunchError(f"this state was made before the {runtime} device was lost and rebuilt; its caches are gone",
                          "prefill the prompt again")
    if start + n > ex.cfg.max_position_embeddings:
        raise ConfigError(f"sequence of {start + n} tokens exceeds the model's {ex.cfg.max_position_embeddings} "
                          "positions", "shorten the prompt")
    ex._ensure_rows(n)
    ex._ensure_rope(start + n)
    new = take_caches(ex, start + n, check_fits)
    new.n_tokens = start + n
    return new


def keep_plan(plans: dict[tuple[Any, ...], Plan], key: tuple[Any, ...], plan: Plan) -> Plan:
    """`plan` kept in an executor's plan cache under `key`; the cache starts over when it holds MAX_CACHED_PLANS."""
    if len(plans) >= MAX_CACHED_PLANS:
        plans.clear()
    plans[key] = plan
    return plan


def take_caches(ex: Any, positions: int, check_fits: Callable[[str, int], None] | None = None) -> GPUCaches:
    """Caches for `positions` from executor `ex`'s pool (`ex._pool`: capacity -> [(kv, conv)], `ex.dev`, `ex.cfg`,
    `ex.generation`), made when the pool has none; their buffers go back to the pool when the State holding them is
    collected, unless the executor has been rebuilt since (never freed)."""
    cfg = ex.cfg
    cap = cache_capacity(positions, cfg.max_position_embeddings)
    free = ex._pool.setdefault(cap, [])
    if free:
        kv, conv = free.pop()
    else:
        kv_bytes = 4 * cap * cfg.num_key_value_heads * cfg.head_dim
        if check_fits is not None:
            check_fits("KV cache of one attention layer", kv_bytes)
        kv = {i: (ex.dev.allocate(kv_bytes), ex.dev.allocate(kv_bytes))
              for i, t in enumerate(cfg.layer_types) if t == "full_attention"}
        conv = {i: ex.dev.allocate(4 * (cfg.conv_L_cache - 1) * cfg.hidden_size)
                for i, t in enumerate(cfg.layer_types) if t == "conv"}
    return GPUCaches(cap, kv, conv, ex.generation, home=(free, weakref.ref(ex)))


def tail_buffers(cfg: Any, alloc: Callable[[int], Buffer]) -> dict[str, Buffer]:
    """The residual rows (x1, x2, in turn) and FFN rows (g1) of the sliced blocks after the last attention block,
    sized for the most rows one of them outputs (`runtime.tail_capacity`; one row where the last block is one)."""
    rows = tail_capacity(cfg.layer_types, cfg.conv_L_cache)
    return {"x1": alloc(4 * rows * cfg.hidden_size), "x2": alloc(4 * rows * cfg.hidden_size),
            "g1": alloc(4 * rows * cfg.ffn_dim)}


def weight_bytes(embed: Any, final_norm: Buffer, head: Buffer, layers: Sequence[dict[str, Any]]) -> int:
    """Bytes of weights on the device: buffers, and lists or dicts of buffers, of the embedding and every layer."""

    def size(v: Any) -> int:
        if isinstance(v, Buffer):
            return v.nbytes
        if isinstance(v, dict):
            v = list(v.values())
        return sum(size(b) for b in v) if isinstance(v, (list, tuple)) else 0

    return size(embed) + final_norm.nbytes + head.nbytes + sum(size(v) for lay in layers for v in lay.values())


class GPUResult:
    """What the GPU executors share once a decision's result row is read: the row split into the hidden state and
    the scores, and the weights' size on the device (their `cfg`, `has_head`, `embed`, `final_norm`, `head` and
    `layers` set by `upload_model`)."""

    cfg: Any
    has_head: bool
    embed: Any
    final_norm: Buffer
    head: Buffer
    layers: list[dict[str, Any]]

    def split_result(self, res: np.ndarray, new: GPUCaches) -> tuple[np.ndarray, GPUCaches]:
        """((hidden,) final-normed last hidden state, `new` with its scores) from the result row (hidden + labels,)."""
        H = self.cfg.hidden_size
        # views: `res` is the executor's own copy of the row, made for this decision
        new.scores = res[H:] if self.has_head else None
        return res[:H], new

    def weight_bytes(self) -> int:
        """Bytes of weights on the device."""
        return weight_bytes(self.embed, self.final_norm, self.head, self.layers)


def upload_model(ex: Any, upload: Callable[[str, np.ndarray], Buffer],
                 matrix: Callable[[Sequence[str], bool], Any]) -> None:
    """Put a checkpoint's weights on a GPU executor `ex` (its `checkpoint`, `cfg`): sets `embed`, `final_norm`,
    `has_head`, `head` (zeros for a model without one), `zero_conv_state` (L - 1, H) and `layers`, one dict a block
    with its kind, both norms, `w1`, `w3`, `w2` and the mixer's: `in_proj`, `out_proj`, `taps` (H, L) for a conv
    block, the stacked `qkv`, `out_proj`, `q_norm`, `k_norm` for an attention block. `upload(name, array)` puts one
    array on the device; `matrix(names, is_matmul)` the rows of the named stored matrices stacked into one, in the
    executor's own layout (`is_matmul` False for the embedding, which no matmul reads)."""
    cfg, ck = ex.cfg, ex.checkpoint
    H, L = cfg.hidden_size, cfg.conv_L_cache

    def vec(name: str) -> Buffer:
        return upload(name, ck.float32(name))

    ex.embed = matrix(["embed_tokens.weight"], False)
    ex.final_norm = vec("embedding_norm.weight")
    ex.has_head = ck.has_head
    head = ck.float32(HEAD) if ck.has_head else np.zeros((cfg.num_labels, H), np.float32)
    ex.head = upload(HEAD, head.astype(np.float32))
    ex.layers = []
    for i, kind in enumerate(cfg.layer_types):
        p = f"layers.{i}."
        lay: dict[str, Any] = {"kind": kind, "operator_norm": vec(p + "operator_norm.weight"),
                               "ffn_norm": vec(p + "ffn_norm.weight")}
        for w in ("w1", "w3", "w2"):
            lay[w] = matrix([f"{p}feed_forward.{w}.weight"], True)
        if kind == "conv":
            lay["in_proj"] = matrix([p + "conv.in_proj.weight"], True)
            lay["out_proj"] = matrix([p + "conv.out_proj.weight"], True)
            lay["taps"] = upload(p + "conv.conv.weight", ck.float32(p + "conv.conv.weight").reshape(H, L))
        else:
            a = p + "self_attn."
            lay["qkv"] = matrix([a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"], True)
            lay["out_proj"] = matrix([a + "out_proj.weight"], True)
            lay["q_norm"] = vec(a + "q_layernorm.weight")
            lay["k_norm"] = vec(a + "k_layernorm.weight")
        ex.layers.append(lay)
    ex.zero_conv_state = upload("conv state", np.zeros((L - 1, H), np.float32))


def plan_blocks(ex: Any, plan: Plan, n: int, start: int, caches: GPUCaches | None, new: GPUCaches,
                final_row_slicing: bool) -> tuple[Buffer, int]:
    """Add a decision's blocks to `plan` through a GPU executor's launch makers; returns (residual buffer, rows): the
    last rows of the residual stream, from row 0, which the head reads. The executor supplies `act` (its activation
    buffers), `layers` (as `upload_model` made them, with gate and up joined into `w13` the way its gate/up matmul
    takes them), `zero_conv_state` and `_matmul`, `_copy`, `_mix_conv(plan, lay, rows, state_in, state_out)`
    (the short conv of a conv block's in_proj output in `big`, into `y`) and `_mix_attention(plan, lay, n, start,
    queries, k_cache, v_cache)` (after the qkv matmul into `big`: q/k norm + RoPE into q and the cache, attention of
    the last `queries` rows into `y`). Final-row slicing (`runtime.block_rows`): the blocks after the last attention
    block run their output projection and FFN on the rows the last row reaches back to."""
    cfg, a = ex.cfg, ex.act
    H, F, L = cfg.hidden_size, cfg.ffn_dim, cfg.conv_L_cache
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    res, res_rows = a["x"], n  # the residual stream: the new tokens' last res_rows rows, from row 0 of res
    for i, (lay, br) in enumerate(zip(ex.layers, block_rows(cfg.layer_types, L, n, final_row_slicing))):
        if lay["kind"] == "conv":
            r = br.inputs  # a sliced block needs Bx of its output rows and the L - 1 rows before them only
            ex._matmul(plan, "conv.in_proj", "none", res, res_rows - r, r, lay["in_proj"], a["big"], 3 * H, H,
                       norm=lay["operator_norm"])
            ex._mix_conv(plan, lay, r, caches.conv[i] if caches is not None else ex.zero_conv_state, new.conv[i])
            mix_row0, proj, k_in = r - br.outputs, "conv.out_proj", H
        else:
            assert res_rows == n, "an attention block takes every row: its K and V go into the cache"
            ex._matmul(plan, "attn.qkv", "none", res, 0, n, lay["qkv"], a["big"], (hq + 2 * hkv) * d, H,
                       norm=lay["operator_norm"])
            ex._mix_attention(plan, lay, n, start, br.outputs, *new.kv[i])
            mix_row0, proj, k_in = 0, "attn.out_proj", hq * d
        if br.outputs < res_rows:  # only the last rows continue: their residual rows move to a buffer of their own
            dst = a["x2"] if res is a["x1"] else a["x1"]
            ex._copy(plan, "copy.last_rows", res, (res_rows - br.outputs) * H, dst, 0, br.outputs * H)
            res, res_rows = dst, br.outputs
        ex._matmul(plan, proj, "residual", a["y"], mix_row0, res_rows, lay["out_proj"], res, H, k_in)
        gbuf = a["g1"] if res_rows < n else a["big"]
        ex._matmul(plan, "ffn.gate_up", "swiglu", res, 0, res_rows, lay["w13"], gbuf, F, H, norm=lay["ffn_norm"])
        ex._matmul(plan, "ffn.down", "residual", gbuf, 0, res_rows, lay["w2"], res, H, F)
    return res, res_rows
