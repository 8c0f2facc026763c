"""The parts experiments take one part out of a kernel by editing its source text: each edit must find its text
exactly once in the current source (a kernel change that duplicates or drops it would silently time the wrong
kernel), and the edited source must differ from the real one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    return load_script(f"experiments/{name}.py")


@pytest.fixture(scope="module")
def wgr_parts():
    return load("wgr_parts_cuda")


def test_every_wgr_part_edit_finds_its_text_once_and_changes_the_source(wgr_parts):
    real = wgr_parts.edited_source("")
    assert wgr_parts.EDITS
    for part, edits in wgr_parts.EDITS.items():
        for old, _ in edits:
            assert real.count(old) == 1, (part, old)
        assert wgr_parts.edited_source(part) != real, part



def test_the_pdl_trigger_race_turns_the_early_trigger_on():
    """experiments/pdl_trigger_cuda.py's `start` mode: pdl.cuh's switch occurs once in a model source, is off as
    shipped, and the edit turns it on."""
    import tilewise.kernels.cudasrc as cudasrc
    from tilewise.kernels.matmul.cuda_source import matmul_source

    pdl = load("pdl_trigger_cuda")
    real = cudasrc.model_source("matmul", "matmul_mma.cu")
    assert real.count(pdl.TRIGGER) == 1 and pdl.EARLY not in real
    edited = pdl.early_trigger(cudasrc.model_source)("matmul", "matmul_mma.cu")
    assert edited == real.replace(pdl.TRIGGER, pdl.EARLY)
    # the race's edit reaches the text every family compiles: the matmul family builds its own (cuda_source.py)
    with pdl.model_sources(pdl.early_trigger(cudasrc.model_source)):
        assert pdl.EARLY in matmul_source()
    assert pdl.EARLY not in matmul_source()


def test_the_source_patch_reaches_every_family_and_is_undone():
    """experiments/cuda_sources.py: every kernels module that builds a family's text is patched, so each family's
    text (as its template compiles it) comes from the given source inside the block and from the files after it."""
    import tilewise.kernels.cudasrc as cudasrc
    from tilewise.kernels.attention.cuda import SOURCE_FILES as ATTENTION_FILES
    from tilewise.kernels.matmul.cuda_source import matmul_source

    cs = load("cuda_sources")
    names = {m.__name__ for m in cs.source_users()}
    assert {"tilewise.kernels.cudasrc", "tilewise.kernels.matmul.cuda_source", "tilewise.kernels.attention.cuda",
            "tilewise.kernels.rowops.cuda", "tilewise.kernels.shortconv.cuda"} <= names
    real = matmul_source()
    with cs.model_sources(lambda family, *files: f"// {family} {len(files)}"):
        assert matmul_source().startswith("// matmul ")
        for m in cs.source_users():
            assert m.model_source("attention", *ATTENTION_FILES) == f"// attention {len(ATTENTION_FILES)}"
    assert matmul_source() == real and cudasrc.model_source("attention", *ATTENTION_FILES).startswith("//")


def test_a_source_race_runs_each_side_with_its_own_text_and_finds_the_modules_once():
    """experiments/source_race_cuda.py: every decision of a side runs with that side's kernel text in place (the
    tree's side is patched with the real text the same way, so that patching costs both sides alike), the real text
    is back after each, and each side finds the patched modules once, not per decision (walking sys.modules before
    every decision cost a side about 0.2 ms)."""
    import tilewise.kernels.cudasrc as cudasrc
    from tilewise.kernels.matmul.cuda_source import matmul_source

    race = load("source_race_cuda")
    seen, walks = [], []

    class Fake:
        def forward(self, *args):
            seen.append(matmul_source()[:12])
            return args

    sources = sys.modules[race.model_sources.__module__]  # the module whose model_sources the race calls
    real_users = sources.source_users

    def counted():
        walks.append(1)
        return real_users()

    race.source_users = sources.source_users = counted
    try:
        base = race.WithSource(Fake(), lambda family, *files: f"// base {family}")
        tree = race.WithSource(Fake(), cudasrc.model_source)
        for _ in range(3):
            assert base.forward(1, 2) == (1, 2)
            assert tree.forward(3) == (3,)
    finally:
        race.source_users = sources.source_users = real_users
    real = matmul_source()
    assert seen == ["// base matm", real[:12]] * 3
    assert len(walks) == 2


def test_the_source_at_a_commit_is_that_commits_text():
    """source_at(rev) builds a family's text from rev's files in the order model_source does: at HEAD it is the
    tree's text when the kernels are unchanged; a revision git does not know is refused with its name."""
    import subprocess

    import tilewise.kernels.cudasrc as cudasrc
    from tilewise.kernels.matmul.cuda_source import SOURCE_FILES

    cs = load("cuda_sources")
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "src/tilewise/kernels"], cwd=ROOT).returncode
    if dirty:
        pytest.skip("the kernels differ from HEAD in this checkout")
    assert cs.source_at("HEAD")("matmul", *SOURCE_FILES) == cudasrc.model_source("matmul", *SOURCE_FILES)
    with pytest.raises(SystemExit, match="no-such-revision"):
        cs.source_at("no-such-revision")("matmul", *SOURCE_FILES)


def test_the_source_in_a_folder_is_that_folders_text(tmp_path):
    """source_in(folder) reads the headers and a family's files from a copy of a kernels folder, so that a copy with
    one file changed gives the real text with that file's text swapped; a folder without the files is refused."""
    import shutil

    import tilewise.kernels.cudasrc as cudasrc
    from tilewise.kernels.matmul.cuda_source import SOURCE_FILES

    cs = load("cuda_sources")
    kernels = ROOT / "src" / "tilewise" / "kernels"
    copy = tmp_path / "kernels"
    shutil.copytree(kernels, copy)
    real = cudasrc.model_source("matmul", *SOURCE_FILES)
    assert cs.source_in(copy)("matmul", *SOURCE_FILES) == real
    wgr = (copy / "matmul" / "matmul_wgr.cu").read_text()
    (copy / "matmul" / "matmul_wgr.cu").write_text(wgr + "// changed\n")
    assert cs.source_in(copy)("matmul", *SOURCE_FILES) == real.replace(wgr, wgr + "// changed\n")
    with pytest.raises(SystemExit, match="missing"):
        cs.source_in(tmp_path / "nothing")("matmul", *SOURCE_FILES)


def test_the_twin_races_change_only_the_configs_they_name():
    """experiments/cluster_reduce_cuda.py's twins on a real tuned table (with wgr DEC 3 and 2 put into two of its
    entries): `--twin dec` gives exactly those configs DEC 1 and names their entries, `--twin sr` turns the splitk
    SR 2 entry to SR 0; every other range, and the table it was given, stay as they were."""
    import json

    from tilewise.tune.dispatch import DispatchTable

    race = load("cluster_reduce_cuda")
    doc = json.loads((ROOT / "bench/results/2026-12-06-h100-cluster-pdl-dawn/callE-dispatch-cuda.json").read_text())
    wgr = [(k, r) for k, e in doc["entries"].items() for r in e["ranges"] if r["kernel"].startswith("nf4_matmul.wgr")]
    assert len(wgr) >= 3
    (k3, r3), (k2, r2) = wgr[0], wgr[1]
    r3["config"]["DEC"], r2["config"]["DEC"] = 3, 2
    table = DispatchTable.from_json(doc)
    before = json.dumps(table.to_json(), sort_keys=True)
    for twin, changed_keys in (("dec", sorted({k3, k2})), ("sr", None)):
        param, values, to, _ = race.TWINS[twin]
        got, changed = race.twin_table(table, param, values, to)
        assert json.dumps(table.to_json(), sort_keys=True) == before  # the given table is not touched
        old, new = table.to_json()["entries"], got.to_json()["entries"]
        diffs = {k for k in old for a, b in zip(old[k]["ranges"], new[k]["ranges"]) if a != b}
        assert diffs == set(changed) and changed
        if changed_keys is not None:
            assert changed == changed_keys
        for k in diffs:
            for a, b in zip(old[k]["ranges"], new[k]["ranges"]):
                if a != b:
                    assert a["config"][param] in values and b["config"] == {**a["config"], param: to}


def test_the_graph_trace_reader_cuts_each_modes_replays_and_sums_kernels_and_gaps_per_op(tmp_path, capsys):
    """experiments/graph_trace_cuda.py --parse on a synthetic cuda_gpu_trace CSV: a warm-up stretch, then per mode its
    replays after a pause (memory copies among them, left out); per op the kernel time and the idle time before its
    kernels are each decision's sums, their medians printed and written, and the span is first start to last end."""
    import json
    import types

    trace = load("graph_trace_cuda")
    modes = {"fold_norm on": ["a", "b", "b"], "fold_norm off": ["a", "p", "b", "b"]}
    (tmp_path / "launches.json").write_text(json.dumps({"device": "GPU", "preset": "p", "seq": 9, "decisions": 3,
                                                         "modes": modes}))
    rows, t = [], 0.0

    def kernel(dur_us: float, gap_us: float, name: str = "k") -> None:
        nonlocal t
        t += gap_us * 1e3
        rows.append([f"{t:.0f}", f"{dur_us * 1e3:.0f}", name])
        t += dur_us * 1e3

    for _ in range(7):
        kernel(5.0, 1.0)  # warm-up and the timed run: a stretch of another length
    for durs in ([10.0, 4.0, 6.0], [10.0, 2.0, 3.0, 3.0]):  # each mode's kernels, in its plan's order
        t += 60e6  # the pause
        for d in range(3):
            for i, dur in enumerate(durs):
                kernel(dur + d, 2.0 if i else 50.0)
            rows.append([f"{t:.0f}", "100", "[CUDA memcpy Device-to-Host]"])
    csv_path = tmp_path / "trace.csv"
    csv_path.write_text("Start (ns),Duration (ns),Name\n" + "".join(",".join(r) + "\n" for r in rows))
    assert trace.parse(types.SimpleNamespace(out=str(tmp_path), parse=str(csv_path))) == 0
    got = json.loads((tmp_path / "graph_trace.json").read_text())["result"]
    on, off = got["fold_norm on"], got["fold_norm off"]
    assert on["ops"]["b"] == {"launches": 2, "kernel_us": 12.0, "gap_us": 4.0}  # median decision: d = 1
    assert on["ops"]["a"]["gap_us"] == 0.0 and off["ops"]["p"] == {"launches": 1, "kernel_us": 3.0, "gap_us": 2.0}
    assert on["span_us"] == 11.0 + 5.0 + 7.0 + 2 * 2.0 and off["launches"] == 4
    out = capsys.readouterr().out
    assert "fold_norm on: span 27.0 us = kernels 23.0 + gaps 4.0 (3 launches)" in out


def test_the_fold_consumer_variants_give_the_main_launch_sums_of_squares(wgr_parts):
    """wgr_parts_cuda's `scaled` variants: the main launch gets a (M, K / 64) buffer of positive sums at `ss_in` and
    an eps, every other argument as the engine made it; `scaled-raw` also makes the prep's f16 rows 3-30x larger, row
    by row; `full` is left alone. Only KS 1 configs offer them (the consumer sums in its own launch)."""
    import types

    import numpy as np

    import tilewise.kernels.matmul.cuda as mc
    from tilewise.devices.base import Launch

    m, n, k = 6, 64, 256
    prep_prog, main_prog = types.SimpleNamespace(meta={}), types.SimpleNamespace(meta={})
    rows = np.random.default_rng(0).standard_normal((m, k)).astype(np.float16)
    store = {"xh": rows.copy()}

    class Dev:
        def run(self, launches):
            assert all(ln.program is prep_prog for ln in launches)

        def synchronize(self):
            pass

        def download(self, buf, dtype, shape):
            return store[buf].astype(dtype).reshape(shape)

        def write(self, buf, arr):
            store[buf] = arr

        def upload(self, arr):
            store["ss"] = arr
            return "ss"

    class Eng:
        def launches(self, item):
            return [Launch(prep_prog, (1, 1, 1), ["x", 0, "g", 1e-5, "xh", k]),
                    Launch(main_prog, (1, 1, 1), [f"arg{i}" for i in range(17)])]

        def program(self, item):
            return main_prog

    tpl = mc.CudaMatmul("wgr", "nf4", "swiglu", True)
    full = wgr_parts.main_launches(Eng(), Dev(), tpl, None, (m, n, k), "full")
    assert full[0].buffers == [f"arg{i}" for i in range(17)]
    (main,) = wgr_parts.main_launches(Eng(), Dev(), tpl, None, (m, n, k), "scaled")
    at = mc.WGR_ARGS
    assert main.buffers[at["ss_in"]] == "ss" and main.buffers[at["eps"]] == np.float32(1e-5)
    assert [b for i, b in enumerate(main.buffers) if i not in (at["ss_in"], at["eps"])] == \
        [f"arg{i}" for i in range(17) if i not in (at["ss_in"], at["eps"])]
    assert store["ss"].shape == (m, k // 64) and (store["ss"] > 0).all() and np.array_equal(store["xh"], rows)
    wgr_parts.main_launches(Eng(), Dev(), tpl, None, (m, n, k), "scaled-raw")
    ratio = store["xh"].astype(np.float32) / rows.astype(np.float32)
    per_row = np.nanmedian(ratio, axis=1)
    assert ((per_row > 3.0) & (per_row < 32.0)).all() and len(np.unique(per_row.round(2))) == m
    assert set(wgr_parts.SCALED) <= set(wgr_parts.variants("swiglu", True, 1e-5, wgr_parts.PICK))
    assert not set(wgr_parts.SCALED) & set(wgr_parts.variants("residual", False, 1e-5, {**wgr_parts.PICK, "KS": 4}))


@pytest.fixture(scope="module")
def timeline(wgr_parts):
    return load("wgr_timeline_cuda")


def test_the_timeline_edits_find_their_text_once_and_stamp_every_point(timeline, wgr_parts):
    real = wgr_parts.edited_source("")
    for old, _ in wgr_parts.EDITS["timeline"]:
        assert real.count(old) == 1, old
    src = wgr_parts.edited_source("timeline")
    for point in range(7):
        assert src.count(f"TL({point});") == 1, point
    assert src.count("TL(7);") == 2  # the cluster's return and the other kinds' end
    assert src.count("TLC(17);") == src.count("TLC(18);") == 1  # SR 2: the peers' sums landed, its own summed
    assert src.index("mbar_wait(recv_bar, 0);\n  TLC(17);") < src.index("TLC(18);") < src.index("wgr_own_epilogue<EPI")


def _stamps(rng, blocks, start_ns, mhz=2000.0, cluster=False):
    """(blocks, STRIDE) stamps whose cycle counter runs at `mhz` and whose phases are random; the phases in us.
    cluster: the epilogue (point 6 to 7) also split at two random times into words 17 and 18, as SR 2 stamps it;
    otherwise those words keep the buffer's fill."""
    import numpy as np

    steps_us = rng.uniform(0.1, 5.0, (blocks, 7))
    t_us = np.concatenate([np.zeros((blocks, 1)), np.cumsum(steps_us, axis=1)], axis=1)
    st = np.full((blocks, 20), np.iinfo(np.uint64).max, np.uint64)
    st[:, 0:16:2] = (start_ns + rng.integers(0, 300, (blocks, 1)) + t_us * 1e3).astype(np.uint64)
    st[:, 1:16:2] = (10**9 + t_us * mhz).astype(np.uint64)
    st[:, 16] = np.arange(blocks) % 7
    if cluster:
        cuts = np.sort(rng.uniform(0.0, 1.0, (blocks, 2)), axis=1) * steps_us[:, 6:7]
        st[:, 17:19] = (10**9 + (t_us[:, 6:7] + cuts) * mhz).astype(np.uint64)
        steps_us = np.concatenate([steps_us, cuts[:, :1], cuts[:, 1:] - cuts[:, :1]], axis=1)
    return st, steps_us


def test_the_timeline_phases_are_the_cycle_differences_at_the_timers_rate(timeline):
    import numpy as np

    rng = np.random.default_rng(5)
    runs, steps = zip(*(_stamps(rng, 64, 10**6 * (i + 1)) for i in range(3)))
    got = timeline.phases(list(runs))
    assert abs(got["mhz"] - 2000.0) < 5.0
    every = np.concatenate(steps)
    for i, name in enumerate(got["phases"]):
        assert got["phases"][name][0] == pytest.approx(float(np.median(every[:, i])), rel=0.01), name
    assert got["blocks_per_sm"] == {"max": 10, "sms_used": 7}
    assert 0.0 <= got["start_skew_us"][0] <= got["start_skew_us"][2] <= 0.3
    assert "ring-free->synced" not in got["phases"]
    runs, steps = zip(*(_stamps(rng, 64, 10**6 * (i + 1), cluster=True) for i in range(3)))
    got = timeline.phases(list(runs))
    every = np.concatenate(steps)
    for i, name in ((7, "ring-free->synced"), (8, "synced->reduced")):
        assert got["phases"][name][0] == pytest.approx(float(np.median(every[:, i])), rel=0.02), name


def test_the_decision_timeline_sums_each_ops_launches_and_the_gaps_between_them(timeline):
    import numpy as np

    dt = load("decision_timeline_cuda")
    rng = np.random.default_rng(9)
    stamps = {}
    rows = []
    for i, (label, start) in enumerate([("a", 0), ("b", 40_000), ("a", 90_000)]):
        st, _ = _stamps(rng, 16, 10**7 + start, cluster=label == "b")
        stamps[i] = st
        rows.append({"label": label, "buffer": i, "blocks": 16})

    class Dev:
        def download(self, buf, dtype, shape):
            return stamps[buf].astype(dtype).reshape(shape)

    one = dt.decision(Dev(), rows)
    ends = [int(stamps[i][:, 14].max()) for i in range(3)]
    starts = [int(stamps[i][:, 0].min()) for i in range(3)]
    assert [ln["gap_after_us"] for ln in one["launches"]] == pytest.approx(
        [(starts[1] - ends[0]) / 1e3, (starts[2] - ends[1]) / 1e3, 0.0])
    assert one["span_us"] == pytest.approx((ends[2] - starts[0]) / 1e3)
    res = dt.summarize([one, one])
    assert res["ops"]["a"]["n"] == 2 and res["ops"]["b"]["n"] == 1
    loop_a = one["launches"][0]["loop"] + one["launches"][2]["loop"]
    assert res["ops"]["a"]["loop"] == pytest.approx(loop_a)
    assert res["ops"]["a"]["span"] == pytest.approx((ends[0] - starts[0] + ends[2] - starts[2]) / 1e3)
    assert res["ops"]["a"]["synced"] == 0.0 and res["ops"]["b"]["synced"] > 0.0  # only the cluster launch splits
    b = stamps[1].astype(np.int64)
    assert res["ops"]["b"]["reduced"] == pytest.approx(float(np.median(b[:, 18] - b[:, 17])) / one["mhz"], rel=1e-6)


def test_the_table_twins_undo_only_their_own_choices_and_keep_the_table(rng):
    """experiments/rows_columns_cuda.py: the cw1 twin sets CW 1 in every short-row range and nothing else (so it
    computes the same bits); the attention twin gives every query count the decision length's tile; neither
    touches the table it copies, and a twin of a twin changes nothing more."""
    from tilewise.tune.dispatch import DispatchTable

    twins = load("rows_columns_cuda")
    cw = [int(c) for c in rng.choice([2, 4], 2)]
    rows = [{"m_min": 1, "m_max": 1, "kernel": "nf4_matmul.rows.swiglu.norm",
             "config": {"NT": 128, "RM": 1, "WK": 1, "CW": cw[0]}},
            {"m_min": 2, "m_max": 3, "kernel": "nf4_matmul.rows.swiglu.norm",
             "config": {"NT": 128, "RM": 4, "WK": 2, "CW": cw[1]}},
            {"m_min": 4, "m_max": None, "kernel": "nf4_matmul.wgr.swiglu.norm",
             "config": {"BF": 128, "BT": 120, "ST": 4, "KS": 1, "MB": 1, "DEC": 3, "SR": 0}}]
    qt = int(rng.choice([1, 16, 32]))
    attn = [{"m_min": 1, "m_max": 3, "kernel": "attention", "config": {"QT": qt, "NW": 8, "TC": 0, "KW": 1, "PF": 0}},
            {"m_min": 4, "m_max": None, "kernel": "attention",
             "config": {"QT": 64, "NW": 8, "TC": 1, "KW": 2, "PF": 1}}]
    doc = {"format": "tilewise-dispatch", "schema": 2, "device": "fake", "kernel_versions": {},
           "entries": {"nf4_matmul.swiglu.norm:4608x1024": {"family": "matmul", "fixed": {"N": 4608, "K": 1024},
                                                            "ranges": rows},
                       "attention:16x8x64": {"family": "attention", "fixed": {}, "ranges": attn}}}
    table = DispatchTable.from_json(doc)
    before = table.to_json()
    mm, akey = "nf4_matmul.swiglu.norm:4608x1024", "attention:16x8x64"
    one, changed = twins.one_column(table)
    assert len(changed) == 2 and table.to_json() == before
    for m in (1, 3):
        kernel, cfg = one.pick(mm, m)
        assert kernel == table.pick(mm, m)[0] and cfg["CW"] == 1 and {k: v for k, v in cfg.items() if k != "CW"} == {
            k: v for k, v in table.pick(mm, m)[1].items() if k != "CW"}
    assert one.pick(mm, 346) == table.pick(mm, 346) and one.pick(akey, 3) == table.pick(akey, 3)
    whole, changed = twins.whole_attention(table)
    assert len(changed) == 1 and table.to_json() == before
    assert whole.pick(akey, 1) == whole.pick(akey, 3) == table.pick(akey, 346) != table.pick(akey, 3)
    assert whole.pick(mm, 1) == table.pick(mm, 1)
    assert twins.one_column(one)[1] == [] and twins.whole_attention(whole)[1] == []


def test_a_table_raced_against_another_lists_every_range_and_setting_that_differs_and_only_those(rng):
    """experiments/rows_columns_cuda.py --against: the lines name exactly the entries whose ranges differ (a config,
    a row bound, an entry only one table has) and the models whose settings differ; a table against itself: none."""
    from tilewise.tune.dispatch import DispatchTable

    twins = load("rows_columns_cuda")
    bf = int(rng.choice([64, 128]))

    def doc(bt: int, m_max: int, settings: dict, extra: bool) -> DispatchTable:
        wgr = {"BF": bf, "BT": bt, "ST": 4, "KS": 1, "MB": 1, "DEC": 1, "SR": 0}
        entries = {"nf4_matmul.none.norm:3072x1024": {"family": "matmul", "fixed": {"N": 3072, "K": 1024}, "ranges": [
            {"m_min": 1, "m_max": m_max, "kernel": "nf4_matmul.rows.none.norm",
             "config": {"NT": 64, "RM": 1, "WK": 1, "CW": 4}},
            {"m_min": m_max + 1, "m_max": None, "kernel": "nf4_matmul.wgr.none.norm", "config": wgr}]},
            "shortconv:1024x3": {"family": "shortconv", "fixed": {}, "ranges": [
                {"m_min": 1, "m_max": None, "kernel": "shortconv", "config": {"NT": 128, "RT": 2}}]}}
        if extra:
            entries["attention:16x8x64"] = {"family": "attention", "fixed": {}, "ranges": [
                {"m_min": 1, "m_max": None, "kernel": "attention",
                 "config": {"QT": 64, "NW": 8, "TC": 1, "KW": 2, "PF": 1}}]}
        return DispatchTable.from_json({"format": "tilewise-dispatch", "schema": 2, "device": "fake",
                                        "kernel_versions": {}, "entries": entries,
                                        "settings": {"lfm2:x": {"values": settings, "versions": {}}}})

    base = doc(176, 3, {"pdl": False}, False)
    assert twins.range_changes(base, doc(176, 3, {"pdl": False}, False)) == []
    got = twins.range_changes(base, doc(120, 3, {"pdl": False}, False))
    assert len(got) == 1 and got[0].startswith("nf4_matmul.none.norm:3072x1024") and '"BT": 120' in got[0]
    got = twins.range_changes(base, doc(176, 7, {"pdl": True}, True))
    assert [g.split(":")[0] for g in got] == ["attention", "nf4_matmul.none.norm", "settings of lfm2"]
