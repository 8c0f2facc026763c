"""The portable choice: one config per shape (and row range) that is good on every device the store has measured.

For each (kernel, shape) measured ok on several fingerprints, a config's cost on a device is its median over that
device's own best median there (1.0 = the device's best); its portable cost is the worst of those ratios. Only
configs measured on every device count. Row ranges are fitted on the portable costs as `fit_dispatch` fits times,
so a range's choice is within the tolerance of the best worst-case ratio at every measured row count. Times of
different devices are never compared with each other: only each device's ratio to its own best.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tilewise.errors import ConfigError
from tilewise.tune.dispatch import FORMAT, SCHEMA, fit_dispatch

PORTABLE_DEVICE = "portable"


def _config_dict(key: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in filter(None, key.split(",")):
        name, _, value = part.partition("=")
        out[name] = int(value) if value.lstrip("-").isdigit() else value
    return out


def portable_choice(rows: Sequence[Any], fingerprints: Sequence[str] | None = None,
                    tolerance: float = 0.03) -> dict[str, Any]:
    """From stored ok `Result`s: per (kernel, sizes but the rows), the fitted ranges, each with its config and
    the ratio to each device's own best at every row count it serves. `fingerprints` limits the devices."""
    times: dict[tuple[str, str], dict[int, dict[str, dict[str, float]]]] = {}
    for r in rows:
        if r.status != "ok" or r.median_ms is None or (fingerprints and r.fingerprint not in fingerprints):
            continue
        m, _, rest = r.shape.partition("x")
        times.setdefault((r.kernel, rest), {}).setdefault(int(m), {}).setdefault(r.fingerprint, {})[r.config] = \
            r.median_ms
    if not times:
        raise ConfigError("the store holds no timed ok results for the portable choice",
                          "tune or sweep on each device first (or import their `tilewise store export` files)")
    groups = []
    for (kernel, rest), per_m in sorted(times.items()):
        devices = sorted({fp for by_fp in per_m.values() for fp in by_fp})
        ratio: dict[str, dict[int, dict[str, float]]] = {}  # config -> M -> fp -> ratio to that device's best
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
            out_ranges.append({"m_min": rg.m_min, "m_max": None if i == len(ranges) - 1 else rg.m_max,
                               "kernel": kernel, "config": _config_dict(rg.config), "config_key": rg.config,
                               "label": rg.config, "worst_ratio": max(per_dev.values()), "ratio": per_dev})
        groups.append({"kernel": kernel, "sizes": rest, "devices": devices, "measured_m": ms, "ranges": out_ranges})
    if not groups:
        raise ConfigError("no shape was measured ok on every device at the same row count with a shared config",
                          "tune the same kernel at the same shapes on each device")
    return {"devices": sorted({fp for g in groups for fp in g["devices"]}), "tolerance": tolerance,
            "groups": groups}


def portable_table(choice: dict[str, Any]) -> dict[str, Any]:
    """The dispatch table of a portable choice: the one format, its device `portable`, each entry keyed
    `kernel:sizes` and every range carrying its per-device ratios."""
    entries = {}
    for g in choice["groups"]:
        names = ("N", "K") if g["sizes"].count("x") == 1 else tuple(f"d{i}" for i in range(g["sizes"].count("x") + 1))
        fixed = dict(zip(names, (int(s) for s in g["sizes"].split("x")))) if g["sizes"] else {}
        entries[f"{g['kernel']}:{g['sizes']}"] = {
            "family": g["kernel"].split(".")[0], "fixed": fixed, "tolerance": choice["tolerance"],
            "ranges": g["ranges"], "measured_m": g["measured_m"], "per_m": {}}
    return {"format": FORMAT, "schema": SCHEMA, "device": PORTABLE_DEVICE, "kernel_versions": {},
            "portable": {"devices": choice["devices"]}, "entries": entries, "measured": {}}


__all__ = ["PORTABLE_DEVICE", "portable_choice", "portable_table"]
