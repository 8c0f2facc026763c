"""CUDA graph replay on a GPU (skips cleanly without CuPy or a GPU): the device's capture reads pinned host memory at
replay time and leaves its stream usable after a refused launch; a replayed decision gives bit-identical scores and
hidden state to the same decision launch by launch, over prompts, prefixes and extend branches, and a plan's graph
is captured once and replayed after; with programmatic dependent launch (each kernel starting while the one before
it finishes) decisions stay bit-identical to serial launches."""

from __future__ import annotations

import numpy as np
import pytest

import tilewise
from tilewise.devices.base import Launch
from tilewise.errors import LaunchError

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def model(dev):
    return tilewise.load("tiny", device="cuda", weights="nf4", seed=11, quiet=True)


def test_a_graph_copies_what_the_pinned_array_holds_at_replay_time(dev, rng):
    from tilewise.devices.cuda import HostCopy
    from tilewise.kernels.rowops import cuda as rowops

    words = 1000
    src, dst = dev.allocate(4 * words), dev.allocate(4 * words)
    host_in, host_out = dev.pinned(words, np.float32), dev.pinned(words, np.float32)
    prog = rowops.copy_program(dev)
    before = dev.captures
    graph = dev.capture([HostCopy(host_in, src, 4 * words), rowops.copy_launch(prog, src, 0, dst, 0, words),
                         HostCopy(host_out, dst, 4 * words, to_device=False)])
    assert dev.captures == before + 1
    for _ in range(3):
        want = rng.standard_normal(words).astype(np.float32)
        host_in[:] = want
        graph.launch()
        np.testing.assert_array_equal(host_out, want)
        np.testing.assert_array_equal(dev.download(dst), want)
    assert graph.replays == 3


def test_a_launch_refused_during_capture_leaves_the_stream_usable(dev, rng):
    from tilewise.kernels.rowops import cuda as rowops

    prog = rowops.copy_program(dev)
    src, dst = dev.allocate(4 * 64), dev.allocate(4 * 64)
    bad = Launch(prog, (1, 70000, 1), [src, np.int32(0), dst, np.int32(0), np.int32(64)])
    with pytest.raises(LaunchError, match="exceeds CUDA's limits"):
        dev.capture([rowops.copy_launch(prog, src, 0, dst, 0, 64), bad])
    want = rng.standard_normal(64).astype(np.float32)
    dev.write(src, want)
    dev.run([rowops.copy_launch(prog, src, 0, dst, 0, 64)])
    np.testing.assert_array_equal(dev.download(dst), want)


def decide(model, ids, base=None):
    """(GPU head's 8 scores, hidden) of one decision; the state is dropped, so its caches go back to the pool."""
    state = model.prefill(ids) if base is None else model.extend(base, ids)
    return state.caches.scores.copy(), model.hidden(state)


def launch_by_launch(model, ids, base=None):
    ex = model.executor
    ex.graphs = False
    try:
        return decide(model, ids, base)
    finally:
        ex.graphs = True


def assert_same(got, want):
    np.testing.assert_array_equal(got[0], want[0])  # bit-identical: the same kernels on the same inputs
    np.testing.assert_array_equal(got[1], want[1])
    assert got[0].shape == (8,) and np.abs(got[0]).max() > 0


@pytest.mark.parametrize("n", [1, 31, 97])
def test_replayed_decisions_are_bit_identical_to_launch_by_launch(model, rng, n):
    ex = model.executor
    assert ex.graphs
    prompts = [rng.integers(0, model.config.vocab_size, n) for _ in range(4)]
    for p, last in zip(prompts, rng.permutation(model.config.vocab_size)):
        p[-1] = last  # no two prompts alike, so the replays' answers differ
    want = [launch_by_launch(model, p) for p in prompts]
    captures = ex.graph_captures
    replays = ex.graph_replays
    got = [decide(model, p) for p in prompts]
    for g, w in zip(got, want):
        assert_same(g, w)
    assert ex.graph_captures - captures <= 1  # captured on the first decision of this shape, replayed after
    assert ex.graph_replays - replays == len(prompts)
    assert not np.array_equal(got[0][0], got[1][0])  # each replay ran its own ids


def test_prefix_and_extend_branches_replay_bit_identically(model, rng):
    ex = model.executor
    vocab = model.config.vocab_size
    for split in (1, 32, 47):
        base = model.prefill(rng.integers(0, vocab, split))
        tails = [rng.integers(0, vocab, int(m)) for m in (5, 5, 5, 60, 60)]
        want = [launch_by_launch(model, t, base) for t in tails]
        captures = ex.graph_captures
        got = [decide(model, t, base) for t in tails]
        for g, w in zip(got, want):
            assert_same(g, w)
        assert ex.graph_captures - captures <= 2  # one plan per tail length
        again = [decide(model, t, base) for t in tails]
        assert ex.graph_captures - captures <= 2
        for g, w in zip(again, want):
            assert_same(g, w)


def test_a_plans_graph_is_captured_once(model, rng):
    ex = model.executor
    ids = rng.integers(0, model.config.vocab_size, 23)
    decide(model, ids)
    plan, new = ex.plan(ids, 0, None, model.final_row_slicing)
    del new
    graph = plan.graph
    device_captures = ex.dev.captures
    for _ in range(5):
        decide(model, rng.integers(0, model.config.vocab_size, 23))
    assert ex.dev.captures == device_captures
    assert plan.graph is graph and graph.replays >= 6


def test_timed_decisions_match_the_replay(model, rng):
    ex = model.executor
    ids = rng.integers(0, model.config.vocab_size, 40)
    replayed = decide(model, ids)
    hidden, caches = ex.forward(ids, 0, None, model.final_row_slicing, timed=True)
    assert [label for label, _ in ex.last_op_times]
    np.testing.assert_array_equal(caches.scores, replayed[0])
    np.testing.assert_array_equal(hidden, replayed[1])


@pytest.mark.parametrize("kind", ["default", "splitk", "wgr"])
def test_pdl_decisions_are_bit_identical_to_serial_launches(dev, rng, kind):
    """Every kernel waits for its predecessor before it touches what that one writes (kernels/pdl.cuh; wgr copies
    its first weight stages before the wait), so programmatic dependent launch changes no bit: graph replays and
    launch-by-launch runs with PDL equal serial launches, over prompt lengths, a prefix and its extend branches, on
    the default kernels, split-K (a reduction launch after each matmul) and wgr."""
    from tilewise.model.checkpoint import Checkpoint, random_tensors
    from tilewise.model.config import PRESETS
    from tilewise.model.cuda import CUDAExecutor

    if not dev.pdl:
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    cfg = PRESETS["tiny"]
    table = None
    if kind != "default":
        from tests.cuda.test_model_cuda_tune import kind_table

        table = kind_table(dev, cfg, kind)
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 5), "f32", "preset:tiny").converted("nf4").materialize()
    ex = CUDAExecutor(ck, device=dev, dispatch=table, quiet=True)

    def run(ids, start, base, pdl, graphs):
        ex.pdl, ex.graphs = pdl, graphs
        hidden, state = ex.forward(ids, start, base, True)
        return hidden, state.scores.copy(), state

    before = dev.pdl_launches
    for n in (9, 40, 121):
        ids = rng.integers(0, cfg.vocab_size, n)
        serial = run(ids, 0, None, False, False)
        for graphs in (True, True, False):  # the capture, a replay, then launch by launch
            got = run(ids, 0, None, True, graphs)
            np.testing.assert_array_equal(got[0], serial[0])
            np.testing.assert_array_equal(got[1], serial[1])
    base = run(rng.integers(0, cfg.vocab_size, 30), 0, None, True, True)[2]
    for _ in range(3):
        tail = rng.integers(0, cfg.vocab_size, 12)
        want = run(tail, 30, base, False, False)
        got = run(tail, 30, base, True, True)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    assert ex.pdl and dev.pdl_launches > before  # the launches above did use PDL (no fallback)


def _setting_keeps_bits(ex, rng, name, check=None):
    """Decisions with the executor's setting `name` on give the same bits as with it off, launch by launch and
    replayed, over prompt lengths (each then passed to `check`, where given) and an extend branch."""

    def run(ids, start, base, on, graphs):
        setattr(ex, name, on)
        ex.graphs = graphs
        hidden, state = ex.forward(ids, start, base, True)
        return hidden, state.scores.copy(), state

    vocab = ex.cfg.vocab_size
    for n in (9, 40, 121):
        ids = rng.integers(0, vocab, n)
        off = run(ids, 0, None, False, False)
        for graphs in (True, True, False):  # the capture, a replay, then launch by launch
            got = run(ids, 0, None, True, graphs)
            np.testing.assert_array_equal(got[0], off[0])
            np.testing.assert_array_equal(got[1], off[1])
        if check is not None:
            check(ids)
    base = run(rng.integers(0, vocab, 30), 0, None, True, True)[2]
    tail = rng.integers(0, vocab, 12)
    want, got = run(tail, 30, base, False, False), run(tail, 30, base, True, True)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_a_mapped_pinned_array_is_read_and_written_by_kernels_in_a_graph(dev, rng):
    """`CUDADevice.mapped`: a kernel copies from one pinned array to another through their mapped buffers, in a
    graph of that kernel alone, reading what the host holds at each replay; a pageable array is refused."""
    from tilewise.kernels.rowops import cuda as rowops

    words = 1000
    host_in, host_out = dev.pinned(words, np.float32), dev.pinned(words, np.float32)
    prog = rowops.copy_program(dev)
    graph = dev.capture([rowops.copy_launch(prog, dev.mapped(host_in), 0, dev.mapped(host_out), 0, words)])
    for _ in range(3):
        want = rng.standard_normal(words).astype(np.float32)
        host_in[:] = want
        graph.launch()
        np.testing.assert_array_equal(host_out, want)
    with pytest.raises(LaunchError, match="not page-locked memory"):
        dev.mapped(np.ones(words, np.float32))


def test_zero_copy_decisions_are_bit_identical_to_copies(dev, rng):
    """`zero_copy` moves the ids and the result row across the bus inside the embedding and the head instead of
    copy steps; the same kernels on the same values, so the same bits, launch by launch and replayed."""
    from tilewise.model.checkpoint import Checkpoint, random_tensors
    from tilewise.model.config import PRESETS
    from tilewise.model.cuda import CUDAExecutor

    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 9), "f32", "preset:tiny").converted("nf4").materialize()
    ex = CUDAExecutor(ck, device=dev, quiet=True)
    assert ex._mapped is not None

    def check(ids):
        ex.zero_copy = True
        assert ex.plan(ids, 0, None, True)[0].zero_copy

    _setting_keeps_bits(ex, rng, "zero_copy", check)


@pytest.mark.parametrize("kind", ["wg-split", "wgr"])
def test_fused_prologues_are_bit_identical_to_separate_launches(dev, rng, kind):
    """The executor joins a matmul's f16 prologue with the launch that wrote its rows: wg-split (ffn.down in two
    slices on wg) joins each down's reduction with the next layer's normed prologue (nf4_mm_reduce_prep); wgr has
    gate/up store f16 rows for ffn.down (out_h); in both the short conv and attention store f16 rows for their out
    projections. The same arithmetic, so decisions give the same bits as the launches apart, launch by launch and
    replayed, over prompt lengths and an extend branch."""
    from tests.cuda.test_model_cuda_tune import kind_table

    from tilewise.kernels.matmul.cuda import NULL
    from tilewise.model.checkpoint import Checkpoint, random_tensors
    from tilewise.model.config import PRESETS
    from tilewise.model.cuda import CUDAExecutor

    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 7), "f32", "preset:tiny").converted("nf4").materialize()
    ex = CUDAExecutor(ck, device=dev, dispatch=kind_table(dev, cfg, kind), quiet=True)

    def joined(plan):  # reductions with a prologue, and launches storing f16 rows (wgr's out_h, the conv's y_h)
        return sum(p.program.meta["entry"].startswith("nf4_mm_reduce_prep")
                   or (p.program.meta["entry"].startswith("nf4_mm_wgr") and p.buffers[12] is not NULL)
                   or (p.program.meta["entry"].startswith("shortconv") and p.buffers[7] is not NULL)
                   or (p.program.meta["entry"].startswith("attention") and p.buffers[9] is not NULL)
                   for p in plan.launches)

    def check(ids):
        ex.fuse_preps = True
        fused_plan, _ = ex.plan(ids, 0, None, True)
        ex.fuse_preps = False
        apart_plan, _ = ex.plan(ids, 0, None, True)
        # 3 reductions or gate/ups, 2 convs, the first attention (the last block's out projection is one row)
        assert joined(fused_plan) == 6 and joined(apart_plan) == 0, ids.size
        assert len(apart_plan.launches) == len(fused_plan.launches) + 6

    _setting_keeps_bits(ex, rng, "fuse_preps", check)


@pytest.mark.parametrize("kind", ["splitk", "wgr-split"])
def test_serial_reductions_are_bit_identical_to_reduction_launches(dev, rng, kind):
    """`serial_reduce` makes the table's split-K configs (every matmul on splitk; ffn.down on wgr) sum their slices in
    each tile's last block, in the reduction's order: decisions give the same bits as with the reduction launches,
    launch by launch and replayed, over prompt lengths and an extend branch, with fewer launches."""
    from tests.cuda.test_model_cuda_tune import kind_table

    from tilewise.model.checkpoint import Checkpoint, random_tensors
    from tilewise.model.config import PRESETS
    from tilewise.model.cuda import CUDAExecutor

    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 9), "f32", "preset:tiny").converted("nf4").materialize()
    ex = CUDAExecutor(ck, device=dev, dispatch=kind_table(dev, cfg, kind), quiet=True)

    def reductions(serial, ids):
        ex.serial_reduce = serial
        plan, _ = ex.plan(ids, 0, None, True)
        return sum("reduce" in p.program.meta["entry"] for p in plan.launches)

    def check(ids):
        assert reductions(True, ids) < reductions(False, ids), ids.size

    _setting_keeps_bits(ex, rng, "serial_reduce", check)


@pytest.mark.parametrize(("apart", "cluster"), [("wgr-split", "wgr-cluster"), ("splitk", "splitk-cluster")])
def test_cluster_reductions_are_bit_identical_to_reduction_launches(dev, rng, apart, cluster):
    """Slices summed inside a cluster (SR 2: ffn.down on wgr in two slices; every matmul on splitk) give the same
    decisions, bit for bit, as the same table with SR 0 (reduction launches, joined with the next prologue where one
    follows): launch by launch and replayed, over prompt lengths and an extend branch, with no reduction left."""
    from tests.cuda.test_model_cuda_tune import kind_table

    from tilewise.model.checkpoint import Checkpoint, random_tensors
    from tilewise.model.config import PRESETS
    from tilewise.model.cuda import CUDAExecutor

    cfg = PRESETS["tiny"]
    ck = Checkpoint.from_arrays(cfg, random_tensors(cfg, 11), "f32", "preset:tiny").converted("nf4").materialize()
    ex = {k: CUDAExecutor(ck, device=dev, dispatch=kind_table(dev, cfg, k), quiet=True) for k in (apart, cluster)}

    def run(kind, ids, start, base, graphs):
        ex[kind].graphs = graphs
        hidden, state = ex[kind].forward(ids, start, base, True)
        return hidden, state.scores.copy(), state

    for n in (9, 40, 121):
        ids = rng.integers(0, cfg.vocab_size, n)
        want = run(apart, ids, 0, None, False)
        for graphs in (True, True, False):
            got = run(cluster, ids, 0, None, graphs)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
        plan, _ = ex[cluster].plan(ids, 0, None, True)
        entries = [p.program.meta["entry"] for p in plan.launches]
        assert not any("reduce" in e for e in entries) and any(e.split("<")[0].endswith("_cluster") for e in entries)
    head = rng.integers(0, cfg.vocab_size, 30)
    tail = rng.integers(0, cfg.vocab_size, 12)
    bases = {k: run(k, head, 0, None, True)[2] for k in ex}
    want = run(apart, tail, 30, bases[apart], False)
    got = run(cluster, tail, 30, bases[cluster], True)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("table", ["wgr-cluster", "wgr-splitk-out"])
@pytest.mark.parametrize("name", ["tiny", "default"])
def test_the_norm_fold_matches_the_float64_reference_and_the_unfolded_decision(dev, rng, name, table):
    """fold_norm on a wgr table (ffn.down split in two and summed in a cluster; or the out projections on splitk
    clusters): the residual launches hand the next matmul f16 (h * g) rows and sums of squares, and its prologue is
    gone; all 8 scores match the float64 forward and the unfolded decision within the f16 tolerance, launch by
    launch and replayed, over prompt lengths and an extend branch. The bundled model (256 wide) sums four 64-column
    partials a row."""
    from tests.cuda.test_model_cuda_tune import kind_table

    from tilewise.model import reference
    from tilewise.model.checkpoint import HEAD
    from tilewise.model.cuda import CUDAExecutor
    from tilewise.model.runtime import open_checkpoint

    ck = open_checkpoint(name, "nf4", seed=5) if name == "tiny" else open_checkpoint(name, "nf4")
    cfg = ck.config
    ex = CUDAExecutor(ck, device=dev, dispatch=kind_table(dev, cfg, table), quiet=True)
    weights = {k: ck.float32(k) for k in ck.names()}

    def scores(ids, start=0, base=None, fold=True, graphs=True):
        ex.fold_norm, ex.graphs = fold, graphs
        _, state = ex.forward(ids, start, base, True)
        return state.scores.copy(), state

    def close(got, want, tol):
        np.testing.assert_allclose(got, want, atol=tol * max(1.0, float(np.abs(want).max())), rtol=0)

    for n in (9, 40, 121):
        ids = rng.integers(0, cfg.vocab_size, n)
        ref, _ = reference.forward(cfg, weights, ids)
        want = weights[HEAD].astype(np.float64) @ ref[-1]  # (8,)
        plain = scores(ids, fold=False)[0]
        for graphs in (False, True, True):
            got = scores(ids, graphs=graphs)[0]
            close(got, want, 3e-2)
            close(got, plain, 1e-2)
        plan, _ = ex.plan(ids, 0, None, True)
        entries = [p.program.meta["entry"] for p in plan.launches]
        assert sum(e.startswith("nf4_mm_prep") for e in entries) == 1 and "ss" in ex._scratch
    head, tail = rng.integers(0, cfg.vocab_size, 30), rng.integers(0, cfg.vocab_size, 12)
    base = scores(head)[1]
    ref, _ = reference.forward(cfg, weights, np.concatenate([head, tail]))
    close(scores(tail, 30, base)[0], weights[HEAD].astype(np.float64) @ ref[-1], 3e-2)


@pytest.mark.parametrize("qkv", ["ks1", "cluster"])
def test_rope_in_the_qkv_epilogue_matches_the_separate_launch_and_the_float64_reference(dev, rng, qkv):
    """fuse_rope on the bundled model (heads of 64) with qkv on wgr summing in its own launch (KS 1, or KS 2 in a
    cluster): the q/k norm + RoPE launch is gone; in the first attention block the V cache rows the epilogue writes
    are the separate launch's bits and the K rows agree within the f32 rounding (each head's sum of squares adds in
    another order), later blocks (whose inputs carry that rounding) within 1e-3 of their largest value, at start 0
    and after a cached prefix; all 8 scores match the float64 forward and the unfused decision, launch by launch and
    replayed."""
    from tests.cuda.test_model_cuda_tune import kind_table

    from tilewise.kernels.matmul.cuda import DEFAULT_WGR, CudaMatmul
    from tilewise.model import reference
    from tilewise.model.checkpoint import HEAD
    from tilewise.model.cuda import CUDAExecutor
    from tilewise.model.dispatch import matmul_key
    from tilewise.model.runtime import open_checkpoint
    from tilewise.tune.dispatch import Entry

    ck = open_checkpoint("default", "nf4")
    cfg = ck.config
    table = kind_table(dev, cfg, "wgr")
    qkv_n, d = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim, cfg.head_dim
    config = DEFAULT_WGR if qkv == "ks1" else {**DEFAULT_WGR, "KS": 2, "SR": 2}
    tpl = CudaMatmul("wgr", "nf4", "none", True)
    table.put(matmul_key("nf4", "none", qkv_n, cfg.hidden_size, True),
              Entry([{"m_min": 8, "m_max": None, "kernel": tpl.name, "config": config}]), tpl)
    ex = CUDAExecutor(ck, device=dev, dispatch=table, quiet=True)
    weights = {k: ck.float32(k) for k in ck.names()}
    hkv = cfg.num_key_value_heads
    first = cfg.layer_types.index("full_attention")

    def same_cache(kv, want):
        for i, (k, v) in kv.items():
            if i == first:
                np.testing.assert_array_equal(v, want[i][1])
                np.testing.assert_allclose(k, want[i][0], rtol=1e-5, atol=1e-6)
            else:
                for got, ref in zip((k, v), want[i]):
                    np.testing.assert_allclose(got, ref, atol=1e-3 * max(1.0, float(np.abs(ref).max())), rtol=0)

    def run(ids, start=0, base=None, fuse=True, graphs=True):
        ex.fuse_rope, ex.graphs = fuse, graphs
        _, state = ex.forward(ids, start, base, True)
        kv = {i: [dev.download(b, np.float32, (start + len(ids), hkv * d)) for b in pair]
              for i, pair in state.kv.items()}
        return state.scores.copy(), kv, state

    for n in (9, 40, 121):
        ids = rng.integers(0, cfg.vocab_size, n)
        ref, _ = reference.forward(cfg, weights, ids)
        want = weights[HEAD].astype(np.float64) @ ref[-1]  # (8,)
        plain, plain_kv, _ = run(ids, fuse=False)
        for graphs in (False, True, True):
            got, kv, _ = run(ids, graphs=graphs)
            np.testing.assert_allclose(got, want, atol=3e-2 * max(1.0, float(np.abs(want).max())), rtol=0)
            np.testing.assert_allclose(got, plain, atol=1e-3 * max(1.0, float(np.abs(plain).max())), rtol=0)
            same_cache(kv, plain_kv)
        plan, _ = ex.plan(ids, 0, None, True)
        assert "attn.qknorm_rope" not in plan.labels
    head, tail = rng.integers(0, cfg.vocab_size, 30), rng.integers(0, cfg.vocab_size, 12)
    base_plain, base = run(head, fuse=False)[2], run(head)[2]
    plain, plain_kv, _ = run(tail, 30, base_plain, fuse=False)
    got, kv, _ = run(tail, 30, base)
    ref, _ = reference.forward(cfg, weights, np.concatenate([head, tail]))
    np.testing.assert_allclose(got, weights[HEAD].astype(np.float64) @ ref[-1], atol=3e-2 * max(1.0, float(
        np.abs(got).max())), rtol=0)
    same_cache(kv, plain_kv)
