"""experiments/decision_host_cuda.py without a GPU: a recording CUDA device whose captured graph writes a result row
that depends on the staged token ids, and CUDA events on the host clock. The experiment reaches into the executor
(its staging arrays, its plan's graph, the device's stream); this runs it end to end so a renamed attribute fails here
and not on a GPU machine, and checks what it reports: every mode timed, one GPU span per timed replay, the parts
adding up, and each replay's result row that of its own prompt."""

from __future__ import annotations

import json
import time
import types

import numpy as np
import pytest
from tests.scripts import load_script
from tests.unit.test_model_cuda_plan import RecordingDevice

from tilewise.model.checkpoint import Checkpoint, random_tensors
from tilewise.model.config import PRESETS
from tilewise.model.cuda import CUDAExecutor
from tilewise.model.runtime import HEAD, Model

experiment = load_script("experiments/decision_host_cuda.py")


class Event:
    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass


class Graph:
    """Reads the staged ids when replayed, as a captured host-to-device copy does, and writes a row made from them."""

    def __init__(self, ids_host: np.ndarray, res_host: np.ndarray, n_res: int) -> None:
        self.ids_host, self.res_host, self.n_res = ids_host, res_host, n_res

    def launch(self, wait: bool = True) -> None:
        seed = int(self.ids_host.astype(np.int64).sum())
        self.res_host[:self.n_res] = np.random.default_rng(seed).standard_normal(self.n_res)


class Context:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class GraphDevice(RecordingDevice):
    _cp = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event,
                                                           get_elapsed_time=lambda a, b: 1e3 * (b.t - a.t)))
    _stream = None

    def __init__(self) -> None:
        super().__init__()
        self._dev = Context()  # the experiment enters the CuPy device around the events
        self.captures = 0

    def capture(self, steps, pdl=False):
        self.captures += 1
        return Graph(steps[0].host, steps[-1].host, steps[-1].nbytes // 4)

    def pinned(self, shape, dtype=np.float32):
        return np.zeros(shape, dtype)


@pytest.fixture
def fake_cuda(monkeypatch):
    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    dev = GraphDevice()

    def from_checkpoint(checkpoint, device=None, quiet=True):
        return Model(checkpoint, CUDAExecutor(checkpoint, device=dev, quiet=True),
                     checkpoint.float32(HEAD).astype(np.float32), None)

    monkeypatch.setattr(experiment, "from_checkpoint", from_checkpoint)
    monkeypatch.setattr(experiment, "open_checkpoint", lambda preset, weights: ck)
    return dev


def test_the_host_share_experiment_reports_every_part(fake_cuda, tmp_path, monkeypatch, capsys):
    rounds, per_round = 3, 4
    monkeypatch.setattr("sys.argv", ["decision_host_cuda.py", "--preset", "tiny", "--seq", "90", "--rounds",
                                     str(rounds), "--per-round", str(per_round), "--out", str(tmp_path)])
    assert experiment.main() == 0
    assert fake_cuda.captures == 1  # one plan for every prompt of the length, captured once
    doc = json.loads((tmp_path / "decision_host_cuda.json").read_text())
    for mode in experiment.MODES:
        assert len(doc[mode]["samples_ms"]) == rounds * per_round
    assert len(doc["spans_ms"]) == rounds * per_round  # the timed replays only, not the warm-up's
    assert doc["replays_differing"] == 0
    p50 = {m: float(np.median(doc[m]["samples_ms"])) for m in experiment.MODES}
    span = float(np.median(doc["spans_ms"]))
    parts = doc["parts"]
    assert parts["gpu_span_ms"] == pytest.approx(span)
    assert parts["host_share_us"] == pytest.approx(1e3 * (p50["whole"] - span))
    assert parts["model_host_us"] + parts["executor_host_us"] + parts["launch_and_wait_us"] == pytest.approx(
        parts["host_share_us"])
    assert "replays whose result row differs from the first decision's: 0" in capsys.readouterr().out


def test_a_replay_of_the_wrong_prompt_is_counted(fake_cuda, tmp_path, monkeypatch):
    """The scores check compares each replay with its own prompt's first decision: replays that stage the ids of
    another prompt are counted and the experiment fails."""
    real = experiment.prompts

    def shifted(vocab, seq, count, prefix, seed):
        shared, full = real(vocab, seq, count, prefix, seed=seed)

        class Prompts(list):
            """Iterated (the reference decisions), the real prompts; indexed (the timed modes), the next one."""

            def __getitem__(self, i):
                return list.__getitem__(self, (i + 1) % len(self))

        return shared, Prompts(full)

    monkeypatch.setattr(experiment, "prompts", shifted)
    monkeypatch.setattr("sys.argv", ["decision_host_cuda.py", "--preset", "tiny", "--seq", "90", "--rounds", "2",
                                     "--per-round", "2", "--out", str(tmp_path)])
    assert experiment.main() == 1
    assert json.loads((tmp_path / "decision_host_cuda.json").read_text())["replays_differing"] > 0
