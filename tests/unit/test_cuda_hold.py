"""How a timed CUDA batch is cut behind holds (no GPU needed)."""

from hypothesis import given
from hypothesis import strategies as st

from tilewise.devices.cuda_hold import HOLD_LAUNCHES, batches


@given(st.integers(0, 600), st.sets(st.integers(0, 599)), st.booleans())
def test_batches_cover_every_launch_once_and_cut_only_where_a_run_starts(n, starts, every):
    runs = None if every else {i for i in starts if i < n} | ({0} if n else set())
    cuts = batches(n, runs)
    assert [i for a, b in cuts for i in range(a, b)] == list(range(n))
    for a, b in cuts:
        assert runs is None or a in runs
        assert b - a <= HOLD_LAUNCHES or runs is not None  # a run longer than a batch is never split
    if runs is None:
        assert all(b - a <= HOLD_LAUNCHES for a, b in cuts)
        assert len(cuts) == -(-n // HOLD_LAUNCHES)
