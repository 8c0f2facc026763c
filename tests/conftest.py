"""Shared fixtures: devices are created once per session; GPU tests skip cleanly when no adapter exists.

Set TILEWISE_REQUIRE_WEBGPU=1 (CI does) to turn a missing WebGPU adapter into a failure instead of a skip.
Tests that check a random sample of a large grid draw it from the run's seed (fixture `sample_seed`): a fresh one
each run, printed at the end; TILEWISE_TEST_SEED=N draws the same samples again.
"""

from __future__ import annotations

import os
import random
import zlib

import numpy as np
import pytest


def _sample_seed() -> int:
    """TILEWISE_TEST_SEED, else a fresh seed: each run then draws other samples, and runs over time cover the grid."""
    given = os.environ.get("TILEWISE_TEST_SEED", "").strip()
    if not given:
        return random.SystemRandom().randrange(10**6)
    try:
        return int(given)
    except ValueError:
        raise pytest.UsageError(f"TILEWISE_TEST_SEED={given!r} is not an integer") from None


#: the seed of the tests that check a random sample of a large grid (fixture `sample_seed`)
SAMPLE_SEED = _sample_seed()
_SEED_USED = pytest.StashKey[bool]()


@pytest.fixture(scope="session")
def sample_seed(request) -> int:
    """The run's seed for tests that check a random sample of a large grid (draw with `random.Random`, and name the
    seed in the failure message); printed at the end of the run, set TILEWISE_TEST_SEED to draw the same again."""
    request.config.stash[_SEED_USED] = True
    return SAMPLE_SEED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if config.stash.get(_SEED_USED, False):
        terminalreporter.write_line(f"sampled tests drew with TILEWISE_TEST_SEED={SAMPLE_SEED} (set it to repeat them)")


@pytest.fixture(autouse=True, scope="session")
def _private_cache_for_the_session(tmp_path_factory):
    """The same for fixtures of a module or the session, which are set up before any test's own folder exists: a
    model such a fixture loads must not pick up a dispatch table the user tuned on this machine."""
    base = tmp_path_factory.mktemp("tilewise-session-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEWISE_STORE", str(base / "results.sqlite"))
        mp.setenv("TILEWISE_DISPATCH_DIR", str(base / "dispatch"))
        yield


@pytest.fixture(autouse=True)
def _private_store(tmp_path_factory, monkeypatch):
    """Each test writes its results store and dispatch tables into its own folder, never the user's cache (a
    stored result would otherwise be reused by a later test or run, and a user's tables read by a test)."""
    base = tmp_path_factory.mktemp("tilewise-cache")
    monkeypatch.setenv("TILEWISE_STORE", str(base / "results.sqlite"))
    monkeypatch.setenv("TILEWISE_DISPATCH_DIR", str(base / "dispatch"))


@pytest.fixture(scope="session")
def cpu_device():
    from tilewise.devices import get_device

    return get_device("cpu")


@pytest.fixture(scope="session")
def webgpu_device():
    from tilewise.devices import get_device
    from tilewise.errors import DeviceUnavailable

    # TILEWISE_TEST_WEBGPU_RUNTIME=dawn runs the WebGPU tests on Dawn (scripts/run test does, on a Mesa it accepts)
    name = "dawn" if os.environ.get("TILEWISE_TEST_WEBGPU_RUNTIME") == "dawn" else "webgpu"
    try:
        return get_device(name)
    except DeviceUnavailable as exc:
        if os.environ.get("TILEWISE_REQUIRE_WEBGPU") == "1":
            pytest.fail(f"WebGPU adapter required but unavailable: {exc}")
        pytest.skip(f"no WebGPU adapter: {exc}")


@pytest.fixture
def rng(request):
    """A seeded generator per test (seed from the test name, so failures reproduce).

    crc32, not `hash`: Python salts str hashes per process, which gave every run other inputs.
    """
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)
