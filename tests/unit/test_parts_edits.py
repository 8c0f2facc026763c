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
