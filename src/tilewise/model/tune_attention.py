"""Tuning the classifier's ops other than its matmuls, at the decision length: attention (the executor's kernel
and, on a device with subgroup matrices, the subgroup-matrix kernel beside it) and the short conv. Every candidate
is verified and timed by the one engine; `tune_model` (`model/tune.py`) puts the fastest into the dispatch
table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tilewise.errors import ConfigError
from tilewise.kernels.attention import cuda as attn_cuda
from tilewise.kernels.attention import sgmat as attn_sg
from tilewise.kernels.attention import webgpu as attn_k
from tilewise.kernels.matmul.sgmat import has_subgroup_matrices
from tilewise.kernels.space import Config
from tilewise.model.dispatch import attention_shape, conv_shape, conv_template
from tilewise.model.runtime import block_rows
from tilewise.tune.dispatch import Range
from tilewise.tune.engine import Engine, Item
from tilewise.tune.store import Store

ATTENTION_MEASURE = {"warmup": 2, "min_rounds": 6, "max_rounds": 25, "budget_s": 1.0}


def tune_attention(dev: Any, cfg: Any, seq: int, seed: int, store: Store | None = None,
                   force: bool = False, budget: int | None = None, *, run: Any,
                   what: str = "attention", queries: int | None = None, first: Sequence[tuple[Any, Config]] = (),
                   make_engine: Callable[..., Engine] = Engine) -> tuple[Any, dict[str, Any], float]:
    """The fastest verified attention kernel and tile at the decision length (at most `budget` tiles per kernel,
    each kernel's default first), or with `queries`, for the last `queries` of its `seq` positions (the earlier
    ones cached), `first` (template, config) pairs raced before the rest: (template, config values, median ms)."""
    shape = attention_shape(cfg, seq) if queries is None else attention_shape(cfg, queries, seq - queries)
    items, seen = [], set()
    for t, c in [*first, *attention_items(dev, budget, shape)]:
        if (t.name, c) not in seen:
            seen.add((t.name, c))
            items.append(Item(t, c, shape))
    return _fastest(dev, items, "attention tile", shape[0], seed, store, force, run, what, make_engine)


def tail_queries(cfg: Any, seq: int) -> list[int]:
    """The query counts below `seq` at which a `seq`-token decision runs an attention block (`runtime.block_rows`:
    the last attention block's queries are only the rows the last row reaches; lfm2-350m's block 14 has 3, a model
    ending in attention 1)."""
    plan = block_rows(cfg.layer_types, cfg.conv_L_cache, seq, True)
    return sorted({b.outputs for kind, b in zip(cfg.layer_types, plan) if kind == "full_attention" and b.outputs < seq})


def attention_ranges(dev: Any, cfg: Any, seq: int, seed: int, log: Callable[[str], None], key: str,
                     **kw: Any) -> tuple[list[Range], Any]:
    """The attention entry's ranges and the template tuned at `seq`: that tile for every query count above the
    tail's, and each tail query count (`tail_queries`) its own, tuned with the keys before its queries cached and
    the `seq` winner raced first (so the tail never takes a tile slower than it)."""
    tpl, values, ms = tune_attention(dev, cfg, seq, seed, what=f"attention ({key}, {seq} rows)", **kw)
    log(f"attention at {seq} rows: {tpl.name} {values} {ms:.4f} ms")
    ranges, lo = [], 1
    for q in tail_queries(cfg, seq):
        tq, vq, msq = tune_attention(dev, cfg, seq, seed, what=f"attention ({key}, {q} of {seq} rows)", queries=q,
                                     first=[(tpl, tpl.config_of(values))], **kw)
        log(f"attention at {q} queries after {seq - q} cached: {tq.name} {vq} {msq:.4f} ms")
        ranges.append(Range(lo, q, (tq.name, tq.config_of(vq))))
        lo = q + 1
    return [*ranges, Range(lo, seq, (tpl.name, tpl.config_of(values)))], tpl


def tune_conv(dev: Any, cfg: Any, seq: int, seed: int, store: Store | None = None,
              force: bool = False, budget: int | None = None, *, run: Any, what: str = "shortconv",
              make_engine: Callable[..., Engine] = Engine) -> tuple[Any, dict[str, Any], float]:
    """The fastest verified short-conv config at the decision length, the default first: (template, config
    values, median ms)."""
    shape = conv_shape(cfg, seq)
    items = [Item(conv_template(dev.info.backend), c, shape) for c in conv_candidates(dev, budget)]
    return _fastest(dev, items, "short-conv config", seq, seed, store, force, run, what, make_engine)


def conv_candidates(dev: Any, budget: int | None) -> list[Config]:
    """The short conv's default, then the rest of its space legal on the device, at most `budget`: the default's
    width with every RT first (longest runs first), then the other widths."""
    t = conv_template(dev.info.backend)
    default = t.default_config()
    width = {k: v for k, v in default.items() if k != "RT"}
    rest = sorted(t.space().legal(dev.info.limits),
                  key=lambda c: ({k: v for k, v in c.items() if k != "RT"} != width, -c["RT"]))
    return list(dict.fromkeys([default, *rest]))[:budget]


def _fastest(dev: Any, items: list[Item], noun: str, seq: int, seed: int, store: Store | None, force: bool,
             run: Any, what: str, make_engine: Callable[..., Engine]) -> tuple[Any, dict[str, Any], float]:
    eng = make_engine(dev, store, force=force, seed=seed, measure_kw=ATTENTION_MEASURE)
    outcomes = run.evaluate(eng, items, what)
    ok = [oc for oc in outcomes if oc.status == "ok" and oc.stats is not None]
    if not ok:
        raise ConfigError(f"no {noun} ran correctly at {seq} rows: "
                          + "; ".join(f"{oc.config}: {oc.status}" for oc in outcomes[:4]),
                          "report this with `tilewise devices --json`")
    best = min(ok, key=lambda oc: oc.stats.median_ms)  # type: ignore[union-attr]
    return best.item.kernel, dict(best.config), best.stats.median_ms  # type: ignore[union-attr]


def attention_template(dev: Any) -> Any:
    """The attention kernel of the device's executor."""
    return attn_cuda.CudaAttention() if dev.info.backend == "cuda" else attn_k.AttentionTemplate()


def attention_candidates(dev: Any, budget: int | None, shape: tuple[int, ...]) -> list[Config]:
    """The default tile (on CUDA: `default_attention` at `shape`, (M, P, HQ, HKV, D)), then the hand-picked ones,
    then the rest."""
    t = attention_template(dev)
    cuda = dev.info.backend == "cuda"
    default = t.config_of(attn_cuda.default_attention(dev.info.limits, shape) if cuda else attn_k.DEFAULT_ATTN)
    seeds = t.space("seed").legal(dev.info.limits) if cuda else []  # CUDA: the hand-picked tiles before the rest
    legal = t.space().legal(dev.info.limits)
    return list(dict.fromkeys([default, *seeds, *legal]))[:budget]


def attention_items(dev: Any, budget: int | None, shape: tuple[int, ...]) -> list[tuple[Any, Config]]:
    """(template, config) of every attention candidate: the executor's kernel (`attention_candidates`), then on a
    device with subgroup matrices the subgroup-matrix kernel: its default, its seeds, then the rest of its space,
    those legal here (at most `budget` per kernel)."""
    out = [(attention_template(dev), c) for c in attention_candidates(dev, budget, shape)]
    if dev.info.backend != "cuda" and has_subgroup_matrices(dev):
        t = attn_sg.SgmatAttention(dev.enabled_features)
        legal = t.space().legal(dev.info.limits)
        here = set(legal)
        first = [t.default_config(), *(t.config_of(s) for s in attn_sg.SEEDS)]  # kept where legal here
        ordered = [c for c in dict.fromkeys([*first, *legal]) if c in here and not t.config_problems(c, shape)]
        out += [(t, c) for c in ordered[:budget]]
    return out
