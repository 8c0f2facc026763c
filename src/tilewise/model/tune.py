"""`tilewise tune model`: measure every matmul the classifier runs, across row counts, and the attention tile, and
write the dispatch table the WebGPU or CUDA executor loads.

For each (epilogue, N, K) of the model (conv in/out projections, q/k/v and out projections, paired gate/up with
SwiGLU, down with the residual) the candidates of the three FMA kernels (short-row, tiled, split-K), and on Dawn
with subgroup matrices the subgroup-matrix kernel (`kernels/matmul/sgmat.py`, f16 tolerance), or on CUDA the
short-row and tensor-core kernels (`kernels/matmul/cuda.py`, the latter at the f16 tolerance), are items of the
evaluation engine at every row count (1..512 plus the decision's lengths): each is verified once against the
float64 reference (every output value, NaN-poisoned outputs), every candidate of one row count is timed in the
same interleaved rounds, and every outcome is stored (an interrupted run resumes from the store). The tuner's
`fit_dispatch` turns the per-row-count medians into the fewest row ranges within 3% of the best; the cutoff where
the tiled kernel takes over is printed per shape (seed 001 found 96 on an M1 Max). Attention (the executor's
kernel, and on Dawn the subgroup-matrix one beside it) and the short conv are tuned at the decision length
(`model/tune_attention.py`).

The table is keyed by the device fingerprint and the kernel families' code versions; the executor ignores (with a
warning) a table from another device and the entries of a family whose code changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tilewise.errors import ConfigError
from tilewise.kernels.matmul import cuda as mm_cuda
from tilewise.kernels.matmul import webgpu as mm
from tilewise.kernels.matmul.sgmat import sgmat_templates
from tilewise.kernels.space import Config
from tilewise.model.dispatch import (
    attention_key,
    attention_shape,
    conv_key,
    dispatch_path,
    load_model_table,
    matmul_key,
)
from tilewise.model.runtime import block_rows
from tilewise.model.tune_attention import (  # noqa: F401 (attention_candidates, attention_template: public here too)
    attention_candidates,
    attention_items,
    attention_ranges,
    attention_template,
    conv_candidates,
    tail_queries,
    tune_conv,
)
from tilewise.model.tune_climb import climb_matmul
from tilewise.model.tune_seeds import SEED_ROWS, SEED_SPLITK, SEED_TILED, fitted_seeds
from tilewise.model.tune_settings import L2_MODES, WEIGHT_BYTES, l2_timing  # noqa: F401 (public here too)
from tilewise.tune.dispatch import DispatchTable, Entry, Range, fit_dispatch, make_ranges
from tilewise.tune.engine import Engine, Item
from tilewise.tune.store import Store

DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 64, 95, 96, 128, 192, 256, 384, 512)


def decision_rows(seq: int) -> set[int]:
    """The row counts of a `seq`-token decision: the whole prompt, and its extend after a 47-token prefix."""
    return {seq, max(1, seq - 47)}


def tail_rows(cfg: Any, seq: int) -> set[int]:
    """The row counts the sliced blocks after the last attention block run at in a `seq`-token decision and its
    extend (`runtime.block_rows`), below the whole prompt's: measured like the decision's own, so that no tail
    matmul runs a config fitted to hundreds of rows."""
    out = set()
    for n in decision_rows(seq):
        for b in block_rows(cfg.layer_types, cfg.conv_L_cache, n, True):
            out |= {r for r in (b.inputs, b.outputs) if r < n}
    return out


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


def candidates(template: Any, limits: Any, n: int, seed: int, hand_picked: bool = True,
               seq: int | None = None) -> list[Any]:
    """The default config, the hand-picked seeds (with `seq`, also those fitted to a `seq`-row decision) and a
    seeded sample of `n` legal configs of the template's space."""
    space = template.space()
    out = [template.default_config()]
    if not hand_picked:
        seeds: list[dict[str, Any]] = []
    elif template.kind == "sgmat":  # subgroup matrices: the seeds at the device's subgroup size
        seeds = []
        out += template.seed_configs(limits)
    elif template.backend == "cuda":  # every CUDA kind's seed points
        seeds = [dict(c) for c in template.space("seed").points or []]
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


TUNE_MEASURE = {"warmup": 2, "min_rounds": 6, "max_rounds": 20, "budget_s": 0.4}


def matmul_templates(dev: Any, fmt: str, epilogue: str, rows: list[int], f16_arith: bool = False,
                     norm: bool = False, eps: float = 1e-5) -> list[Any]:
    """The matmul kernels that compete for one shape: short-row, tiled and (with 64+ rows) split-K, plus the
    f16-arithmetic tiled and split-K variants when asked for and the adapter has shader-f16, plus the
    subgroup-matrix kernel (f16 tolerance) when the device has subgroup matrices (Dawn); on CUDA the short-row
    and tensor-core kernels, and (from 32 rows) split-K and the cp.async and wgmma kinds (the wgmma kinds' rules
    leave them no legal config off Hopper, so they get no candidate there)."""
    if dev.info.backend == "cuda":  # the tiled kinds other than mma need rows
        return [mm_cuda.CudaMatmul(kind, fmt, epilogue, norm, eps) for kind in mm_cuda.KINDS
                if not (kind in mm_cuda.KS_KINDS and max(rows) < mm_cuda.MMA_FROM_ROWS)]
    kinds = [k for k in mm.KINDS if not (k == "splitk" and max(rows) < 64)]  # split-K only pays with many rows
    out = [mm.MatmulTemplate(kind, fmt, epilogue, dev.enabled_features, norm=norm, eps=eps) for kind in kinds]
    if f16_arith and "shader-f16" in dev.enabled_features:
        out += [mm.MatmulTemplate(kind, fmt, epilogue, dev.enabled_features, True, True, norm=norm, eps=eps)
                for kind in kinds if kind != "rows"]
    return out + sgmat_templates(dev, fmt, epilogue, norm, eps)


def _tag(tpl: Any, config: Config) -> str:
    """A candidate's name in the record: its kernel kind and config (`kind=tiled,BM=64,...`)."""
    return f"kind={tpl.kind}," + config.key()


class OutOfTime(Exception):
    """The run's `budget_s` has passed: no new candidate is started."""


@dataclass
class Run:
    """One tuning run's progress: candidates started against the total, the deadline and the callback."""

    total: int = 0
    progress: Callable[[str, int, int], None] | None = None
    deadline: float | None = None  # time.perf_counter() after which no candidate starts
    done: int = 0

    def hook(self, what: str, n: int) -> Callable[[str, int, int | None], None]:
        """The engine's progress callback for one evaluation of `n` candidates described by `what`."""
        first: list[int] = []

        def report(stage: str, done: int, _total: int | None) -> None:
            if not first:
                first.append(done)
            i = done - first[0]
            if stage.startswith("compile") and self.deadline is not None and time.perf_counter() > self.deadline:
                raise OutOfTime(what)
            if self.progress is not None:
                text = f"{what}: timing {n} candidates" if stage.startswith("timing") else \
                    f"{what}: candidate {min(i + 1, n)}/{n}"
                self.progress(text, self.done + min(i, n), self.total)
        return report

    def evaluate(self, eng: Engine, items: list[Item], what: str) -> list[Any]:
        eng.progress = self.hook(what, len(items))
        try:
            return eng.evaluate(items, batch=None)
        finally:
            self.done += len(items)
            eng.progress = None


def matmul_candidates(dev: Any, fmt: str, epilogue: str, rows: list[int], n_cand: int, seed: int,
                      hand_picked: bool = True, f16_arith: bool = False, norm: bool = False, eps: float = 1e-5,
                      seq: int | None = None, budget: int | None = None,
                      configs: Callable[[Any], list[Any]] | None = None) -> list[tuple[Any, Config]]:
    """(template, config) of every candidate of one matmul shape: at most `budget` per kernel, the default first."""
    cands: list[tuple[Any, Config]] = []
    for t in matmul_templates(dev, fmt, epilogue, rows, f16_arith, norm, eps):
        todo = candidates(t, dev.info.limits, n_cand, seed, hand_picked, seq) if configs is None else configs(t)
        cands += [(t, c) for c in todo[:budget]]
    return cands


def tune_matmul(dev: Any, fmt: str, epilogue: str, n: int, k: int, rows: list[int], n_cand: int, seed: int,
                log: Any, hand_picked: bool = True, f16_arith: bool = False, norm: bool = False,
                eps: float = 1e-5, configs: Callable[[Any], list[Any]] | None = None,
                keep_times: bool = False, seq: int | None = None, store: Store | None = None,
                force: bool = False, budget: int | None = None, run: Run | None = None,
                what: str = "matmul", make_engine: Callable[..., Engine] = Engine,
                climb: int = 0) -> tuple[Entry, dict[str, Any]]:
    """Measure the matmul kernels across `rows` (one engine, one evaluation per row count, largest first);
    returns (the dispatch entry, the record).

    With `f16_arith` (and shader-f16) the tiled and split-K kernels' f16-staging + f16-FMA variants compete too,
    verified under the f16 tolerance. `seq` (the decision length) adds the seeds fitted to it. `configs(template)`,
    when given, replaces `candidates` (a template it gives nothing is skipped); `budget` caps the candidates per
    kernel; `keep_times` adds every candidate's median per row count (`times_ms`). Results are stored in `store`
    (resumed from it unless `force`); `run` reports progress and raises `OutOfTime` past its deadline.
    `make_engine(dev, store, force=, seed=, measure_kw=)` builds the engine (a cluster's runs several row counts
    at once). `climb` > 0: that many more configs of the kernel fastest at `seq` rows, hill-climbing from its best
    (`tune_climb.climb_matmul`), measured at the decision's lengths.
    """
    eng = make_engine(dev, store, force=force, seed=seed, measure_kw=TUNE_MEASURE)
    cands = matmul_candidates(dev, fmt, epilogue, rows, n_cand, seed, hand_picked, f16_arith, norm, eps, seq,
                              budget, configs)
    run = run or Run()
    outcomes = []
    order = sorted(rows, reverse=True)  # programs and checks are shared across row counts (M is a uniform)
    steps = [order] if getattr(eng, "width", 1) > 1 else [[m] for m in order]
    for step in steps:
        outcomes += run.evaluate(eng, [Item(t, c, (m, n, k)) for m in step for t, c in cands],
                                 f"{what} M={step[0]}" + (f"..{step[-1]}" if len(step) > 1 else ""))
    climbed: dict[str, Any] = {}
    if climb and seq in rows:
        def evaluate(items: list[Item]) -> list[Any]:
            run.total += len(items)  # type: ignore[union-attr]
            return run.evaluate(eng, items, f"{what} climb")  # type: ignore[union-attr]

        lengths = sorted(decision_rows(seq) & set(rows), reverse=True)
        more, climbed = climb_matmul(eng, evaluate, outcomes, n, k, seq, lengths, climb, seed)
        outcomes += more
    times: dict[tuple[str, Config], dict[int, float]] = {}
    failures: dict[str, str] = {}
    tags: dict[tuple[str, Config], str] = {}
    for oc in outcomes:
        key = (oc.item.kernel.name, oc.config)
        tags[key] = _tag(oc.item.kernel, oc.config)
        if oc.status == "ok" and oc.stats is not None:
            times.setdefault(key, {})[oc.shape[0]] = oc.stats.median_ms
        else:
            failures.setdefault(tags[key], f"{oc.status}: {oc.reason}")
    if not times:
        raise ConfigError(f"no matmul candidate ran for {fmt} {epilogue} {n}x{k}: {failures}",
                          "report this with `tilewise devices --json`")
    ranges = fit_dispatch(times, rows, tolerance=0.03)
    best = {m: min((c for c in times if m in times[c]), key=lambda c, m=m: times[c][m]) for m in rows}
    entry = Entry(make_ranges(ranges, open_end=True), fixed={"N": n, "K": k}, tolerance=0.03, measured_m=list(rows),
                  per_m={str(m): {"best": tags[best[m]], "median_ms": times[best[m]][m]} for m in rows})
    record = {"rows": rows, "best_ms": {m: times[best[m]][m] for m in rows}, "best": {m: tags[best[m]] for m in rows},
              "failures": failures, "candidates": [tags[c] for c in times],
              "seconds": {a: round(b, 4) for a, b in eng.seconds.items()}, **({"climb": climbed} if climbed else {})}
    if keep_times:
        record["times_ms"] = {tags[c]: {m: t for m, t in sorted(ts.items())} for c, ts in times.items()}
    return entry, record


def model_config(name: str) -> Any:
    """The config of `default` (the bundled model), a preset, or a model folder: all tuning needs are shapes."""
    from pathlib import Path

    from tilewise.errors import ConfigError, TilewiseError
    from tilewise.model.config import PRESETS, ModelConfig, preset
    from tilewise.model.runtime import DEFAULT_MODEL_DIR

    if name == "default":
        if not (DEFAULT_MODEL_DIR / "config.json").exists():
            raise TilewiseError(f"no bundled model is present (expected it in {DEFAULT_MODEL_DIR})",
                                "pass --preset with a preset name or a model folder")
        return ModelConfig.from_file(DEFAULT_MODEL_DIR / "config.json")
    if Path(name).is_dir():
        return ModelConfig.from_file(Path(name) / "config.json")
    try:
        return preset(name)
    except ConfigError as exc:  # here `default` is a name too
        raise ConfigError(f"{name!r} is neither a model preset nor a model folder",
                          f"use default (the bundled model), one of {', '.join(PRESETS)}, or a model folder") from exc


def tune_model(dev: Any, cfg: Any, seq: int = 346, fmt: str = "nf4", *, rows: Any = None, n_cand: int = 12,
               seed: int = 0, force: bool = False, hand_picked: bool = True, f16_arith: bool = False,
               path: Any = None, log: Any = print, store: Store | None = None, budget: int | None = None,
               budget_s: float | None = None, progress: Callable[[str, int, int], None] | None = None,
               make_engine: Callable[..., Engine] = Engine, climb: int = 0, l2: str = "auto") -> DispatchTable:
    """Tune every matmul shape and the attention tile of a model config on a device; returns the table.

    Args:
        dev: a WebGPU device.
        cfg: the ModelConfig.
        seq: the decision length (its rows, seq - 47 and the sliced tail's, `tail_rows`, are measured besides
            `rows`).
        fmt: weight format.
        rows: row counts to measure (default `DEFAULT_ROWS`).
        n_cand: random legal configs per kernel next to the default and the hand-picked ones.
        seed: inputs and sampling.
        force: re-measure shapes the table at `path` already holds (and items the store holds).
        hand_picked: include `SEED_TILED` / `SEED_SPLITK` / `SEED_ROWS` and the seeds fitted to `seq`.
        f16_arith: let the f16-arithmetic tiled and split-K variants compete (f16 tolerance; a table of its own).
        path: where the table lives (default: `dispatch_path(fingerprint)`, with `-f16a` for f16_arith).
        log: printer of one line per finished shape.
        store: the results store every candidate's outcome goes to (None: keep none).
        budget: most candidates per kernel (None: the default, the hand-picked ones and `n_cand` random ones).
        budget_s: seconds overall; once passed no new candidate starts (the shape under way is cut).
        progress: callback(text, candidates started, candidates in all), before every candidate.
        make_engine: builds each engine (`Engine`; a cluster's for `--ray`, with `dev` its workers' device).
        climb: per matmul shape, that many more configs of the kernel fastest at `seq` rows, hill-climbing from
            its best (`tune_climb`).
        l2: CUDA's timing condition, `auto`, `cold` or `warm` (`l2_timing`); the store keeps the two apart.

    Returns:
        The table, saved at `path` after every shape. Until every shape is in it, the file says `partial` (with
        the shapes left and why): a shape cut by `budget_s` or an interrupt (KeyboardInterrupt, re-raised after
        the save) is left out, so the defaults serve it, and a re-run resumes from the store.
    """
    from pathlib import Path

    fp = dev.info.fingerprint
    rows = sorted(set(rows or DEFAULT_ROWS) | decision_rows(seq) | tail_rows(cfg, seq))
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
    if f16_arith and "shader-f16" not in getattr(dev, "enabled_features", ()):
        log("f16 arithmetic skipped: this adapter has no shader-f16")
    # shapes this device already has (from another preset of the same width, or a cut run) are kept unless force
    backend = "cuda" if dev.info.backend == "cuda" else "webgpu"
    table = (load_model_table(fp, path, True, dev.info.limits, getattr(dev, "enabled_features", ()), cfg.norm_eps,
                              backend) if path.exists() else DispatchTable(fp))
    table.source = "tuned"
    akey = attention_key(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
    shapes: dict[str, tuple[str, tuple[str, int, int, bool]]] = {}  # key -> (label, shape): one per distinct key
    for label, shape in model_matmuls(cfg).items():
        key = matmul_key(fmt, shape[0], shape[1], shape[2], shape[3])
        if key in table.entries and not force:
            log(f"{label} ({shape[0]}, N={shape[1]}, K={shape[2]}): already tuned on this device (force re-measures)")
        else:
            shapes.setdefault(key, (label, shape))
    tune_attn = force or akey not in table.entries
    ckey = conv_key(cfg)
    tune_cv = "conv" in cfg.layer_types and (force or ckey not in table.entries)
    kw = {"n_cand": n_cand, "seed": seed, "hand_picked": hand_picked, "f16_arith": f16_arith, "eps": cfg.norm_eps,
          "seq": seq, "budget": budget}
    counts = {key: len(rows) * len(matmul_candidates(dev, fmt, e, rows, norm=nm, **kw))
              for key, (_, (e, _, _, nm)) in shapes.items()}
    n_attn = (sum(len(attention_items(dev, budget, attention_shape(cfg, q, seq - q))) + (q < seq)  # + the seq pick
                  for q in [seq, *tail_queries(cfg, seq)]) if tune_attn else 0)
    n_conv = len(conv_candidates(dev, budget)) if tune_cv else 0
    run = Run(sum(counts.values()) + n_attn + n_conv, progress,
              None if budget_s is None else time.perf_counter() + budget_s)
    left = [label for label, _ in shapes.values()] + ["attention"] * tune_attn + ["conv"] * tune_cv
    stop: BaseException | None = None
    keep_l2, why_l2 = l2_timing(dev, cfg, fmt, l2, make_engine is Engine)
    flush_before = getattr(dev, "flush_l2", None)
    if why_l2:
        log(why_l2)
        dev.flush_l2 = not keep_l2
    try:
        for i, (key, (label, (epilogue, n, k, norm))) in enumerate(shapes.items()):
            _save_partial(table, path, left, "running")
            what = f"matmul {i + 1}/{len(shapes)} ({fmt} {label} {n}x{k}, rows {rows[0]}..{rows[-1]})"
            entry, record = tune_matmul(dev, fmt, epilogue, n, k, rows, n_cand, seed, log, hand_picked=hand_picked,
                                        f16_arith=f16_arith, norm=norm, eps=cfg.norm_eps, seq=seq, store=store,
                                        force=force, budget=budget, run=run, what=what, make_engine=make_engine,
                                        climb=climb)
            table.put(key, entry, matmul_templates(dev, fmt, epilogue, rows, norm=norm)[0])
            table.measured[f"{label} {n}x{k}"] = record
            left.remove(label)
            _log_shape(log, label, epilogue, n, k, seq, entry, record)
        op_kw = {"store": store, "force": force, "budget": budget, "run": run, "make_engine": make_engine}
        if tune_attn:  # the decision length's tile, and the sliced tail's query counts their own
            _save_partial(table, path, left, "running")
            aranges, tpl = attention_ranges(dev, cfg, seq, seed, log, akey, **op_kw)
            table.put(akey, Entry(make_ranges(aranges, open_end=True)), tpl)
            left.remove("attention")
        if tune_cv:  # one config for every row count, tuned at the decision length
            _save_partial(table, path, left, "running")
            tpl, values, ms = tune_conv(dev, cfg, seq, seed, what=f"short conv ({ckey}, {seq} rows)", **op_kw)
            table.put(ckey, Entry(make_ranges([Range(1, seq, tpl.config_of(values))], tpl.name, open_end=True)), tpl)
            left.remove("conv")
            log(f"short conv at {seq} rows: {tpl.name} {values} {ms:.4f} ms")
    except (OutOfTime, KeyboardInterrupt) as exc:
        stop = exc
    finally:
        if why_l2:
            dev.flush_l2 = flush_before
    why = f"--budget-s {budget_s:g} s passed" if isinstance(stop, OutOfTime) else "interrupted"
    _save_partial(table, path, left, why if stop is not None else None)
    table.source = str(path)
    if stop is not None:
        log(f"{why}: cut {', '.join(left)} (the defaults serve them; a re-run resumes from the store)")
    log(f"wrote {'partial ' if table.partial else ''}dispatch table {path}")
    if isinstance(stop, KeyboardInterrupt):
        raise stop
    return table


def _save_partial(table: DispatchTable, path: Any, left: list[str], why: str | None) -> None:
    """Save the table; while shapes are left it says so (`partial`), so a file from a cut run never looks whole."""
    table.partial = {"left": list(left), "why": why} if left else None
    table.save(path)


def _log_shape(log: Any, label: str, epilogue: str, n: int, k: int, seq: int, entry: Entry,
               record: dict[str, Any]) -> None:
    cut = next((r["m_min"] for r in entry.ranges if ".rows." not in r["kernel"]), None)
    desc = ", ".join(f"{r['m_min']}-{r['m_max'] or '...'}: {r['kernel'].split('.')[1]} {r['config_key']}"
                     for r in entry.ranges)
    log(f"{label} ({epilogue}, N={n}, K={k}): tiled from {cut if cut else 'never'} rows; {desc}")
    log(f"    best ms at rows {seq}: {record['best_ms'][seq]:.4f}; at 1: {record['best_ms'][1]:.4f}; "
        f"{len(record['candidates'])} candidates ran, {len(record['failures'])} refused or failed; seconds: "
        + ", ".join(f"{a} {b:.1f}" for a, b in record["seconds"].items()))
    if "climb" in record:
        c = record["climb"]
        tied = len(c.get("starts", ())) - 1
        log(f"    climb of {c['kernel']} at rows {seq}: {c['measured']} more from {c['from']} ({c['from_ms']:.4f} ms)"
            f"{f' and {tied} config(s) it ties with' if tied > 0 else ''}; best {c['best']} ({c['best_ms']:.4f} ms)")
