"""Decision latencies from benchmark records as a picture: each implementation's timed decisions as dots over a box
(quartiles, the median as a bar, whiskers from the 1st to the 99th percentile) on a log time axis, one panel per
model shape, the p50 written beside each row.

Reads what `bench/model_cuda.py` (`model_cuda.json`) and `bench/decision_webgpu.py` (`decision_webgpu.json`) write.
Give the records of one machine together (say the CUDA run and the Dawn run): tilewise's rows are named by runtime
(CUDA, Dawn, wgpu-native), and a peer measured in more than one record (HF eager, `torch.compile`) gets a row per
record, tagged with the record's folder, since its times move between runs and only rows of one record compare.

    python3 bench/plot_decisions.py RECORD.json [RECORD.json ...] --out FIG.png [--title TEXT]

Needs matplotlib (the `plot` extra).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tilewise.errors import ConfigError  # noqa: E402
from tilewise.tune.plot import PALETTE, pyplot, require_plot  # noqa: E402

MIN_SAMPLES = 5  # fewer timed decisions than this are not a distribution: such a row is left out, and said so


@dataclass
class Series:
    """One implementation's timed decisions of one model shape in one record."""

    model: str
    label: str
    samples_ms: list[float]
    record: str
    device: str = ""

    def p50(self) -> float:
        return float(np.median(self.samples_ms))


def _peer_label(impl: str) -> str:
    if "torch.compile" in impl:
        return "torch.compile (HF, bf16)"
    if "eager" in impl:
        return "HF eager (bf16)"
    return impl


def _runtime(entry: dict[str, Any]) -> str:
    fp = str(entry.get("fingerprint", ""))
    if fp.startswith("webgpu+dawn") or entry.get("device") == "dawn":
        return "Dawn"
    if fp.startswith("cuda") or entry.get("device") == "cuda":
        return "CUDA"
    return "wgpu-native"


def read_record(path: Path, tag: str | None = None) -> list[Series]:
    """The series of one record file (either benchmark's format), tagged `tag` (default: the record's folder)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path} as a benchmark record ({exc})",
                          "pass the model_cuda.json or decision_webgpu.json a benchmark wrote") from exc
    tag = tag or path.parent.name or path.stem
    out: list[Series] = []
    if isinstance(doc, dict) and any(k.startswith("race_") for k in doc):  # bench/model_cuda.py
        device = str(doc.get("device", {}).get("name", ""))
        for key, race in doc.items():
            if not key.startswith("race_") or not isinstance(race, dict):
                continue
            for name, entry in race.items():
                if not isinstance(entry, dict) or not entry.get("latency_samples_ms"):
                    continue
                impl = str(entry.get("impl", name))
                label = f"tilewise {_runtime({'device': impl.split()[1]})}" if impl.startswith("tilewise") else \
                    _peer_label(impl)
                out.append(Series(key[len("race_"):], label, [float(v) for v in entry["latency_samples_ms"]], tag,
                                  device))
    elif isinstance(doc, dict) and isinstance(doc.get("results"), list):  # bench/decision_webgpu.py
        meta = doc.get("meta", {})
        device = str(meta.get("adapter", {}).get("name", ""))
        for entry in doc["results"]:
            if not isinstance(entry, dict) or not entry.get("latency_samples_ms"):
                continue
            section = str(entry.get("section", ""))
            model = str(entry.get("preset") or (section.split()[1] if len(section.split()) > 1 else "model"))
            label = _peer_label(str(entry["impl"])) if "impl" in entry else f"tilewise {_runtime(entry)}"
            out.append(Series(model, label, [float(v) for v in entry["latency_samples_ms"]], tag, device))
    else:
        raise ConfigError(f"{path} is not a record of bench/model_cuda.py or bench/decision_webgpu.py",
                          "pass the model_cuda.json or decision_webgpu.json a benchmark wrote")
    return out


def collect(paths: list[Path]) -> tuple[list[Series], list[str]]:
    """Every series of the records, a peer's label tagged with its record where several records measured it;
    returns (series, notes on what was left out)."""
    series: list[Series] = []
    folders = [p.resolve().parent for p in paths]
    for p, folder in zip(paths, folders):
        # a record is named by its folder, or by its file where one folder holds several of the records
        series += read_record(p, p.stem if folders.count(folder) > 1 else folder.name)
    notes = [f"{s.label} ({s.model}, {s.record}): {len(s.samples_ms)} decisions, left out" for s in series
             if len(s.samples_ms) < MIN_SAMPLES]
    series = [s for s in series if len(s.samples_ms) >= MIN_SAMPLES]
    seen: dict[tuple[str, str], set[str]] = {}
    for s in series:
        seen.setdefault((s.model, s.label), set()).add(s.record)
    for s in series:
        if len(seen[(s.model, s.label)]) > 1:
            s.label = f"{s.label} [{s.record}]"
    if not series:
        raise ConfigError("the records hold no timed decisions to plot",
                          "pass records of runs that timed decisions (latency_samples_ms)")
    return series, notes


def plot(series: list[Series], out: str, title: str | None = None) -> None:
    """Write the figure: a panel per model, a row per series, fastest p50 at the top."""
    plt = pyplot()
    models = list(dict.fromkeys(s.model for s in series))
    rows = [sorted((s for s in series if s.model == m), key=Series.p50) for m in models]
    height = sum(0.45 * len(r) + 0.9 for r in rows) + 0.6
    fig, axes = plt.subplots(len(models), 1, figsize=(9, height), squeeze=False,
                             gridspec_kw={"height_ratios": [len(r) for r in rows]})
    colours = {label: PALETTE[i % len(PALETTE)]
               for i, label in enumerate(dict.fromkeys(s.label.split(" [")[0] for s in series))}
    lo = min(min(s.samples_ms) for s in series)
    hi = max(max(s.samples_ms) for s in series)
    for ax, model, group in zip(axes[:, 0], models, rows):
        for y, s in enumerate(group):
            c = colours[s.label.split(" [")[0]]
            q = np.percentile(s.samples_ms, [1, 25, 75, 99])
            ax.plot([q[0], q[3]], [y, y], color=c, lw=1)  # the 1st-99th percentile whisker
            ax.add_patch(plt.Rectangle((q[1], y - 0.28), q[2] - q[1], 0.56, fc=c, alpha=0.25, ec=c))
            ax.plot([s.p50()] * 2, [y - 0.3, y + 0.3], color=c, lw=2.5)
            jitter = [((i * 0.618) % 1 - 0.5) * 0.4 for i in range(len(s.samples_ms))]  # spread, not random: stable
            ax.scatter(s.samples_ms, [y + j for j in jitter], s=6, color=c, alpha=0.6, lw=0)
            ax.text(hi * 1.15, y, f"{s.p50():.2f} ms", va="center", fontsize=8)
        ax.set_yticks(range(len(group)), [s.label for s in group], fontsize=8)
        ax.set_xscale("log")
        ax.set_xlim(lo / 1.3, hi * 2.2)
        ticks = [m * 10.0 ** e for e in range(-2, 4) for m in (1, 2, 5) if lo / 1.3 <= m * 10.0 ** e <= hi * 2.2]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks], fontsize=8)
        ax.minorticks_off()
        ax.invert_yaxis()
        ax.grid(axis="x", which="both", alpha=0.3)
        devices = ", ".join(sorted({s.device for s in group if s.device}))
        name = "the bundled model" if model == "default" else model  # the preset `default` is the bundled model
        ax.set_title(f"{name}: one decision, ms (log scale){f' on {devices}' if devices else ''}", fontsize=9)
    axes[-1, 0].set_xlabel("decision latency, ms\ndots: timed decisions; box: quartiles, bar: median; whiskers: 1st to "
                           "99th percentile", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", nargs="+", type=Path, help="model_cuda.json / decision_webgpu.json files")
    ap.add_argument("--out", required=True, help="the figure's file (.png, .svg, .pdf)")
    ap.add_argument("--title", default=None, help="a title over the panels")
    args = ap.parse_args(argv)
    try:
        out = require_plot(args.out)
        series, notes = collect(args.records)
        plot(series, out, args.title)
    except ConfigError as exc:
        print(f"error: {exc.problem}\nfix: {exc.fix}", file=sys.stderr)
        return 2
    for n in notes:
        print(n)
    for s in series:
        print(f"{s.model:<12} {s.label:<44} p50 {s.p50():8.3f} ms  ({len(s.samples_ms)} decisions)")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
