"""Every benchmark and experiment script answers `--help` on a machine without a GPU: its module-level imports
resolve (a name moved inside the package breaks them here, not on the GPU machine, where device time is scarce) and
its options parse. The scripts run only on GPUs, so nothing else of them runs in CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(p.relative_to(ROOT) for d in ("bench", "experiments") for p in (ROOT / d).glob("*.py"))
#: the files that run as scripts (the rest are modules the scripts import: bench_args, clock_log, study_record)
SCRIPTS = [p for p in FILES if '__name__ == "__main__"' in (ROOT / p).read_text()]


def test_the_scripts_are_found():
    names = {p.name for p in SCRIPTS}
    assert len(SCRIPTS) >= 25 and {"model_cuda.py", "wgr_parts_cuda.py", "cuda_wg_diag.py"} <= names
    assert not names & {"bench_args.py", "clock_log.py", "study_record.py"}


@pytest.mark.parametrize("script", SCRIPTS, ids=str)
def test_every_script_answers_help_without_a_gpu(script):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(ROOT / script), "--help"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout, done.stdout[:500]


def package_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from tilewise... import name` in a file, at any depth (lazy imports included)."""
    import ast

    tree = ast.parse(path.read_text())
    return [(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module and node.module.startswith("tilewise") for alias in node.names]


@pytest.mark.parametrize("path", FILES, ids=str)
def test_every_name_a_script_imports_from_the_package_exists(path):
    import importlib.util

    missing = []
    for module, name in package_imports(ROOT / path):
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            if "cupy" in str(exc) or "torch" in str(exc):  # an optional dependency the GPU machine has
                continue
            missing.append(f"{module}: {exc}")
            continue
        if not hasattr(mod, name) and importlib.util.find_spec(f"{module}.{name}") is None:
            missing.append(f"{module}.{name}")
    assert not missing, missing
