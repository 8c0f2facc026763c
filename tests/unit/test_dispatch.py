"""Dispatch fitting: fewest ranges within tolerance of the per-M best, M parsing, lookups."""

import itertools
import json
import random

import pytest

from tilewise.errors import ConfigError
from tilewise.tune.dispatch import DispatchTable, Entry, fit_dispatch, lookup, parse_m_values


def test_parse_m_values():
    assert parse_m_values("1..5") == [1, 2, 3, 4, 5]
    assert parse_m_values("1..20:8") == [1, 9, 17, 20]
    assert parse_m_values("96,1,2..3") == [1, 2, 3, 96]
    for bad in ("0..4", "5..2", "a", "1..4:0", ""):
        if bad == "":
            assert parse_m_values(bad) == []
            continue
        with pytest.raises(ConfigError):
            parse_m_values(bad)


def sawtooth(tile, ms, per_row=0.01, per_tile=0.1):
    # time grows with the padded row count (whole tiles), like seed 001's 346 rows in 32- vs 64-row tiles
    return {m: per_row * tile * -(-m // tile) + per_tile * -(-m // tile) for m in ms}


def test_short_row_then_wide_tile_cutoff():
    ms = list(range(1, 200))
    small = {m: 0.02 * m + 0.1 for m in ms}  # cheap at few rows, scales badly
    big = {m: 2.0 + 0.002 * m for m in ms}  # fixed overhead, scales well
    ranges = fit_dispatch({"small": small, "big": big}, ms, 0.0)
    assert [r.config for r in ranges] == ["small", "big"]
    cut = ranges[1].m_min
    assert small[cut - 1] <= big[cut - 1] and big[cut] < small[cut]
    assert ranges[0].m_min == 1 and ranges[-1].m_max == 199


def test_tolerance_merges_ranges():
    ms = list(range(1, 129))
    times = {"t32": sawtooth(32, ms), "t64": sawtooth(64, ms)}
    strict = fit_dispatch(times, ms, 0.0)
    loose = fit_dispatch(times, ms, 1.0)
    assert len(loose) == 1 < len(strict)
    assert {r.config for r in strict} == {"t32", "t64"}


def brute_force_min_ranges(times, ms, tol):
    best = {m: min(t[m] for t in times.values() if m in t) for m in ms}
    good = {c: {m for m in ms if m in t and t[m] <= (1 + tol) * best[m]} for c, t in times.items()}
    n = len(ms)
    for k in range(1, n + 1):
        for cuts in itertools.combinations(range(1, n), k - 1):
            bounds = [0, *cuts, n]
            if all(any(all(ms[x] in g for x in range(a, b)) for g in good.values())
                   for a, b in itertools.pairwise(bounds)):
                return k
    raise AssertionError


@pytest.mark.parametrize("seed", range(12))
def test_greedy_is_optimal_against_brute_force(seed):
    rnd = random.Random(seed)
    ms = sorted(rnd.sample(range(1, 60), 9))
    times = {c: {m: rnd.uniform(1, 2) for m in ms} for c in "abcd"}
    ranges = fit_dispatch(times, ms, 0.05)
    assert len(ranges) == brute_force_min_ranges(times, ms, 0.05)
    best = {m: min(t[m] for t in times.values()) for m in ms}
    for r in ranges:  # every measured M in a range is within tolerance for its config
        for m in ms:
            if r.m_min <= m <= r.m_max:
                assert times[r.config][m] <= 1.05 * best[m]
    assert all(a.m_max + 1 == b.m_min for a, b in itertools.pairwise(ranges))


def test_missing_measurements_mean_the_config_cannot_cover():
    ms = [1, 2, 3]
    ranges = fit_dispatch({"a": {1: 1.0, 3: 1.0}, "b": {1: 5.0, 2: 5.0, 3: 5.0}}, ms, 0.03)
    assert [r.config for r in ranges] == ["a", "b", "a"]


def test_lookup():
    entry = {"family": "gemm", "ranges": [{"m_min": 1, "m_max": 95, "kernel": "gemm", "config": {"BM": 32}},
                                          {"m_min": 96, "m_max": 512, "kernel": "gemm", "config": {"BM": 64}}]}
    table = {"format": "tilewise-dispatch", "schema": 2, "device": "d", "kernel_versions": {"gemm": "v"},
             "entries": {"gemm:64x64": entry}}
    assert lookup(table, 1) == {"BM": 32} and lookup(table, 95) == {"BM": 32}
    assert lookup(table, 96) == {"BM": 64} and lookup(table, 4000) == {"BM": 64}
    assert lookup(table, 96, "gemm:64x64") == {"BM": 64}
    with pytest.raises(ConfigError, match="no range"):
        lookup({**table, "entries": {"gemm:64x64": {**entry, "ranges": [{**entry["ranges"][1]}]}}}, 3)


def test_table_round_trip_and_staleness(tmp_path):
    entry = Entry([{"m_min": 1, "m_max": None, "kernel": "k", "config": {"A": 1}}], family="gemm")
    table = DispatchTable("dev", {"gemm:8x8": entry, "attention:4x2x16": Entry(
        [{"m_min": 1, "m_max": None, "kernel": "attention", "config": {"BQ": 16}}], family="attention")},
        {"gemm": "v1", "attention": "a1"})
    back = DispatchTable.load(table.save(tmp_path / "t.json"))
    assert back.pick("gemm:8x8", 10_000) == ("k", {"A": 1}) and back.source.endswith("t.json")
    usable, notes = back.usable_on("dev", {"gemm": "v2", "attention": "a1"})
    assert list(usable.entries) == ["attention:4x2x16"] and "gemm" in notes[0]
    other, notes = back.usable_on("another", {"gemm": "v1", "attention": "a1"})
    assert not other.entries and "another" in notes[0]


def test_old_formats_are_refused_with_the_fix(tmp_path):
    for old in ({"format": "tilewise-model-dispatch", "matmul": {}}, {"kernel": "gemm", "ranges": []}):
        p = tmp_path / "old.json"
        p.write_text(json.dumps(old))
        with pytest.raises(ConfigError, match="measure it again"):
            DispatchTable.load(p)
    (tmp_path / "junk.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a tilewise dispatch table"):
        DispatchTable.load(tmp_path / "junk.json")


def test_family_version_is_per_backend(tmp_path, monkeypatch):
    """Editing one backend's kernels leaves the other backends' versions (and so their tables) as they were; a
    shared file or another family's module a backend imports changes that backend's version."""
    from tilewise.tune import dispatch

    kernels = tmp_path / "kernels"
    fam, other = kernels / "fam", kernels / "other"
    fam.mkdir(parents=True)
    other.mkdir()
    files = {"problem.py": "P = 1\n", "webgpu.py": "from tilewise.kernels.other.helper import H\n",
             "wgsl_tiled.py": "W = 1\n", "cuda.py": "C = 1\n", "k.cu": "// kernel\n", "shader.wgsl": "// wgsl\n"}
    for name, text in files.items():
        (fam / name).write_text(text)
    (other / "helper.py").write_text("H = 1\n")
    monkeypatch.setattr(dispatch, "_KERNELS", kernels)

    def versions():
        return {b: dispatch.package_version(fam, b) for b in ("webgpu", "cuda")}

    rng = random.Random(5)
    for name, changes in [("k.cu", {"cuda"}), ("cuda.py", {"cuda"}), ("wgsl_tiled.py", {"webgpu"}),
                          ("shader.wgsl", {"webgpu"}), ("problem.py", {"webgpu", "cuda"})]:
        before = versions()
        mark = "#" if name.endswith(".py") else "//"
        (fam / name).write_text((fam / name).read_text() + f"{mark} edit {rng.random()}\n")
        after = versions()
        assert {b for b in before if before[b] != after[b]} == changes, name
    before = versions()
    (other / "helper.py").write_text("H = 2\n")
    after = versions()
    assert before["cuda"] == after["cuda"] and before["webgpu"] != after["webgpu"]


def test_family_version_of_the_real_matmul_family():
    """The WebGPU and CUDA matmul templates hash different code, and the WebGPU one includes the gemm family's
    subgroup-matrix modules its sgmat kernels import."""
    from pathlib import Path

    from tilewise.kernels.matmul import cuda as mm_cuda
    from tilewise.kernels.matmul import sgmat, webgpu
    from tilewise.tune.dispatch import _imported_kernel_files, family_version

    assert family_version(webgpu.MatmulTemplate()) != family_version(mm_cuda.CudaMatmul())
    imported = {p.relative_to(Path(sgmat.__file__).parents[1]).as_posix()
                for p in _imported_kernel_files(Path(sgmat.__file__))}
    assert {"gemm/sgmat.py", "gemm/sgmat_wgsl.py"} <= imported
