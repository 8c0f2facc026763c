"""`tilewise tune model`: measure every matmul shape the classifier runs, across row counts, and write the
dispatch table the WebGPU executor loads (per-shape row ranges -> short-row or tiled kernel and config).

For each (epilogue, N, K) of the model (conv in/out projections, q/k/v and out projections, paired gate/up
with SwiGLU, down with the residual), candidates of both kernels are compiled once and verified once against
the float64 reference (every output value, NaN-poisoned outputs); then at each row count M (1..512 plus
the decision's lengths) all surviving candidates are timed interleaved with the tuner's `measure`, and the
tuner's `fit_dispatch` turns the per-M medians into the fewest row ranges within 3% of the per-M best. The
measured cutoff (where the tiled kernel takes over) is printed per shape: seed 001 found 96 on an M1 Max.
Attention's query/key tile is tuned at the decision length.

A table is keyed by the device fingerprint and the kernels' version; the executor ignores (with a warning)
a table from another device or from other kernels, and falls back to safe defaults.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tilewise.errors import ConfigError

DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 64, 95, 96, 128, 192, 256, 384, 512)


def model_matmuls(cfg: Any) -> dict[str, tuple[str, int, int, bool]]:
    """op label -> (epilogue, N, K, fused RMSNorm) for every matmul the executor issues."""
    H, F = cfg.hidden_size, cfg.ffn_dim
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    out = {"ffn.gate_up": ("swiglu", F, H, True), "ffn.down": ("residual", H, F, False)}
    if "conv" in cfg.layer_types:
        out["conv.in_proj"] = ("none", 3 * H, H, True)
        out["conv.out_proj"] = ("residual", H, H, False)
    if "full_attention" in cfg.layer_types:
        out["attn.qkv"] = ("none", (hq + 2 * hkv) * d, H, True)
        out["attn.out_proj"] = ("residual", H, hq * d, False)
    return out


# hand-picked starting points (big per-thread tiles did best on an H200 in the design probe: 8x8 per thread),
# measured next to a random sample of the space; illegal ones (e.g. 8x8 paired with F16A: 192 accumulator
# registers, or a prefetch needing more than 32 registers) drop out. Keys left out take PF=0 and CL="block".
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
# 192 columns: the gate/up pair's fastest tile at 299 rows in the fitted-tile run on the H200
# (bench/results/matmul_tiles/2026-12-01-h200-lfm2-350m-tiles.md)
_SEED_TILED_WIDE = [{"BM": 64, "BN": 192, "BK": 16, "TM": 8, "TN": 4, "PF": 1}]
# no double-buffered (DB=1) seeds: the 18 tried lost at every shape and row count on the H200 and made tuning
# 25% longer (bench/results/decision_webgpu/summary-db-alternate.md); the random sample still draws DB=1 configs
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
    # eight K slices of a 64x128 tile: the fitted-tile run's fastest at 1024x1024 and 3072x1024 (346 rows)
    (64, 128, 32, 8, 8, 8), (64, 64, 32, 8, 4, 4))]
# UK=1 (the K step's loop unrolled in the source) on the H200 (bench/results/matmul_variants/): 1.05-1.3x on most
# split-K tiles, 0.87x on a few; 0.93-1.04x on the tiled gate/up pair (1.03-1.04x on its 128-column K-step-32
# tiles). Each prefetching split-K seed is offered both ways, the tiled seeds only on those tiles.
SEED_SPLITK: tuple[dict[str, Any], ...] = (*(dict(zip(_SPLIT, v)) for v in (
    (64, 64, 16, 4, 4, 2), (64, 64, 16, 4, 4, 4), (64, 64, 32, 4, 4, 2), (64, 64, 32, 4, 4, 4),
    (64, 64, 16, 8, 8, 4), (128, 64, 16, 8, 4, 4), (32, 64, 16, 4, 4, 2), (64, 32, 16, 4, 4, 4))),
    *_SPLITK_PF, *({**v, "UK": 1} for v in _SPLITK_PF))
# tiles whose row count splits the decision's rows into a few blocks with little padding (346 rows: 2 x 176,
# 3 x 120, 4 x 88 instead of 3 x 128 = 384), with column counts that fill the GPU in whole waves; the fastest of
# this family in the fitted-tile run on the H200 (bench/results/matmul_tiles/): 176x72 for the gate/up pair,
# 176x128 and 88x128 in eight K slices for the down projection. `fitted_seeds(seq, kind)` sizes them.
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


VERIFY_REUSE = 8  # consecutive candidate checks that share one input set in `tune_matmul`


def candidates(template: Any, limits: Any, n: int, seed: int, hand_picked: bool = True,
               seq: int | None = None) -> list[Any]:
    """The default config, the hand-picked seeds (with `seq`, also those fitted to a `seq`-row decision) and a
    seeded sample of `n` legal configs of the template's space."""
    space = template.space()
    out = [template.default_config()]
    if not hand_picked:
        seeds: list[dict[str, Any]] = []
    elif template.kind in ("tiled", "splitk"):
        # the template's own f16 settings (one value each); prefetch and columns default to today's kernel
        fixed = {k: space.params[k][0] for k in ("F16S", "F16A") if k in space.params}
        picked = [*(SEED_TILED if template.kind == "tiled" else SEED_SPLITK),
                  *(fitted_seeds(seq, template.kind) if seq else [])]
        seeds = [{"PF": 0, "CL": "block", "DB": 0, "UK": 0, **v, **fixed} for v in picked]
    else:
        seeds = [dict(zip(("WG", "NC", "RM", "EL"), v)) for v in SEED_ROWS]
    out += [space.config(v) for v in seeds]
    for c in space.sample(n if template.kind != "splitk" else max(1, n // 2), seed=seed, limits=limits):
        if c not in out:
            out.append(c)
    uniq: list[Any] = []
    for c in out:
        if c not in uniq and space.is_legal(c, limits):
            uniq.append(c)
    return uniq


def tune_matmul(dev: Any, fmt: str, epilogue: str, n: int, k: int, rows: list[int], n_cand: int, seed: int,
                log: Any, hand_picked: bool = True, f16_arith: bool = False, norm: bool = False,
                eps: float = 1e-5, configs: Callable[[Any], list[Any]] | None = None,
                keep_times: bool = False, seq: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Measure both kernels across `rows`; returns (dispatch segments, measurements for the record).

    With `f16_arith` (and shader-f16) the tiled and split-K kernels' f16-staging + f16-FMA variants compete too,
    verified under the f16 tolerance. `seq` (the decision length) adds the seeds fitted to it. `configs(template)`,
    when given, replaces `candidates` (a template it gives nothing is skipped); `keep_times` adds every
    candidate's median per row count (`times_ms`).
    """
    from tilewise.kernels import matmul as mm
    from tilewise.kernels.space import Config
    from tilewise.tune.dispatch import fit_dispatch
    from tilewise.tune.measure import measure
    from tilewise.tune.verify import Verifier

    rng = np.random.default_rng(seed)
    max_m = max(rows)
    keep: list[Any] = []
    cand: dict[Config, tuple[Any, Any, Any]] = {}  # tagged config -> (template, config, program)
    bufs_of: dict[str, Any] = {}
    failures: dict[str, str] = {}
    kinds = [k for k in mm.KINDS if not (k == "splitk" and max(rows) < 64)]  # split-K only pays with many rows
    templates = [mm.MatmulTemplate(kind, fmt, epilogue, dev.enabled_features, norm=norm, eps=eps) for kind in kinds]
    if f16_arith and "shader-f16" in dev.enabled_features:
        # f16 FMAs in both many-row kernels: the split-K one serves the long-K down projections
        templates += [mm.MatmulTemplate(kind, fmt, epilogue, dev.enabled_features, True, True, norm=norm, eps=eps)
                      for kind in kinds if kind != "rows"]
    seconds = {"compile": 0.0, "verify": 0.0, "inputs": 0.0, "measure": 0.0}  # where a shape's tuning time goes
    for t in templates:
        kind = t.kind
        todo = candidates(t, dev.info.limits, n_cand, seed, hand_picked, seq) if configs is None else configs(t)
        if not todo:
            continue
        check_m = 97 if max_m >= 97 else max_m
        # eight candidates share one random input set (outputs re-poisoned for each): making the NF4 weights of a
        # 4608x1024 pair takes 0.6 s, more than compiling a candidate, and was most of a model's tuning time
        ver = Verifier(t, dev, (check_m, n, k), rng, reuse=VERIFY_REUSE)
        for c in todo:
            tag = Config((("kind", kind), *c.items()))
            probs = t.shape_problems(c, (max_m, n, k))
            if probs:
                failures[tag.key()] = "illegal: " + "; ".join(probs)
                continue
            t0 = time.perf_counter()
            try:
                prog = t.compile(dev, c, (max_m, n, k))
                t1 = time.perf_counter()
                seconds["compile"] += t1 - t0
                chk = ver.check(prog, c)
                seconds["verify"] += time.perf_counter() - t1
            except Exception as exc:  # a failing candidate is a result, never the end of the sweep
                failures[tag.key()] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                continue
            if not chk.ok:
                failures[tag.key()] = "wrong: " + chk.message
                continue
            cand[tag] = (t, c, prog)
        keep.append(ver)
        t0 = time.perf_counter()
        host = t.make_inputs((max_m, n, k), rng)
        bufs_of[t.name] = t.upload(dev, host, (max_m, n, k))
        seconds["inputs"] += time.perf_counter() - t0
    if not cand:
        raise ConfigError(f"no matmul candidate ran for {fmt} {epilogue} {n}x{k}: {failures}",
                          "report this with `tilewise devices --json`")
    times: dict[Config, dict[int, float]] = {tag: {} for tag in cand}
    t_measure = time.perf_counter()
    for m in rows:
        launches = {}
        for tag, (t, c, prog) in cand.items():
            bufs = dict(bufs_of[t.name])
            bufs["dims"] = dev.upload(np.array([m, 0, 0, 0], np.uint32), uniform=True)
            keep.append(bufs["dims"])
            launches[tag] = t.launches(prog, bufs, c, (m, n, k))
        meas = measure(dev, launches, warmup=2, min_rounds=6, max_rounds=20, budget_s=0.4, rng=rng)
        for tag, st in meas.stats.items():
            times[tag][m] = st.median_ms
    seconds["measure"] = time.perf_counter() - t_measure
    ranges = fit_dispatch(times, rows, tolerance=0.03)
    segments = []
    for i, r in enumerate(ranges):
        cfg = dict(r.config)
        kind = cfg.pop("kind")
        segments.append({"min_rows": r.m_min, "max_rows": None if i == len(ranges) - 1 else r.m_max,
                         "kind": kind, "config": cfg})
    best = {m: min(times, key=lambda tg, m=m: times[tg].get(m, float("inf"))) for m in rows}
    record = {"rows": rows, "best_ms": {m: times[best[m]][m] for m in rows},
              "best": {m: best[m].key() for m in rows}, "failures": failures,
              "candidates": [tg.key() for tg in cand], "seconds": {a: round(b, 4) for a, b in seconds.items()}}
    if keep_times:
        record["times_ms"] = {tg.key(): {m: times[tg][m] for m in rows} for tg in cand}
    del keep
    return segments, record


def tune_attention(dev: Any, cfg: Any, seq: int, seed: int) -> tuple[dict[str, Any], float]:
    from tilewise.kernels import attention as attn_k
    from tilewise.tune.measure import measure
    from tilewise.tune.verify import Verifier

    t = attn_k.AttentionTemplate()
    shape = (seq, 0, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
    rng = np.random.default_rng(seed)
    ver = Verifier(t, dev, shape, rng)
    launches = {}
    progs = []
    for c in t.space().legal(dev.info.limits):
        prog = t.compile(dev, c, shape)
        progs.append(prog)
        if ver.check(prog, c).ok:
            launches[c] = t.launches(prog, ver.buffers(), c, shape)
    meas = measure(dev, launches, warmup=2, min_rounds=6, max_rounds=25, budget_s=1.0, rng=rng)
    best = min(meas.stats, key=lambda c: meas.stats[c].median_ms)
    return dict(best), meas.stats[best].median_ms


def tune_model(dev: Any, cfg: Any, seq: int = 346, fmt: str = "nf4", *, rows: Any = None, n_cand: int = 12,
               seed: int = 0, force: bool = False, hand_picked: bool = True, f16_arith: bool = False,
               path: Any = None, log: Any = print) -> Any:
    """Tune every matmul shape and the attention tile of a model config on a device; returns the DispatchTable.

    Args:
        dev: a WebGPU device.
        cfg: the ModelConfig.
        seq: the decision length (its rows, and seq - 47, are measured besides `rows`).
        fmt: weight format.
        rows: row counts to measure (default `DEFAULT_ROWS`).
        n_cand: random legal configs per kernel next to the default and the hand-picked ones.
        seed: inputs and sampling.
        force: re-measure shapes the table at `path` already holds.
        hand_picked: include `SEED_TILED` / `SEED_SPLITK` / `SEED_ROWS` and the seeds fitted to `seq`.
        f16_arith: let the f16-arithmetic tiled and split-K variants compete (f16 tolerance; a table of its own).
        path: where the table lives (default: `dispatch_path(fingerprint)`, with `-f16a` for f16_arith).
        log: progress printer.

    Returns:
        The table, saved at `path` after every shape.
    """
    from pathlib import Path

    from tilewise.model.webgpu import DispatchTable, dispatch_path, kernel_version, matmul_key

    fp = dev.info.fingerprint
    rows = sorted(set(rows or DEFAULT_ROWS) | {seq, max(1, seq - 47)})
    if path is None:
        path = dispatch_path(fp)
        if f16_arith:
            path = path.with_name(path.stem + "-f16a.json")
    path = Path(path)
    log(f"tuning {cfg.name} ({fmt}{', f16 arithmetic allowed' if f16_arith else ''}) on {dev.info.name} [{fp}] "
        f"at rows {rows}")
    if "cooperative-matrix" in dev.info.features:
        log("cooperative-matrix is advertised but skipped: wgpu-py 0.32 cannot enable experimental features and "
            "wgpu-native implements only 8x8 f32 fragments")
    if f16_arith and "shader-f16" not in dev.enabled_features:
        log("f16 arithmetic skipped: this adapter has no shader-f16")
    # shapes this device already has (from another preset of the same width) are kept unless force
    table = DispatchTable.load_for(fp, path, quiet=True) if path.exists() else DispatchTable(fp, kernel_version())
    table.source = "tuned"
    for label, (epilogue, n, k, norm) in model_matmuls(cfg).items():
        if matmul_key(fmt, epilogue, n, k, norm) in table.matmul and not force:
            log(f"{label} ({epilogue}, N={n}, K={k}): already tuned on this device (force re-measures)")
            continue
        segs, record = tune_matmul(dev, fmt, epilogue, n, k, rows, n_cand, seed, log, hand_picked=hand_picked,
                                   f16_arith=f16_arith, norm=norm, eps=cfg.norm_eps, seq=seq)
        table.matmul[matmul_key(fmt, epilogue, n, k, norm)] = segs
        table.measured[f"{label} {n}x{k}"] = record
        table.save(path)  # each shape as soon as it is measured: an interrupted run keeps what it did
        cut = next((sg["min_rows"] for sg in segs if sg["kind"] != "rows"), None)
        desc = ", ".join(f"{sg['min_rows']}-{sg['max_rows'] or '...'}: {sg['kind']} "
                         f"{','.join(f'{a}={b}' for a, b in sg['config'].items())}" for sg in segs)
        log(f"{label} ({epilogue}, N={n}, K={k}): tiled from {cut if cut else 'never'} rows; {desc}")
        log(f"    best ms at rows {seq}: {record['best_ms'][seq]:.4f}; at 1: {record['best_ms'][1]:.4f}; "
            f"{len(record['candidates'])} candidates ran, {len(record['failures'])} refused or failed; seconds: "
            + ", ".join(f"{a} {b:.1f}" for a, b in record["seconds"].items()))
    attn_cfg, attn_ms = tune_attention(dev, cfg, seq, seed)
    table.ops["attention"] = attn_cfg
    log(f"attention at {seq} rows: {attn_cfg} {attn_ms:.4f} ms")
    table.save(path)
    table.source = str(path)
    log(f"wrote dispatch table {path}")
    return table


def run(args: argparse.Namespace) -> int:
    """`tilewise tune model --preset P --seq 346 --device webgpu [--weights nf4] [--budget N] [--force]`."""
    from pathlib import Path

    import tilewise
    from tilewise.model.config import ModelConfig, preset

    name = getattr(args, "preset", None) or "seed-250m"
    seq = int(getattr(args, "seq", None) or 346)
    fmt = getattr(args, "weights", None) or "nf4"
    device = getattr(args, "device", None) or "webgpu"
    if not str(device).startswith("webgpu"):
        raise ConfigError(f"`tilewise tune model` tunes the WebGPU executor, not {device!r}", "pass --device webgpu")
    if fmt not in ("nf4", "f16", "f32"):
        raise ConfigError(f"unknown weight format {fmt!r}", "use --weights nf4, f16 or f32")
    if seq < 1:
        raise ConfigError(f"--seq {seq} must be positive", "use e.g. --seq 346")
    cfg = ModelConfig.from_file(Path(name) / "config.json") if Path(name).is_dir() else preset(name)
    dev = tilewise.get_device(device)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    table = tune_model(dev, cfg, seq, fmt, rows=getattr(args, "rows", None),
                       n_cand=int(getattr(args, "budget", None) or 12), seed=int(getattr(args, "seed", 0) or 0),
                       force=bool(getattr(args, "force", False)), hand_picked=getattr(args, "hand_picked", True),
                       log=log)
    log("`tilewise.load(..., device='webgpu')` uses it on this device")
    if getattr(args, "json", None):
        log(f"and a copy in {table.save(args.json)}")
    return 0
