"""The parts experiments take one part out of a kernel by editing its source text: each edit must find its text
exactly once in the current source (a kernel change that duplicates or drops it would silently time the wrong
kernel), and the edited source must differ from the real one."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


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

    pdl = load("pdl_trigger_cuda")
    real = cudasrc.model_source("matmul", "matmul_mma.cu")
    assert real.count(pdl.TRIGGER) == 1 and pdl.EARLY not in real
    edited = pdl.early_trigger(cudasrc.model_source)("matmul", "matmul_mma.cu")
    assert edited == real.replace(pdl.TRIGGER, pdl.EARLY)


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
