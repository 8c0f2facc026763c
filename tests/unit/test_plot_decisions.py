"""bench/plot_decisions.py: both benchmarks' record formats read into labelled series, p50s as numpy's median,
peers measured in several records told apart, too-short series left out with a note, bad files refused, a PNG
written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tests.scripts import load_script

from tilewise.errors import ConfigError


@pytest.fixture(scope="module")
def pd():
    return load_script("bench/plot_decisions.py")


def cuda_record(folder: Path, rng: np.random.Generator, n: int = 30) -> tuple[Path, dict[str, list[float]]]:
    samples = {k: list(rng.lognormal(np.log(m), 0.05, n)) for k, m in
               (("tilewise_cuda", 1.0), ("hf_eager", 10.0), ("hf_compile", 4.0))}
    impls = {"tilewise_cuda": "tilewise cuda nf4", "hf_eager": "HF transformers Lfm2Model bf16 eager",
             "hf_compile": "HF transformers Lfm2Model bf16 torch.compile"}
    doc = {"date": "2026-12-07T10:00:00+00:00", "device": {"name": "GPU X"},
           "race_lfm2-350m": {k: {"impl": impls[k], "latency_samples_ms": v} for k, v in samples.items()}}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model_cuda.json"
    path.write_text(json.dumps(doc))
    return path, samples


def webgpu_record(folder: Path, rng: np.random.Generator, short: int = 3) -> tuple[Path, list[float]]:
    dawn = list(rng.lognormal(np.log(3.5), 0.03, 40))
    doc = {"meta": {"adapter": {"name": "GPU X"}}, "results": [
        {"section": "tune lfm2-350m", "seconds": 100.0},
        {"section": "tilewise lfm2-350m nf4", "device": "webgpu", "preset": "lfm2-350m",
         "fingerprint": "webgpu+dawn-1:Vulkan:GPU-X:drv:abc", "latency_samples_ms": dawn},
        {"section": "hf-compile lfm2-350m", "impl": "HF transformers Lfm2Model bf16 torch.compile",
         "latency_samples_ms": list(rng.lognormal(np.log(5.0), 0.1, 40))},
        {"section": "tilewise seed-250m nf4", "device": "webgpu", "preset": "seed-250m",
         "fingerprint": "webgpu:Vulkan:GPU-X:drv:abc", "latency_samples_ms": list(rng.uniform(2, 3, short))},
    ]}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "decision_webgpu.json"
    path.write_text(json.dumps(doc))
    return path, dawn


def test_records_read_into_series_with_runtime_labels_and_true_medians(pd, tmp_path):
    rng = np.random.default_rng(7)
    cpath, csamples = cuda_record(tmp_path / "runA", rng)
    wpath, dawn = webgpu_record(tmp_path / "runB", rng)
    series, notes = pd.collect([cpath, wpath])
    by = {(s.model, s.label): s for s in series}
    assert by[("lfm2-350m", "tilewise CUDA")].p50() == pytest.approx(float(np.median(csamples["tilewise_cuda"])))
    assert by[("lfm2-350m", "tilewise Dawn")].p50() == pytest.approx(float(np.median(dawn)))
    assert by[("lfm2-350m", "HF eager (bf16)")].device == "GPU X"  # measured in one record: no tag
    # torch.compile ran in both records: one row each, tagged with its record's folder
    assert {lab for (_, lab) in by if lab.startswith("torch.compile")} == {
        "torch.compile (HF, bf16) [runA]", "torch.compile (HF, bf16) [runB]"}
    # three decisions are not a distribution: the wgpu-native seed-250m row is left out, and said so
    assert not any(s.model == "seed-250m" for s in series)
    assert len(notes) == 1 and "seed-250m" in notes[0] and "3 decisions" in notes[0]


def test_records_of_one_folder_are_told_apart_by_file(pd, tmp_path):
    rng = np.random.default_rng(11)
    first, _ = cuda_record(tmp_path / "run", rng)
    second = first.with_name("call2-model_cuda.json")
    first.rename(first.with_name("call1-model_cuda.json"))
    cuda_record(tmp_path / "run", rng)[0].rename(second)
    series, _ = pd.collect([first.with_name("call1-model_cuda.json"), second])
    labels = [s.label for s in series if s.label.startswith("tilewise CUDA")]
    assert sorted(labels) == ["tilewise CUDA [call1-model_cuda]", "tilewise CUDA [call2-model_cuda]"]


def test_bad_records_are_refused_with_a_fix(pd, tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        pd.collect([bad])
    other = tmp_path / "y.json"
    other.write_text(json.dumps({"rows": [1, 2]}))
    with pytest.raises(ConfigError, match="not a record"):
        pd.collect([other])
    empty = tmp_path / "z.json"
    empty.write_text(json.dumps({"results": [{"section": "tune", "seconds": 1.0}]}))
    with pytest.raises(ConfigError, match="no timed decisions"):
        pd.collect([empty])
    assert pd.main([str(other), "--out", str(tmp_path / "f.png")]) == 2
    assert not (tmp_path / "f.png").exists()


def test_the_figure_is_written(pd, tmp_path):
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(3)
    cpath, _ = cuda_record(tmp_path / "runA", rng)
    wpath, _ = webgpu_record(tmp_path / "runB", rng, short=12)
    out = tmp_path / "fig.png"
    assert pd.main([str(cpath), str(wpath), "--out", str(out), "--title", "t"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
