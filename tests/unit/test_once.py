"""`devices.base.Once`: a value per key made by one thread while the others asking wait (what keeps a batch compiled
on threads from compiling the kernel every config shares once per thread)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tilewise.devices.base import Once


def test_threads_asking_for_one_key_at_once_wait_for_a_single_make():
    once, calls = Once(), []
    started = threading.Barrier(8)

    def make():
        calls.append(threading.current_thread().name)
        time.sleep(0.05)  # long enough that every other thread asks while this one is making
        return object()

    def ask(_):
        started.wait()
        return once.get("reduce", make)

    with ThreadPoolExecutor(8) as pool:
        values = list(pool.map(ask, range(8)))
    assert len(calls) == 1 and all(v is values[0] for v in values)
    assert once.get("reduce", make) is values[0] and len(calls) == 1


def test_a_failed_make_reaches_every_waiter_and_is_not_kept():
    once, calls = Once(), []
    started = threading.Barrier(4)

    def make():
        calls.append(1)
        time.sleep(0.05)
        raise ValueError("nvrtc: error: expected a ';'")

    def ask(_):
        started.wait()
        try:
            once.get("bad", make)
        except ValueError as exc:
            return str(exc)
        return None

    with ThreadPoolExecutor(4) as pool:
        errors = list(pool.map(ask, range(4)))
    assert errors == ["nvrtc: error: expected a ';'"] * 4 and len(calls) == 1
    with pytest.raises(ValueError):
        once.get("bad", make)  # not kept: made (and failed) again
    assert len(calls) == 2
    assert once.get("bad", lambda: 7) == 7


def test_different_keys_are_made_at_the_same_time():
    once = Once()
    inside = threading.Barrier(2, timeout=5)  # both makes must be running at once to pass it

    def make(k):
        inside.wait()
        return k

    with ThreadPoolExecutor(2) as pool:
        assert sorted(pool.map(lambda k: once.get(k, lambda: make(k)), ["a", "b"])) == ["a", "b"]
    once.clear()
    assert once.get("a", lambda: "again") == "again"
