import json
import subprocess
import sys

import pytest

from tilewise.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tilewise", *args], capture_output=True, text=True, timeout=120)


def test_devices_json_lists_cpu_with_required_keys(capsys):
    assert main(["devices", "--json", "-"]) == 0
    devices = json.loads(capsys.readouterr().out)
    assert devices[0]["backend"] == "cpu"
    for d in devices:
        assert {"backend", "name", "adapter_type", "driver", "fingerprint", "limits", "features"} <= set(d)


def test_unknown_command_exits_nonzero():
    proc = run_cli("no-such-command")
    assert proc.returncode != 0
    assert "unknown command 'no-such-command'" in proc.stderr and "fix: use one of: play" in proc.stderr


def test_cuda_without_cupy_is_one_clear_message(monkeypatch, capsys):
    pytest.importorskip("tilewise.devices")
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    from tilewise.devices import get_device
    from tilewise.errors import DeviceUnavailable

    with pytest.raises(DeviceUnavailable) as exc:
        get_device("cuda")
    assert "pip install" in str(exc.value)
