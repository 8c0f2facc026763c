"""Measured decisions per device: what `tilewise bench` timed, kept so that `auto` can choose between the two WebGPU
runtimes (wgpu-native and Dawn) on the same GPU by measurement instead of by rule.

One JSON file per device fingerprint beside its dispatch table (`decisions-<fingerprint>.json`), written atomically:
`{"format": "tilewise-decisions", "schema": 1, "entries": {"<model>:<weights>:<seq>": {"samples_ms": [...],
"p50_ms": ..., "measured": "<ISO time>"}}}`. Only the latest run of a (model, weights, seq) is kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tilewise.devices.base import DeviceInfo
from tilewise.files import write_atomic
from tilewise.model.dispatch import dispatch_path
from tilewise.tune.measure import compare, summarize

FORMAT = "tilewise-decisions"
MIN_SAMPLES = 10  # fewer decisions than this are not evidence enough to switch runtimes


def decisions_path(fingerprint: str) -> Path:
    table = dispatch_path(fingerprint)
    return table.with_name(table.name.replace("model-", "decisions-", 1))


def load_decisions(fingerprint: str) -> dict[str, dict[str, Any]]:
    """The recorded decisions of one device ({} when none, or when the file is not one of ours)."""
    try:
        doc = json.loads(decisions_path(fingerprint).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), dict):
        return {}
    return {k: v for k, v in doc["entries"].items() if isinstance(v, dict) and _samples(v)}


def _samples(entry: dict[str, Any]) -> list[float]:
    raw = entry.get("samples_ms")
    if not isinstance(raw, list):
        return []
    vals = [float(x) for x in raw if isinstance(x, (int, float)) and np.isfinite(x) and x > 0]
    return vals if len(vals) == len(raw) else []


def record_decision(fingerprint: str, model: str, weights: str, seq: int, samples_ms: Sequence[float]) -> Path:
    """Keep one bench run's decision times for this device (replacing an earlier run of the same key)."""
    path = decisions_path(fingerprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = load_decisions(fingerprint)
    entries[f"{model}:{weights}:{seq}"] = {"samples_ms": [float(x) for x in samples_ms],
                                           "p50_ms": float(np.median(samples_ms)),
                                           "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    return write_atomic(path, json.dumps({"format": FORMAT, "schema": 1, "entries": entries}, indent=1))


def faster_runtime(model: str | None = None) -> Any:
    """For `devices.resolve(measured=...)`: says why `rival` measured faster than `picked` deciding the same model
    (the same key in both devices' records, `model` first if given), or None: no common record, too few samples,
    a tie or noisy samples keep the rule's choice."""

    def measured(picked: DeviceInfo, rival: DeviceInfo) -> str | None:
        mine, theirs = load_decisions(picked.fingerprint), load_decisions(rival.fingerprint)
        keys = sorted(set(mine) & set(theirs), key=lambda k: (model is None or not k.startswith(f"{model}:"), k))
        for key in keys:
            a, b = _samples(mine[key]), _samples(theirs[key])
            if min(len(a), len(b)) < MIN_SAMPLES:
                continue
            verdict = compare(summarize(a), summarize(b))
            if verdict.verdict != "faster":
                return None
            name = key.split(":")[0]
            return (f"a discrete GPU; {_runtime(rival)} measured faster than {_runtime(picked)} on it "
                    f"({np.median(b):.2f} vs {np.median(a):.2f} ms p50 deciding {name}, `tilewise bench`)")
        return None

    return measured


def _runtime(info: DeviceInfo) -> str:
    return "Dawn" if info.runtime == "dawn" else "wgpu-native"
