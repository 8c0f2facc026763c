"""bench/tune_ray.py's split runs: a `--local-from` half is refused by name when it was another run's, and gives
back exactly the configs the local run measured, in order."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from tests.scripts import load_script

from tilewise.kernels.registry import get_template

tune_ray = load_script("bench/tune_ray.py")


def _record(**over):
    rec = {"device": "webgpu:Vulkan:x:1:abc", "backend": "webgpu", "shape": [256, 256, 256], "space": "full",
           "legal_configs": 100, "budget": 8, "limit_s": None, "seed": 0}
    rec.update(over)
    return rec


def test_the_local_half_returns_the_measured_configs_in_order(tmp_path):
    space = get_template("gemm", "webgpu").space("full")
    configs = random.Random(4).sample(list(itertools.islice(iter(space), 2000)), 6)
    half = {**_record(), "date": "2026-12-03T16:00:00+00:00", "cupy_cache": "empty",
            "cut": {"configs": 6, "of": 100, "by": "budget"},
            "local": {"seconds": 12.5, "configs": [c.key() for c in configs]}}
    path = tmp_path / "half.json"
    path.write_text(json.dumps(half))
    rec = _record()
    got, cut = tune_ray.local_half(str(path), rec, space)
    assert got == configs and cut
    assert rec["local"]["seconds"] == 12.5 and rec["local_from"] == {"file": "half.json", "date": half["date"]}


@pytest.mark.parametrize(("key", "value"),
                         [("seed", 3), ("device", "webgpu:Vulkan:y:1:def"), ("shape", [512, 256, 256])])
def test_another_runs_half_is_refused_with_what_differs(tmp_path, key, value):
    path = tmp_path / "half.json"
    path.write_text(json.dumps({**_record(**{key: value}), "cut": None, "local": {"seconds": 1.0}}))
    with pytest.raises(SystemExit, match=f"differs in {key}"):
        tune_ray.local_half(str(path), _record(), get_template("gemm", "webgpu").space("full"))
