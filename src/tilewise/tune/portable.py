"""The portable choice: one kernel and config per problem (and row range) that is good on every device measured.

Results are grouped as the dispatch table keys its entries: by the problem a stored kernel name computes and every
size but the rows (`nf4_matmul.swiglu.norm:4608x1024`, `attention:16x8x64`, `gemm:64x32`), so the kinds of one
problem (short-row, tiled, tensor-core) compete, and the table written from the choice is one the model runtime
loads. Devices are grouped by backend: a CUDA and a WebGPU device never share a choice (their kernels are different
code under similar names), while wgpu-native and Dawn, which run the same WGSL, do.

For each problem measured ok on several devices of one backend, a choice's cost on a device is its median over that
device's own best median at that row count (1.0 = the device's best); its portable cost is the worst of those
ratios. Only choices measured on every device count. Row ranges are fitted on the portable costs as `fit_dispatch`
fits times. Times of different devices are never compared with each other: only each device's ratio to its own
best.

A result whose stored source hash is not the source this tilewise generates for its config (older kernels, a
config the space no longer has) is left out and counted, so a portable table never names code that was not
measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tilewise.devices.base import source_hash
from tilewise.errors import ConfigError
from tilewise.kernels.registry import backend_of, template_named
from tilewise.tune.dispatch import FORMAT, PORTABLE_DEVICE, SCHEMA, family_of, family_version, fit_dispatch


def _config_dict(key: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in filter(None, key.split(",")):
        name, _, value = part.partition("=")
        out[name] = int(value) if value.lstrip("-").isdigit() else value
    return out


class _Resolver:
    """Stored (fingerprint, kernel, shape, config) -> (backend, dispatch key, family, typed config values), or
    None for a result measured on code other than this build's; templates and source hashes are made once."""

    def __init__(self) -> None:
        self.templates: dict[tuple[str, str], Any] = {}
        # (backend, kernel, config, shape) -> (source hash, typed values), None where this build cannot generate it
        self.made: dict[tuple[str, str, str, str], tuple[str, dict[str, Any]] | None] = {}
        self.versions: dict[str, str] = {}  # family -> this build's code version, for the families resolved
        self.stale = 0
        self.unchecked = 0

    def __call__(self, r: Any) -> tuple[str, str, str, dict[str, Any], tuple[str, ...]] | None:
        backend = backend_of(r.fingerprint)
        shape = tuple(int(s) for s in r.shape.split("x"))
        if (r.kernel, backend) not in self.templates:
            self.templates[(r.kernel, backend)] = template_named(r.kernel, backend)
        tpl = self.templates[(r.kernel, backend)]
        if tpl is None:  # a kernel this build cannot make: grouped by its name, its code unchecked
            self.unchecked += 1
            rest = r.shape.partition("x")[2]
            return backend, f"{r.kernel}:{rest}", r.kernel.split(".")[0], _config_dict(r.config), ()
        at = (backend, r.kernel, r.config, r.shape)
        if at not in self.made:
            try:
                cfg = tpl.space("full").parse(r.config)
                self.made[at] = (source_hash(tpl.source(cfg, shape)), dict(cfg))
            except Exception:  # a config the space no longer takes, or one it cannot generate: not this code
                self.made[at] = None
        made = self.made[at]
        if made is None or made[0] != r.source_hash:
            self.stale += 1
            return None
        family = family_of(tpl)
        self.versions.setdefault(family, family_version(tpl))
        key = tpl.problem.dispatch_key(shape)
        sizes = key.rpartition(":")[2].count("x") + 1 if ":" in key else 0
        names = tuple(tpl.shape_names[len(tpl.shape_names) - sizes:]) if sizes else ()
        return backend, key, family, made[1], names


def portable_choice(rows: Sequence[Any], fingerprints: Sequence[str] | None = None,
                    tolerance: float = 0.03) -> dict[str, Any]:
    """From stored ok `Result`s: per (backend, problem key), the fitted ranges, each with its kernel, config and the
    ratio to each device's own best over the row counts it serves. `fingerprints` limits the devices."""
    resolve = _Resolver()
    times: dict[tuple[str, str], dict[int, dict[str, dict[tuple[str, str], float]]]] = {}
    families: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {}
    configs: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if r.status != "ok" or r.median_ms is None or (fingerprints and r.fingerprint not in fingerprints):
            continue
        got = resolve(r)
        if got is None:
            continue
        backend, key, family, values, names = got
        families[(backend, key)] = (family, names)
        configs[(r.kernel, r.config)] = values
        m = int(r.shape.partition("x")[0])
        # rows come oldest first: a config measured again keeps its newest time
        times.setdefault((backend, key), {}).setdefault(m, {}).setdefault(r.fingerprint, {})[(r.kernel, r.config)] = \
            r.median_ms
    if not times:
        why = (f" ({resolve.stale} were measured on kernels that have changed since)" if resolve.stale else "")
        raise ConfigError(f"the store holds no timed ok results of this tilewise's kernels for the portable "
                          f"choice{why}",
                          "tune or sweep on each device first (or import their `tilewise store export` files)")
    groups = []
    for (backend, key), per_m in sorted(times.items()):
        devices = sorted({fp for by_fp in per_m.values() for fp in by_fp})
        ratio: dict[tuple[str, str], dict[int, dict[str, float]]] = {}  # choice -> M -> fp -> ratio to its best
        for m, by_fp in per_m.items():
            if set(by_fp) != set(devices):
                continue  # a row count some device lacks cannot be judged on every device
            common = set.intersection(*(set(c) for c in by_fp.values()))
            for fp, cfgs in by_fp.items():
                best = min(cfgs.values())
                for c in common:
                    ratio.setdefault(c, {}).setdefault(m, {})[fp] = cfgs[c] / best
        ms = sorted({m for per in ratio.values() for m in per})
        if not ms:
            continue
        worst = {c: {m: max(per[m].values()) for m in per} for c, per in ratio.items()}
        ranges = fit_dispatch(worst, ms, tolerance)
        out_ranges = []
        for i, rg in enumerate(ranges):
            served = [m for m in ms if rg.m_min <= m <= rg.m_max]
            per_dev = {fp: max(ratio[rg.config][m][fp] for m in served) for fp in devices}
            kernel, ckey = rg.config
            out_ranges.append({"m_min": rg.m_min, "m_max": None if i == len(ranges) - 1 else rg.m_max,
                               "kernel": kernel, "config": configs[rg.config], "config_key": ckey, "label": ckey,
                               "worst_ratio": max(per_dev.values()), "ratio": per_dev})
        family, names = families[(backend, key)]
        groups.append({"backend": backend, "key": key, "family": family, "size_names": list(names),
                       "devices": devices, "measured_m": ms, "ranges": out_ranges})
    if not groups:
        raise ConfigError("no problem was measured ok on every device of one backend at the same row count with a "
                          "shared config", "tune the same kernels at the same shapes on each device")
    return {"devices": sorted({fp for g in groups for fp in g["devices"]}),
            "backends": sorted({g["backend"] for g in groups}), "tolerance": tolerance, "groups": groups,
            "versions": dict(resolve.versions), "stale": resolve.stale, "unchecked": resolve.unchecked}


def portable_table(choice: dict[str, Any], backend: str | None = None) -> dict[str, Any]:
    """The dispatch table (the one format, device `portable`) of a portable choice's groups on one backend (the
    only one, or `backend`): entries keyed by problem, every range carrying its per-device ratios."""
    backends = choice["backends"]
    if backend is None and len(backends) > 1:
        raise ConfigError(f"the portable choice spans the backends {', '.join(backends)}; a table serves one",
                          "give --install (one table per backend), or --device-fingerprint with devices of one "
                          "backend")
    backend = backend or backends[0]
    groups = [g for g in choice["groups"] if g["backend"] == backend]
    if not groups:
        raise ConfigError(f"the portable choice has nothing for the {backend} backend",
                          f"it covers {', '.join(backends)}")
    entries = {}
    for g in groups:
        sizes = [int(s) for s in g["key"].rpartition(":")[2].split("x") if s.isdigit()]
        names = g["size_names"] if len(g["size_names"]) == len(sizes) else [f"d{i}" for i in range(len(sizes))]
        entries[g["key"]] = {"family": g["family"], "fixed": dict(zip(names, sizes)),
                             "tolerance": choice["tolerance"], "ranges": g["ranges"], "measured_m": g["measured_m"],
                             "per_m": {}}
    devices = sorted({fp for g in groups for fp in g["devices"]})
    versions = {f: v for f, v in choice["versions"].items() if any(g["family"] == f for g in groups)}
    return {"format": FORMAT, "schema": SCHEMA, "device": PORTABLE_DEVICE, "kernel_versions": versions,
            "portable": {"backend": backend, "devices": devices}, "entries": entries, "measured": {}}


__all__ = ["PORTABLE_DEVICE", "portable_choice", "portable_table"]
