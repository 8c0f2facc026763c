"""The classifier's dispatch: which kernel and config each tuned op runs at each row count, on one device.

The table is the one format of `tilewise.tune.dispatch` (written by `tilewise tune model`, or by `tilewise sweep
... --out`), one file per device fingerprint. Its entries are keyed by the ops' problems:
`nf4_matmul.swiglu.norm:4608x1024` (a matmul's weight format, epilogue, fused norm, N x K), `attention:16x8x64`
(heads, kv heads, head size) and `shortconv:1024x3` (channels, taps). Without a table, or for an op it lacks, the
executor takes the defaults below: the short-row kernel below 96 rows (seed 001's measured cutoff) and 64x64 tiles
from there.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tilewise.devices.base import Limits
from tilewise.devices.cuda_pdl import PDL_ENV
from tilewise.errors import ConfigError
from tilewise.kernels.attention import cuda as attn_cuda
from tilewise.kernels.attention import sgmat as attn_sg
from tilewise.kernels.attention import webgpu as attn_k
from tilewise.kernels.base import KernelTemplate
from tilewise.kernels.matmul import cuda as mm_cuda
from tilewise.kernels.matmul import webgpu as mm
from tilewise.kernels.registry import backend_of
from tilewise.kernels.shortconv.cuda import CudaShortConv
from tilewise.kernels.shortconv.problem import ShortConvProblem
from tilewise.kernels.shortconv.webgpu import ConvTemplate
from tilewise.kernels.space import Config
from tilewise.tune.dispatch import DispatchTable, family_version
from tilewise.tune.store import default_path

TUNE_FIX = ("run `tilewise tune model --device webgpu` (`--device dawn` on Dawn, `--device cuda` on CUDA) to measure "
            "this device")


def tune_command(fingerprint: str) -> str:
    """The `tilewise tune model` line that measures the device of `fingerprint`."""
    runtime = ("dawn" if fingerprint.startswith("webgpu+dawn") else
               "cuda" if fingerprint.startswith("cuda") else "webgpu")
    return f"tilewise tune model --device {runtime}"


def _dispatch_dir() -> Path:
    env = os.environ.get("TILEWISE_DISPATCH_DIR")
    return Path(env) if env else default_path().parent / "dispatch"


def dispatch_path(fingerprint: str) -> Path:
    """Where `tilewise tune model` writes the dispatch table of a device (override: TILEWISE_DISPATCH_DIR)."""
    slug = "".join(ch if ch.isalnum() or ch in ".-" else "-" for ch in fingerprint)
    return _dispatch_dir() / f"model-{slug}.json"


def portable_path(backend: str) -> Path:
    """Where `tilewise report --portable --install` writes the table a device of `backend` (webgpu, cuda) falls
    back to when it has no table of its own."""
    return _dispatch_dir() / f"model-portable-{backend}.json"


#: the CUDA executor's whole-model settings (raced by `tilewise tune model`, model/tune_settings.py) and their
#: values where none was measured
CUDA_SETTINGS = {"pdl": False, "fuse_preps": True, "serial_reduce": False, "fold_norm": False, "fuse_rope": False,
                 "zero_copy": False}


def model_signature(cfg: Any, fmt: str) -> str:
    """What a decision's launch list depends on, as a key for a table's `settings`: the weight format, widths,
    heads and the block kinds in order (`c` conv, `a` attention)."""
    blocks = "".join("a" if t == "full_attention" else "c" for t in cfg.layer_types)
    return (f"{fmt}:H{cfg.hidden_size}:F{cfg.ffn_dim}:{cfg.num_attention_heads}x{cfg.num_key_value_heads}x"
            f"{cfg.head_dim}:{blocks}")


def model_settings(table: DispatchTable, cfg: Any, fmt: str, pdl: bool | None = None,
                   environ: Mapping[str, str] | None = None) -> dict[str, bool]:
    """The settings the table's race chose for this model that an executor takes ({} where none was raced): each a
    known one with a boolean value (anything else in the file is ignored), and `pdl` only where neither the caller
    (`pdl` not None) nor `TILEWISE_CUDA_PDL` chose."""
    values = table.settings.get(model_signature(cfg, fmt), {}).get("values", {})
    out = {k: v for k, v in values.items() if k in CUDA_SETTINGS and isinstance(v, bool)}
    if pdl is not None or (os.environ if environ is None else environ).get(PDL_ENV, "").strip():
        out.pop("pdl", None)
    return out


def matmul_key(fmt: str, epilogue: str, n: int, k: int, norm: bool = False) -> str:
    """The dispatch key of one of the model's matmuls (the problem's: rows are what the entry dispatches on)."""
    return mm.MatmulProblem(fmt, epilogue, norm).dispatch_key((1, n, k))


def attention_shape(cfg: Any, rows: int, cached: int = 0) -> tuple[int, int, int, int, int]:
    """The attention shape (M, P, HQ, HKV, D) of `rows` queries of a model config after `cached` positions."""
    return (rows, cached, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)


def attention_key(hq: int, hkv: int, d: int) -> str:
    return attn_k.AttentionProblem().dispatch_key((1, 0, hq, hkv, d))


def conv_shape(cfg: Any, rows: int) -> tuple[int, int, int]:
    """The short conv's shape (M, H, L) at `rows` rows of a model config."""
    return (rows, cfg.hidden_size, cfg.conv_L_cache)


def conv_key(cfg: Any) -> str:
    """The short conv's dispatch key (`shortconv:HxL`)."""
    return ShortConvProblem().dispatch_key(conv_shape(cfg, 1))


def conv_template(backend: str) -> Any:
    """The short-conv kernel of a backend's executor (`cuda`; any other runs the WGSL one)."""
    return CudaShortConv() if backend == "cuda" else ConvTemplate()


def conv_choice(table: DispatchTable, conv: Any, cfg: Any, rows: int) -> Config:
    """The short conv's config at `rows` rows of `cfg`: the table's entry, else the kernel's default."""
    picked = table.pick(conv_key(cfg), rows)
    return conv.config_of(picked[1]) if picked is not None else conv.default_config()


def matmul_name(kind: str, fmt: str, epilogue: str, norm: bool = False) -> str:
    """The template name of an f32-arithmetic matmul kernel (what the defaults run)."""
    return mm.MatmulTemplate(kind, fmt, epilogue, None, norm=norm).name


def default_matmul(rows: int) -> tuple[str, dict[str, Any]]:
    """(kind, config values) the executor runs for `rows` rows when no table says otherwise."""
    if rows <= 2:
        return "rows", dict(mm.DEFAULT_ONE_ROW)
    if rows < mm.DEFAULT_CUTOFF_ROWS:
        return "rows", dict(mm.DEFAULT_ROWS)
    return "tiled", dict(mm.DEFAULT_TILED)


def current_versions(backend: str = "webgpu") -> dict[str, str]:
    """The code versions of the families the model tunes on `backend` (a table measured on other code is stale)."""
    if backend == "cuda":
        return {"matmul": family_version(mm_cuda.CudaMatmul()), "attention": family_version(attn_cuda.CudaAttention()),
                "shortconv": family_version(CudaShortConv())}
    return {"matmul": family_version(mm.MatmulTemplate()), "attention": family_version(attn_k.AttentionTemplate()),
            "shortconv": family_version(ConvTemplate())}


def _key_sizes(key: str) -> tuple[int, ...]:
    name, _, sizes = key.rpartition(":")
    parts = sizes.split("x")
    if not name or not all(p.isdigit() for p in parts):
        raise ConfigError(f"key {key!r} is not PROBLEM:NxK (a matmul), attention:HQxHKVxD or shortconv:HxL", TUNE_FIX)
    return tuple(int(p) for p in parts)


def range_choice(key: str, kernel: str, values: Mapping[str, Any], rows: tuple[int, int],
                 limits: Limits | None, features: Iterable[str] | None = (), eps: float = 1e-5,
                 backend: str = "webgpu") -> tuple[KernelTemplate, Config]:
    """The kernel and config one range of entry `key` names, checked as the tuner checks a candidate: the kernel
    computes the entry's problem, every value has its parameter's type, and no rule or shape assumption of the
    template is broken at the range's first and last row counts. ConfigError names what is broken. `backend`
    ("webgpu" or "cuda") says whose kernels the names are (a table holds one device's)."""
    sizes = _key_sizes(key)
    tpl: KernelTemplate
    if kernel == "attention":
        tpl = attn_cuda.CudaAttention() if backend == "cuda" else attn_k.AttentionTemplate()
        shapes = [(m, 0, *sizes) for m in rows]
    elif kernel == "shortconv":
        tpl = conv_template(backend)
        shapes = [(m, *sizes) for m in rows]
    elif kernel == "attention.sgmat" and backend != "cuda":
        tpl = attn_sg.SgmatAttention(features)
        shapes = [(m, 0, *sizes) for m in rows]
    elif backend == "cuda":
        try:
            tpl = mm_cuda.CudaMatmul.from_name(kernel, eps)
        except (ValueError, IndexError):
            raise ConfigError(f"unknown CUDA matmul kernel {kernel!r}", TUNE_FIX) from None
        shapes = [(m, *sizes) for m in rows]
    else:
        tpl = mm.MatmulTemplate.from_name(kernel, features, eps)  # ConfigError for an unknown name
        shapes = [(m, *sizes) for m in rows]
    if len(shapes[0]) != len(tpl.shape_names) or tpl.problem.dispatch_key(shapes[0]) != key:
        raise ConfigError(f"kernel {kernel} does not compute {key} (it computes "
                          f"{tpl.problem.name}:{'x'.join(tpl.shape_names[1:])})", TUNE_FIX)
    params = tpl.space("full").params
    for name, v in values.items():
        like = params.get(name, [v])[0]
        if type(v) is not type(like):
            raise ConfigError(f"{name}={v!r} is a {type(v).__name__}; {kernel} takes {type(like).__name__} values "
                              f"such as {like!r}", TUNE_FIX)
    try:
        cfg = tpl.config_of(dict(values))
    except KeyError as exc:  # Config.replace names the unknown parameters
        raise ConfigError(f"{exc.args[0]} for {kernel}", TUNE_FIX) from None
    except ConfigError:
        missing = [p for p in params if p not in values]
        if missing and set(values) <= set(params):  # written before the kernel's space grew a parameter
            raise ConfigError(f"{kernel} takes the parameters {', '.join(params)}; the entry lacks "
                              f"{', '.join(missing)} (written by an older tilewise)", TUNE_FIX) from None
        raise
    reasons = list(dict.fromkeys(r for shape in shapes for r in tpl.why_illegal(cfg, limits, shape)))
    if reasons:
        raise ConfigError(f"{kernel} [{cfg.key()}] breaks {'; '.join(reasons)}", TUNE_FIX)
    return tpl, cfg


def check_model_table(table: DispatchTable, limits: Limits | None, features: Iterable[str] | None = (),
                      eps: float = 1e-5, backend: str = "webgpu") -> tuple[DispatchTable, list[str]]:
    """(the entries whose every range passes `range_choice`, one line per refused entry: key, range, why)."""
    kept: dict[str, Any] = {}
    problems = []
    for key, entry in table.entries.items():
        try:
            for i, r in enumerate(entry.ranges):
                hi = r["m_max"] if r["m_max"] is not None else r["m_min"]
                try:
                    range_choice(key, r["kernel"], r["config"], (r["m_min"], hi), limits, features, eps, backend)
                except ConfigError as exc:
                    raise ConfigError(f"{key} range {i} (rows {r['m_min']}..{r['m_max'] or ''}): {exc.problem}",
                                      exc.fix) from None
            kept[key] = entry
        except ConfigError as exc:
            problems.append(exc.problem)
    out = DispatchTable(table.device, kept, dict(table.versions), table.measured, table.source, table.partial,
                        table.portable, table.settings)
    return out, problems


def checked_table(table: DispatchTable, limits: Limits | None, features: Iterable[str] | None = (),
                  eps: float = 1e-5, backend: str = "webgpu") -> DispatchTable:
    """A table given by the caller, refused whole (one ConfigError) when an entry breaks a kernel rule."""
    ok, problems = check_model_table(table, limits, features, eps, backend)
    if problems:
        more = f" (and {len(problems) - 1} more entries)" if len(problems) > 1 else ""
        where = "the given dispatch table" if table.source in ("defaults", "tuned") else table.source
        raise ConfigError(f"{where}: {problems[0]}{more}",
                          "fix or drop that entry, or measure this device again: " + TUNE_FIX)
    return ok


def load_model_table(fingerprint: str, path: str | Path | None = None, quiet: bool = False,
                     limits: Limits | None = None, features: Iterable[str] | None = (),
                     eps: float = 1e-5, backend: str = "webgpu") -> DispatchTable:
    """The table for a device; without one, the portable table of its backend where one is installed; else an
    empty one (the defaults) with a warning saying how to tune.

    A table from another device, or one that is unreadable or malformed, gives the defaults with a warning;
    entries of a family whose code changed since they were measured are dropped (the rest are kept), with a
    warning naming it; so are entries naming a kernel or config that breaks the kernel's rules (checked against
    `limits` and `features`, the device's), with one warning naming each key, config and rule. Those ops run the
    defaults, which are correct everywhere: a file in the cache never makes the model slower to start or wrong.
    A portable table (`tilewise report --portable --install`) is checked the same way, and the line that says it is
    used names the devices it was chosen over.
    """
    path = Path(path) if path is not None else dispatch_path(fingerprint)
    check = (limits, features, eps, backend)
    if not path.exists():
        fallback = portable_path(backend)
        if fallback.exists():
            return _load_checked(fallback, fingerprint, quiet, check, portable=True)
        if not quiet:
            cut = mm_cuda.MMA_FROM_ROWS if backend == "cuda" else mm.DEFAULT_CUTOFF_ROWS
            warnings.warn(f"no tuned dispatch table for {fingerprint}; using safe defaults (short-row kernel below "
                          f"{cut} rows, 64x64 tiles from there). To tune: run `{tune_command(fingerprint)}` to "
                          "measure this device", stacklevel=2)
        return DispatchTable(fingerprint)
    return _load_checked(path, fingerprint, quiet, check)


def _load_checked(path: Path, fingerprint: str, quiet: bool, check: tuple[Any, ...],
                  portable: bool = False) -> DispatchTable:
    """A table file as it may run on this device (see `load_model_table`), with one warning for what it loses."""
    try:
        table = DispatchTable.load(path)
    except ConfigError as exc:
        warnings.warn(f"ignoring dispatch table {path}: {exc.problem}; using defaults. {TUNE_FIX}", stacklevel=3)
        return DispatchTable(fingerprint)
    if portable and table.portable is None:
        warnings.warn(f"ignoring {path}: it is not a portable table (it was measured on {table.device!r}); using "
                      f"defaults. {TUNE_FIX}", stacklevel=3)
        return DispatchTable(fingerprint)
    usable, notes = table.usable_on(fingerprint, current_versions(backend_of(fingerprint)))
    usable, problems = check_model_table(usable, *check)
    if problems:
        notes.append("entries breaking a kernel rule: " + "; ".join(problems))
    if portable and not quiet:
        n = len((table.portable or {}).get("devices", []))
        ratios = [r.get("worst_ratio") for e in usable.entries.values() for r in e.ranges]
        worst = max((x for x in ratios if isinstance(x, (int, float))), default=None)
        how = f", each choice at most {worst:.2f}x of that device's own best" if worst is not None else ""
        warnings.warn(f"no tuned dispatch table for {fingerprint}; using the portable table {path} "
                      f"({len(usable.entries)} entries chosen over {n} device{'s' * (n != 1)}{how}). To tune this "
                      "device: run "
                      f"`{tune_command(fingerprint)}`", stacklevel=3)
    if notes:
        warnings.warn(f"dispatch table {path}: {'; '.join(notes)}; using defaults for those. {TUNE_FIX}",
                      stacklevel=3)
    return usable
