"""The README runs as written: every `tilewise` command in its shell blocks parses with today's flags, every
`bash scripts/run` mode it names exists, and its Python example runs (on the CPU, with the bundled model)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tilewise.cli import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"
TEXT = README.read_text()
SHELL = [line.split("  #")[0].strip() for block in re.findall(r"```bash\n(.*?)```", TEXT, re.S)
         for line in block.strip().splitlines()]


def test_the_readme_is_for_users_and_short():
    assert len(TEXT.splitlines()) <= 300
    assert SHELL[:2] == ["bash scripts/run play", "bash scripts/run test"]  # the two commands come first


COMMANDS = [ln for ln in SHELL if " tilewise " in f" {ln} " or ln.startswith("bash scripts/run play")]


@pytest.mark.parametrize("line", COMMANDS)
def test_every_command_parses(line):
    words = shlex.split(line)
    argv = words[words.index("tilewise") + 1:] if "tilewise" in words else ["play", *words[3:]]
    args = build_parser().parse_args(argv)
    assert callable(args.func)


def test_every_scripts_run_mode_exists():
    run = (README.parent / "scripts" / "run").read_text()
    modes = {shlex.split(ln)[2] for ln in SHELL if ln.startswith("bash scripts/run ")}
    assert modes <= {"play", "test", "tilewise", "extras"}
    assert all(f"  {m})" in run for m in modes)


def test_the_python_example_runs(monkeypatch, capsys):
    (code,) = re.findall(r"```python\n(.*?)```", TEXT, re.S)
    import tilewise

    real = tilewise.load
    monkeypatch.setattr(tilewise, "load", lambda *a, **k: real(*a, **{**k, "device": "cpu"}))  # CI's GPU is software
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("device: cpu")
    from tilewise.game import ACTION_NAMES

    best, diff = out[1].split()
    assert best in ACTION_NAMES[:6] and float(diff) < 1e-4  # the cached prefix gives the same scores
