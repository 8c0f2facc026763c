"""Shared fixtures: devices are created once per session; GPU tests skip cleanly when no adapter exists.

Set TILEWISE_REQUIRE_WEBGPU=1 (CI does) to turn a missing WebGPU adapter into a failure instead of a skip.
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest


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
