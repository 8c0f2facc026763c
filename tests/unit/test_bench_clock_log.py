"""bench/clock_log.py: nvidia-smi's lines parsed into (time, MHz, %), and each traced decision set beside the sample
nearest its start, so a slow stretch of a series can be read against the SM clock."""

from __future__ import annotations

import datetime
import random

from tests.scripts import load_script

clock_log = load_script("bench/clock_log.py")


def test_samples_parse_nvidia_smi_lines_and_skip_broken_ones(tmp_path):
    rng = random.Random(5)
    t0 = datetime.datetime(2026, 12, 3, 15, 6, 56, 500000)
    want = []
    lines = ["timestamp, clocks.sm [MHz], utilization.gpu [%], power.draw [W]"]  # a header is skipped
    for i in range(20):
        t = t0 + datetime.timedelta(milliseconds=50 * i)
        mhz, util = rng.choice([345, 465, 1980]), rng.randint(0, 100)
        lines.append(f"{t:%Y/%m/%d %H:%M:%S.%f}"[:-3] + f", {mhz}, {util}, {rng.uniform(80, 300):.2f}")
        want.append((t.timestamp(), mhz, util))
    lines.append("2026/12/03 15:06:")  # cut short when the log stopped
    path = tmp_path / "clocks.csv"
    path.write_text("\n".join(lines) + "\n")
    got = clock_log.ClockLog(path).samples()
    assert [(round(t, 3), m, u) for t, m, u in got] == [(round(t, 3), m, u) for t, m, u in want]


def test_each_traced_call_gets_the_nearest_sample():
    rng = random.Random(9)
    samples = [(1000.0 + 0.05 * i, float(rng.choice([345, 1980])), float(rng.randint(0, 100))) for i in range(100)]
    trace = [{"unix_s": 1000.0 + rng.uniform(0, 5), "ms": rng.uniform(4, 20), "timed": bool(i % 3)}
             for i in range(30)]
    rows = clock_log.joined(trace, samples)
    for e, r in zip(trace, rows, strict=True):
        near = min(samples, key=lambda s: abs(s[0] - e["unix_s"]))
        assert (r["sm_mhz"], r["util_pct"]) == (near[1], near[2])
        assert abs(r["sample_offset_s"]) <= 0.025 + 1e-9
        assert r["ms"] == e["ms"] and r["timed"] == e["timed"]
    assert all(r["sm_mhz"] is None for r in clock_log.joined(trace, []))
