"""Ctrl-C on `tilewise tune ... --ray` (a local cluster, WebGPU on lavapipe): the run exits 130 saying
"interrupted", every row it committed stays in a store that reads fine, the cluster's processes are gone, and the
same command run again finishes and keeps those rows (it skips them; only its final race re-times the fastest)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="tilewise[ray] is not installed")
if not hasattr(ray, "init"):  # a folder named ray on the path imports as an empty namespace package
    pytest.skip("`ray` here is not the Ray package", allow_module_level=True)

from tilewise.tune.store import Store  # noqa: E402

pytestmark = [pytest.mark.webgpu,
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table in /proc")]

BUDGET = 64  # four batches of 16 on one worker: the first commits long before the run ends
FINAL_RACE = 8  # `tune`'s default: the fastest few are re-timed together at the end, and stored again
WAIT_S = 300  # generous limits, only so that a broken run cannot hang the suite


def _argv(store: Path) -> list[str]:
    return [sys.executable, "-m", "tilewise", "tune", "gemm", "--device", "webgpu", "--shape", "33,36,20",
            "--space", "full", "--budget", str(BUDGET), "--rounds", "3", "--ray", "--store", str(store),
            "--top", "3"]


def _rows(store: Path) -> dict[tuple[str, ...], tuple[object, ...]]:
    """What the store holds, by key: (status, median, when stored); opening it checks it is a sound store."""
    if not store.exists():
        return {}
    with Store(store, readonly=True) as s:
        return {r.key: (r.status, r.median_ms, r.created) for r in s.query()}


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time in clock ticks) of a process, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0], int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _tree(root: int) -> dict[int, int]:
    """The process `root` and all its descendants (Ray's gcs_server, raylet, workers...), pid -> start time."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for pid in _pids():
        st = _stat(pid)
        if st is not None:
            children.setdefault(st[0], []).append(pid)
            starts[pid] = st[2]
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in starts:
            out[pid] = starts[pid]
            todo += children.get(pid, [])
    return out


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[2] == start and st[1] not in ("Z", "X")  # same process (pids are reused), not a zombie


def _left(tree: dict[int, int], session: str) -> list[str]:
    """Processes of the run still alive: ones seen in its tree, or any naming its Ray session (re-parented)."""
    pids = {p for p, start in tree.items() if _alive(p, start)}
    pids |= {p for p in _pids() if session in _cmdline(p) and (st := _stat(p)) is not None and st[1] != "Z"}
    return [f"{p}: {_cmdline(p)[:120]}" for p in sorted(pids)]


def _ctrl_c_as_a_terminal_gives_it() -> None:
    """In the child before it starts: SIGINT's default action. A test suite run as a background job of a
    non-interactive shell inherits SIGINT ignored, and so would the run, where Python then never raises
    KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Run:
    """The run, started in its own process group (its own "terminal"), its output going to files (a pipe
    nobody reads while the test waits could fill and stall it)."""

    def __init__(self, store: Path, folder: Path) -> None:
        self.out, self.err = folder / "stdout.txt", folder / "stderr.txt"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(_argv(store), stdout=out, stderr=err, text=True, start_new_session=True,
                                         preexec_fn=_ctrl_c_as_a_terminal_gives_it)

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the run did not exit within {WAIT_S} s:\n{self.stderr()[-4000:]}")

    def kill(self) -> None:
        """After a failure: the run and every process it started (Ray's workers have process groups of their
        own), by pid."""
        if self.proc.poll() is None:
            tree = _tree(self.proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            _kill_left(tree)
            self.proc.wait(timeout=WAIT_S)


def _start_and_wait_for_rows(store: Path, folder: Path) -> tuple[Run, dict[int, int], str]:
    """Start the run; return once a batch is committed, with its process tree and Ray session folder then."""
    run = Run(store, folder)
    try:
        end = time.monotonic() + WAIT_S
        while not _rows(store):
            if run.proc.poll() is not None or time.monotonic() > end:
                pytest.fail(f"no committed row before the run ended or {WAIT_S} s passed (rc "
                            f"{run.proc.returncode}):\n{run.stderr()[-4000:]}")
            time.sleep(0.2)
        tree = _tree(run.proc.pid)
        cmds = [_cmdline(p) for p in tree]
        assert any("raylet" in c for c in cmds) and any("gcs_server" in c for c in cmds), cmds  # the check sees Ray
        found = [m.group(0) for c in cmds if (m := re.search(r"/session_[\w.-]+", c))]
        assert found, cmds
    except BaseException:
        run.kill()
        raise
    return run, tree, found[0]


def _wait_gone(tree: dict[int, int], session: str) -> list[str]:
    end = time.monotonic() + 60
    while (left := _left(tree, session)) and time.monotonic() < end:
        time.sleep(0.5)
    return left


def _kill_left(tree: dict[int, int]) -> None:
    for pid, start in tree.items():  # only what this test's run started, by pid
        if _alive(pid, start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_ctrl_c_keeps_committed_rows_stops_the_cluster_and_a_rerun_resumes(webgpu_device, tmp_path):
    store = tmp_path / "r.sqlite"
    run, tree, session = _start_and_wait_for_rows(store, tmp_path)
    try:
        committed = _rows(store)
        # the driver alone: its own shutdown, not the signal reaching Ray's processes too, must stop the cluster
        os.kill(run.proc.pid, signal.SIGINT)
        rc, err = run.wait(), run.stderr()
        assert rc == 130, err[-4000:]
        assert "interrupted" in err and "Traceback" not in err, err[-4000:]
        after = _rows(store)
        assert {k: after.get(k) for k in committed} == committed  # nothing committed is lost or changed
        assert len(after) < BUDGET, "the signal came after the run's last batch: the run was not interrupted"
        left = _wait_gone(tree, session)
        assert not left, "Ray processes outlived the interrupted run:\n" + "\n".join(left)
    finally:
        run.kill()
        _kill_left(tree)

    again = subprocess.run(_argv(store), capture_output=True, text=True, timeout=WAIT_S)
    assert again.returncode == 0, again.stderr[-4000:]
    resumed = _rows(store)
    assert {k: resumed[k][0] for k in after} == {k: v[0] for k, v in after.items()}  # statuses unchanged
    retimed = [k for k in after if resumed[k] != after[k]]
    assert len(retimed) <= FINAL_RACE, retimed  # the rest skipped: the same times and store dates
    assert len(resumed) == BUDGET and all(status == "ok" for status, _, _ in resumed.values())


def test_ctrl_c_pressed_again_and_again_still_exits_130_without_a_traceback(webgpu_device, tmp_path):
    store = tmp_path / "r.sqlite"
    run, tree, session = _start_and_wait_for_rows(store, tmp_path)
    try:
        committed = _rows(store)
        end = time.monotonic() + WAIT_S
        # Ctrl-C reaches the whole foreground group (driver and Ray's processes); an impatient user presses it
        # until the run is gone, so some presses land while the cluster shuts down and while Python exits
        while run.proc.poll() is None and time.monotonic() < end:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.proc.pid, signal.SIGINT)
            time.sleep(0.2)
        rc, err = run.wait(), run.stderr()
        assert rc == 130, err[-4000:]
        assert "interrupted" in err, err[-4000:]
        assert "Traceback" not in err and "Exception ignored" not in err, err[-4000:]
        after = _rows(store)
        assert {k: after.get(k) for k in committed} == committed
        left = _wait_gone(tree, session)
        assert not left, "Ray processes outlived the interrupted run:\n" + "\n".join(left)
    finally:
        run.kill()
        _kill_left(tree)
