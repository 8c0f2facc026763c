"""The CUDA executor's graph replay without a GPU: a recording device with the CUDA device's graph API (`pinned`,
`capture`, a graph whose `launch` reads the pinned host arrays at replay time) checks that a plan is captured once
and replayed by later decisions of its shape, that every replay moves that decision's ids, that timed and
switched-off decisions run launch by launch, that a replaced plan's graph goes with it, the env switch, and that a
graph is captured with the executor's PDL setting (and again when it changes)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from tests.unit.test_model_cuda_plan import RecordingDevice

from tilewise.devices.base import Buffer, Launch, Program
from tilewise.devices.cuda import CUDADevice, HostCopy
from tilewise.devices.cuda_pdl import PDL_ENV, pdl_from_env
from tilewise.errors import ConfigError, LaunchError
from tilewise.model.checkpoint import Checkpoint, random_tensors
from tilewise.model.config import PRESETS
from tilewise.model.cuda import GRAPHS_ENV, CUDAExecutor, graphs_from_env


class FakeGraph:
    """Replays like a CUDA graph: reads the ids staging array when launched, fills the result array from them."""

    def __init__(self, dev: GraphDevice, steps: list) -> None:
        self.dev, self.steps = dev, steps

    def launch(self, wait: bool = True) -> None:
        first, last = self.steps[0], self.steps[-1]
        if isinstance(first, HostCopy):
            ids, out = first.host[: first.nbytes // 4].copy(), last.host[: last.nbytes // 4]
        else:  # zero_copy: the first kernel reads the pinned ids array and the last writes the pinned row
            ids = self.dev.mapped_in(first)[: self.dev.tokens].copy()
            out = self.dev.mapped_in(last)
        self.dev.replayed.append(ids)
        out[:] = np.arange(out.size, dtype=np.float32) + float(ids.sum()) + 1000.0 * ids.size


class GraphDevice(RecordingDevice):
    def __init__(self) -> None:
        super().__init__()
        self.graphs: list[FakeGraph] = []
        self.replayed: list[np.ndarray] = []
        self.runs: list[int] = []
        self.pdl_flags: list[tuple[str, bool]] = []  # ("capture" | "run", pdl) per call
        self.timed: list[int] = []
        self.writes: list[tuple[int, np.ndarray]] = []
        self.mapped_buffers: list[Buffer] = []
        self.tokens = 0  # the decision's token count, which a zero-copy replay reads from the ids array
        self.syncs = 0

    def pinned(self, size, dtype=np.float32) -> np.ndarray:
        return np.full(size, -7, dtype)

    def capture(self, steps, pdl=False) -> FakeGraph:
        self.pdl_flags.append(("capture", pdl))
        graph = FakeGraph(self, list(steps))
        self.graphs.append(graph)
        return graph

    def write(self, buffer, array, offset_bytes=0) -> None:
        super().write(buffer, array, offset_bytes)
        self.writes.append((id(buffer), np.array(array)))

    def run(self, launches, pdl=False) -> None:
        self.pdl_flags.append(("run", pdl))
        self.runs.append(len(launches))
        if self.mapped_buffers and any(b in self.mapped_buffers for b in launches[-1].buffers):
            self.mapped_in(launches[-1])[:] = -3.0  # the head, writing the pinned row itself

    def mapped(self, host: np.ndarray) -> Buffer:
        buf = Buffer(self, host, host.nbytes)
        self.mapped_buffers.append(buf)
        return buf

    def mapped_in(self, launch) -> np.ndarray:
        """The pinned array behind the mapped buffer `launch` binds."""
        (buf,) = [b for b in launch.buffers if any(b is m for m in self.mapped_buffers)]
        return buf.handle

    def synchronize(self) -> None:
        self.syncs += 1

    def time(self, launches, flush_l2=None) -> np.ndarray:
        self.timed.append(len(launches))
        return np.ones(len(launches))


@pytest.fixture
def executor():
    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    return CUDAExecutor(ck, device=GraphDevice(), graphs=True)


def expected_result(ex: CUDAExecutor, ids: np.ndarray) -> np.ndarray:
    n_res = ex.cfg.hidden_size + ex.cfg.num_labels
    return np.arange(n_res, dtype=np.float32) + float(ids.sum()) + 1000.0 * ids.size


def test_a_plan_is_captured_once_and_every_replay_moves_its_own_ids(executor, rng):
    dev, H = executor.dev, executor.cfg.hidden_size
    prompts = [rng.integers(1, 512, 12) for _ in range(4)]
    for ids in prompts:
        hidden, new = executor.forward(ids, 0, None, True)
        np.testing.assert_array_equal(hidden, expected_result(executor, ids)[:H])
        np.testing.assert_array_equal(new.scores, expected_result(executor, ids)[H:])
        del new  # its caches go back to the pool, so the next decision has the same plan key
    assert len(dev.graphs) == executor.graph_captures == 1
    assert executor.graph_replays == 4
    assert [r.tolist() for r in dev.replayed] == [p.tolist() for p in prompts]
    assert dev.runs == [] and dev.timed == []


def test_prefix_and_extend_branches_get_their_own_graphs_and_reuse_them(executor, rng):
    dev = executor.dev
    _, base = executor.forward(rng.integers(1, 512, 20), 0, None, True)
    tails = [rng.integers(1, 512, 5) for _ in range(3)]
    for tail in tails:
        _, new = executor.forward(tail, 20, base, True)
        del new
    assert executor.graph_captures == 2  # the prefill and the extend of 5 after 20
    assert [r.tolist() for r in dev.replayed[1:]] == [t.tolist() for t in tails]
    executor.forward(rng.integers(1, 512, 6), 20, base, True)
    assert executor.graph_captures == 3


def test_the_graph_is_the_ids_copy_the_plans_launches_and_the_result_copy(executor, rng):
    ids = rng.integers(1, 512, 9)
    executor.forward(ids, 0, None, True)
    plan, _ = executor.plan(ids, 0, None, True)
    steps = executor.dev.graphs[-1].steps
    assert plan.graph is executor.dev.graphs[-1]
    first, last = steps[0], steps[-1]
    assert isinstance(first, HostCopy) and first.to_device and first.buffer is executor.act["ids"]
    assert first.nbytes == 4 * ids.size
    assert isinstance(last, HostCopy) and not last.to_device and last.buffer is executor.act["res"]
    assert last.nbytes == 4 * (executor.cfg.hidden_size + executor.cfg.num_labels)
    assert len(steps) == len(plan.launches) + 2 and all(a is b for a, b in zip(steps[1:-1], plan.launches))


def test_timed_and_switched_off_decisions_run_launch_by_launch(executor, rng):
    dev = executor.dev
    ids = rng.integers(1, 512, 15)
    executor.forward(ids, 0, None, True, timed=True)
    assert executor.graph_captures == 0 and len(dev.timed) == 1
    assert [label for label, _ in executor.last_op_times] == executor.plan(ids, 0, None, True)[0].labels
    executor.graphs = False
    other = rng.integers(1, 512, 15)
    executor.forward(other, 0, None, True)
    assert executor.graph_captures == 0 and executor.graph_replays == 0 and len(dev.runs) == 1
    ids_writes = [a for buf, a in dev.writes if buf == id(executor.act["ids"])]
    assert [w.tolist() for w in ids_writes] == [ids.tolist(), other.tolist()]
    executor.graphs = True
    executor.forward(other, 0, None, True)
    assert executor.graph_captures == 1 and dev.replayed[-1].tolist() == other.tolist()


def test_a_replaced_plans_graph_is_dropped_with_it(executor, rng):
    executor.forward(rng.integers(1, 512, 10), 0, None, True)
    graph = weakref.ref(executor.dev.graphs.pop())
    assert graph() is not None
    executor.forward(rng.integers(1, 512, 300), 0, None, True)  # more rows than the buffers hold: plans rebuilt
    gc.collect()
    assert graph() is None


def test_a_collected_states_caches_go_back_to_the_pool_and_a_live_ones_do_not(executor, rng):
    """The pool (`gpu_state.take_caches`): buffers of caches nobody holds are handed out again, those of caches still
    held never are, and caches made before the device was rebuilt are not returned to the new pool."""
    _, first = executor.forward(rng.integers(1, 512, 8), 0, None, True)
    kv, conv = first.kv, first.conv
    _, second = executor.forward(rng.integers(1, 512, 8), 0, None, True)  # first is alive: other buffers
    assert second.kv is not kv and all(a is not b for a, b in zip(second.conv.values(), conv.values()))
    del first
    _, third = executor.forward(rng.integers(1, 512, 8), 0, None, True)
    assert third.kv is kv and third.conv is conv
    (old_free,) = executor._pool.values()
    executor.generation += 1  # as a rebuild after a device loss does; its pool is new
    executor._pool = {}
    del second, third
    assert executor._pool == {} and old_free == []


def test_zero_copy_graphs_are_kernels_alone_on_the_pinned_arrays(executor, rng):
    """`zero_copy`: the embedding binds the pinned ids array and the head the pinned result row, so the captured graph
    is the plan's launches and nothing else; each replay reads its own decision's ids and hands out the row the head
    wrote. Switching it off gives another plan whose graph copies in and out again."""
    dev, H, n = executor.dev, executor.cfg.hidden_size, 14
    executor.zero_copy, dev.tokens = True, n
    prompts = [rng.integers(1, 512, n) for _ in range(3)]
    for ids in prompts:
        hidden, new = executor.forward(ids, 0, None, True)
        seen = dev.replayed[-1]
        assert seen.tolist() == ids.tolist()
        want = np.arange(H + executor.cfg.num_labels, dtype=np.float32) + float(seen.sum()) + 1000.0 * seen.size
        np.testing.assert_array_equal(hidden, want[:H])
        np.testing.assert_array_equal(new.scores, want[H:])
        del new
    assert executor.graph_captures == 1
    plan, new = executor.plan(prompts[0], 0, None, True)
    del new
    assert plan.zero_copy and plan.graph.steps == plan.launches
    embed, head = plan.launches[0], plan.launches[-1]
    assert dev.mapped_in(embed) is executor._ids_host and dev.mapped_in(head) is executor._res_host
    a = executor.act
    assert not any(b is a["ids"] or b is a["res"] for launch in plan.launches for b in launch.buffers)
    executor.zero_copy = False
    executor.forward(prompts[0], 0, None, True)
    assert executor.graph_captures == 2 and isinstance(dev.graphs[-1].steps[0], HostCopy)


def test_zero_copy_launch_by_launch_waits_for_the_stream_and_reads_the_pinned_row(executor, rng):
    dev = executor.dev
    executor.zero_copy, executor.graphs = True, False
    hidden, new = executor.forward(rng.integers(1, 512, 11), 0, None, True)
    assert dev.runs and dev.syncs == 1
    assert (hidden == -3.0).all() and (new.scores == -3.0).all()  # what the head wrote into the pinned row
    assert not [w for buf, w in dev.writes if buf == id(executor.act["ids"])]  # no copy of the ids in


def test_zero_copy_falls_back_to_copies_where_the_device_maps_no_host_array(executor, rng):
    executor.forward(rng.integers(1, 512, 9), 0, None, True)  # the row buffers made (and `_mapped` with them)
    executor._mapped, executor.zero_copy = None, True  # as on a device without `mapped`
    executor.forward(rng.integers(1, 512, 9), 0, None, True)
    plan, new = executor.plan(rng.integers(1, 512, 9), 0, None, True)
    del new
    assert not plan.zero_copy and isinstance(plan.graph.steps[0], HostCopy)


def test_a_device_that_refuses_to_map_leaves_decisions_copying(rng):
    class Unmapped(GraphDevice):
        def mapped(self, host):
            raise LaunchError("a host array is not page-locked memory this GPU addresses", "allocate it with pinned()")

    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny").converted("nf4").materialize()
    ex = CUDAExecutor(ck, device=Unmapped(), graphs=True)
    ex.zero_copy = True
    ids = rng.integers(1, 512, 10)
    hidden, _ = ex.forward(ids, 0, None, True)
    assert ex._mapped is None and isinstance(ex.dev.graphs[-1].steps[0], HostCopy)
    np.testing.assert_array_equal(hidden, expected_result(ex, ids)[:cfg.hidden_size])


def test_a_plan_with_a_library_call_runs_launch_by_launch(executor, rng):
    ids = rng.integers(1, 512, 7)
    plan, new = executor.plan(ids, 0, None, True)
    del new  # back to the pool: the decision below has this plan's key
    plan.launches.append(Launch(Program("cublas_sgemm", None, "cublas", meta={"callable": True}), (1, 1, 1), []))
    plan.labels.append("peer")
    executor.forward(ids, 0, None, True)
    assert plan.graph is False and executor.graph_captures == 0 and len(executor.dev.runs) == 1


def test_the_cuda_device_refuses_to_capture_a_library_call():
    dev = object.__new__(CUDADevice)  # the refusal comes before any CUDA call
    call = Launch(Program("cublas_sgemm", None, "cublas", meta={"callable": True}), (1, 1, 1), [])
    with pytest.raises(LaunchError, match="cublas_sgemm is a library call, which is not captured") as err:
        dev.capture([call])
    assert GRAPHS_ENV in err.value.fix


SWITCHES = [(GRAPHS_ENV, "graphs", True), (PDL_ENV, "pdl", False)]  # (variable, executor attribute, default)


@pytest.mark.parametrize(("env", "attr", "default"), SWITCHES)
@pytest.mark.parametrize(("value", "on"), [(None, None), ("", None), ("1", True), ("on", True), ("0", False),
                                           ("off", False), (" False ", False)])
def test_the_env_switches_turn_graphs_and_pdl_on_and_off(monkeypatch, env, attr, default, value, on):
    want = default if on is None else on
    assert (graphs_from_env if attr == "graphs" else pdl_from_env)({} if value is None else {env: value}) is want
    if value is None:
        monkeypatch.delenv(env, raising=False)
    else:
        monkeypatch.setenv(env, value)
    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny")
    assert getattr(CUDAExecutor(ck, device=GraphDevice()), attr) is want


@pytest.mark.parametrize(("env", "attr", "default"), SWITCHES)
def test_a_bad_env_value_is_one_clear_error(monkeypatch, env, attr, default):
    monkeypatch.setenv(env, "maybe")
    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 3), "f32", "preset:tiny")
    with pytest.raises(ConfigError, match=rf"{env}='maybe' is neither 0 nor 1") as err:
        CUDAExecutor(ck, device=GraphDevice())
    assert f"{env}=0" in err.value.fix


def test_graphs_are_captured_with_the_pdl_setting_and_again_after_a_switch(executor, rng):
    dev = executor.dev
    assert executor.pdl is False  # the default
    executor.pdl = True
    prompts = [rng.integers(1, 512, 11) for _ in range(6)]
    for ids in prompts[:2]:
        executor.forward(ids, 0, None, True)
    executor.pdl = False
    for ids in prompts[2:4]:
        executor.forward(ids, 0, None, True)
    executor.pdl = True
    executor.forward(prompts[4], 0, None, True)
    assert dev.pdl_flags == [("capture", True), ("capture", False), ("capture", True)]
    assert executor.graph_captures == 3 and executor.graph_replays == 5
    assert [r.tolist() for r in dev.replayed] == [p.tolist() for p in prompts[:5]]
    executor.forward(prompts[5], 0, None, True, timed=True)  # each launch alone between events
    executor.graphs = False
    executor.forward(prompts[5], 0, None, True)
    executor.pdl = False
    executor.forward(prompts[5], 0, None, True)
    assert dev.pdl_flags[3:] == [("run", True), ("run", False)] and len(dev.timed) == 1


def test_a_driver_that_refuses_pdl_in_a_capture_falls_back_with_a_warning(executor, rng):
    dev = executor.dev
    real = dev.capture

    def capture(steps, pdl=False):
        if pdl:
            dev.pdl_flags.append(("capture", pdl))
            raise LaunchError("cuLaunchKernelEx with programmatic dependent launch failed: CUDA_ERROR_NOT_SUPPORTED",
                              "set TILEWISE_CUDA_PDL=0")
        return real(steps, pdl)

    dev.capture = capture
    executor.pdl = True
    ids = rng.integers(1, 512, 13)
    with pytest.warns(UserWarning, match="launches without programmatic dependent launch from now on"):
        hidden, _ = executor.forward(ids, 0, None, True)
    np.testing.assert_array_equal(hidden, expected_result(executor, ids)[:executor.cfg.hidden_size])
    assert executor.pdl is False and dev.pdl_flags == [("capture", True), ("capture", False)]
