"""`race_executors`: the decision race of two or more executors on the same prompts, without a GPU (fake
executors whose scores are a function of the prompt)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import numpy as np
import pytest

from tilewise.model.bench import race_args, race_executors


class FakeExecutor:
    """Scores = a fixed projection of the prompt's ids plus `offset`; records every prompt it decides."""

    def __init__(self, offset: float, calls: list[tuple[str, int]], name: str) -> None:
        self.offset, self.calls, self.name = offset, calls, name

    def forward(self, ids, start, base, slicing):
        assert start == 0 and base is None and slicing is True  # a whole decision, final-row slicing on
        self.calls.append((self.name, int(ids[0])))
        scores = np.cos(np.arange(8) * float(ids.sum()) * 1e-3).astype(np.float32) + np.float32(self.offset)
        return None, SimpleNamespace(scores=scores)


def test_the_race_times_every_executor_alike_and_reports_the_largest_score_difference(rng):
    full = [rng.integers(0, 1000, 30) for _ in range(12)]
    calls: list[tuple[str, int]] = []
    offset = float(rng.uniform(1e-4, 1e-2))
    executors = {"a": FakeExecutor(0.0, calls, "a"), "b": FakeExecutor(offset, calls, "b")}
    samples, diff = race_executors(executors, full, rounds=3, per_round=5, warmup_s=0.0)
    assert set(samples) == {"a", "b"} and all(len(v) == 3 * 5 for v in samples.values())
    assert all(ms >= 0.0 for v in samples.values() for ms in v)
    assert abs(diff - offset) < 1e-6  # every score moved by the offset, compared over the first 8 prompts
    assert {name for name, _ in calls} == {"a", "b"}
    first_ids = {int(ids[0]) for ids in full}
    assert {i for _, i in calls} <= first_ids  # only the given prompts are decided


def test_one_executor_races_alone_with_no_difference(rng):
    full = [rng.integers(0, 1000, 30) for _ in range(4)]
    samples, diff = race_executors({"only": FakeExecutor(0.5, [], "only")}, full, rounds=2, per_round=3,
                                   warmup_s=0.0)
    assert len(samples["only"]) == 6 and diff == 0.0


def test_race_args_give_every_race_script_the_same_options_with_its_defaults():
    ap = argparse.ArgumentParser()
    race_args(ap, "default", 348, "mode")
    args = ap.parse_args([])
    assert (args.preset, args.seq, args.rounds, args.per_round, args.device) == ("default", 348, 40, 5, "cuda")
    args = ap.parse_args(["--preset", "lfm2-350m", "--seq", "346", "--rounds", "3", "--per-round", "7"])
    assert (args.preset, args.seq, args.rounds, args.per_round) == ("lfm2-350m", 346, 3, 7)
    assert "decisions per mode and round" in ap.format_help()


def test_a_race_record_holds_every_mode_and_nothing_is_written_without_a_folder(rng, tmp_path, monkeypatch):
    """`write_race`: the JSON of a race has the command as run, the model, the caller's fields and each mode's
    percentiles, median interval and every sample; without a folder it writes nothing. `race_lines` prints one line
    per mode with its p50."""
    import json

    from tilewise.model.bench import race_lines, write_race
    from tilewise.tune.measure import summarize

    samples = {m: [float(v) for v in rng.uniform(lo, lo + 0.1, 24)] for m, lo in (("on", 1.0), ("off", 2.0))}
    stats = {m: summarize(v) for m, v in samples.items()}
    dev = SimpleNamespace(info=SimpleNamespace(as_dict=lambda: {"name": "fake GPU"}))
    monkeypatch.setattr("sys.argv", ["x.py", "--preset", "tiny"])
    write_race(None, "r.json", "experiments/x.py", dev, "tiny", 40, samples, stats, extra=1)
    assert list(tmp_path.iterdir()) == []
    write_race(tmp_path / "sub", "r.json", "experiments/x.py", dev, "tiny", 40, samples, stats, extra=1)
    doc = json.loads((tmp_path / "sub" / "r.json").read_text())
    assert doc["command"] == "python3 experiments/x.py --preset tiny" and doc["extra"] == 1
    assert doc["device"] == {"name": "fake GPU"} and (doc["preset"], doc["seq"]) == ("tiny", 40)
    for m, v in samples.items():
        assert doc[m]["samples_ms"] == v and doc[m]["n"] == 24
        assert doc[m]["median_ci95_ms"][0] <= doc[m]["p50"] <= doc[m]["median_ci95_ms"][1]
    lines = race_lines(samples)
    assert len(lines) == 2 and lines[0].startswith("decision, on: p50 1.0")
    assert lines[1].startswith("decision, off: p50 2.0")


def test_a_pair_race_compares_the_new_mode_with_the_base_and_prints_it_one_way(rng, monkeypatch):
    """`race_pair`: the race's samples and difference as `race_executors` gave them, each mode's stats, the new mode
    compared with the base round by round (faster here: its samples are all lower), and both executors' GPU time
    per op; `verdict_text` prints the verdict with its ratio, its interval and, where there is one, its note after a
    semicolon."""
    import tilewise.model.bench as bench
    from tilewise.tune.measure import paired_compare, rounds_of, summarize

    base_ms = list(rng.uniform(1.9, 2.1, 40))
    new_ms = list(rng.uniform(1.4, 1.6, 40))
    monkeypatch.setattr(bench, "race_executors", lambda ex, full, rounds, per_round: ({"a": base_ms, "b": new_ms},
                                                                                        0.25))

    class Timed:
        def __init__(self, ms: float) -> None:
            self.ms, self.last_op_times = ms, []

        def forward(self, ids, start, base, slicing, timed=False):
            assert timed
            self.last_op_times = [("matmul", self.ms), ("matmul", self.ms), ("norm", 0.01)]

    r = bench.race_pair({"a": Timed(0.5), "b": Timed(0.3)}, [np.arange(4)], 10, 4, "a", "b", ("slow", "fast"))
    assert r.samples == {"a": base_ms, "b": new_ms} and r.diff == 0.25
    assert r.stats["b"].median_ms == summarize(new_ms).median_ms
    want = paired_compare(rounds_of(base_ms, 4), rounds_of(new_ms, 4), ("slow", "fast"))
    assert (r.verdict.verdict, r.verdict.ratio) == (want.verdict, want.ratio) and r.verdict.ratio > 1.2
    assert r.verdict.verdict == "faster" and 1.0 < r.verdict.interval[0] <= r.verdict.ratio <= r.verdict.interval[1]
    assert r.ops["a"]["matmul"]["launches"] == 2 and abs(r.ops["b"]["matmul"]["ms"] - 0.6) < 1e-12
    assert r.op_lines[0].startswith("op") and len(r.op_lines) == 3
    text = bench.verdict_text(r.verdict)
    assert text.startswith(f"{r.verdict.verdict} ({r.verdict.ratio:.3f}x")
    lo, hi = r.verdict.interval
    assert text == f"faster ({r.verdict.ratio:.3f}x, 95% {lo:.3f}-{hi:.3f})"
    noted = SimpleNamespace(verdict="tie", ratio=1.0, note="noisy")
    assert bench.verdict_text(noted) == "tie (1.000x; noisy)"


def test_a_pair_race_report_prints_the_verdict_and_the_bits_and_writes_the_record(rng, tmp_path, monkeypatch, capsys):
    """`report_pair`: each mode's line, the titled verdict, the score difference (flagged unless 0) and the op
    table, and a JSON record with the caller's fields, the verdict and the difference."""
    import json

    import tilewise.model.bench as bench
    from tilewise.tune.measure import compare, summarize

    samples = {"base": list(rng.uniform(1.9, 2.1, 30)), "new": list(rng.uniform(1.5, 1.7, 30))}
    stats = {m: summarize(v) for m, v in samples.items()}
    verdict = compare(stats["base"], stats["new"], ("base", "new"))
    dev = SimpleNamespace(info=SimpleNamespace(as_dict=lambda: {"name": "fake GPU"}))
    args = SimpleNamespace(out=str(tmp_path), preset="tiny", seq=40)
    monkeypatch.setattr("sys.argv", ["x.py"])
    for diff in (0.0, float(rng.uniform(1e-4, 1e-2))):
        race = bench.PairRace(samples, stats, verdict, diff, {"new": {"matmul": {"ms": 0.5}}}, ["op  a  b", "mm 1 2"])
        bench.report_pair(race, "new over base", args, dev, "r.json", "experiments/x.py", changed=["x"])
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith("decision, base: p50 ") and out[1].startswith("decision, new: p50 ")
        assert out[2] == f"new over base: {bench.verdict_text(verdict)}"
        assert out[3] == f"max |score difference| {diff:.2e}" + ("" if diff == 0.0 else "  (not bit-identical)")
        assert out[4:] == ["op  a  b", "mm 1 2"]
        doc = json.loads((tmp_path / "r.json").read_text())
        assert doc["max_abs_score_diff"] == diff and doc["changed"] == ["x"]
        assert doc["verdict"] == {"verdict": verdict.verdict, "speedup": verdict.ratio, "note": verdict.note}
        assert doc["new"]["samples_ms"] == samples["new"]


def test_prompts_share_one_prefix_and_refuse_a_length_that_leaves_no_new_tokens(rng):
    from tilewise.errors import ConfigError
    from tilewise.model.bench import prompts

    seq, prefix = int(rng.integers(10, 80)), int(rng.integers(1, 9))
    head, full = prompts(512, seq, 4, prefix, seed=int(rng.integers(0, 99)))
    assert head.shape == (prefix,) and all(p.shape == (seq,) and (p[:prefix] == head).all() for p in full)
    assert len({p[prefix:].tobytes() for p in full}) == 4  # a fresh tail each time
    for bad in (prefix, prefix - 1):
        with pytest.raises(ConfigError, match="no new tokens") as err:
            prompts(512, bad, 4, prefix)
        assert f"above {prefix}" in str(err.value.fix)
