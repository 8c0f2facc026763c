"""Careless and hostile command lines: each one ends in one clear error (problem, fix, exit 2, no traceback),
and none of them writes a file or a store.

The first tests walk the whole parser, so an option added later is covered without listing it here.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from tilewise.cli import build_parser, common, main

BAD_VALUES = ("abc", "-7", "0", "nan", "inf", "1e400", "", "3.5", "99999999999999999999999")


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(argv prefix, parser) for every command and subcommand."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*prefix, name))


def _typed_options():
    for prefix, parser in _commands(build_parser()):
        for action in parser._actions:
            if action.option_strings and action.type is not None and not isinstance(action, argparse._HelpAction):
                yield prefix, action


TYPED = list(_typed_options())


def test_the_walk_finds_the_commands_and_options():
    names = {" ".join(p) for p, _ in _commands(build_parser())}
    assert {"play", "tune gemm", "tune model", "sweep", "report", "store", "bench", "game eval"} <= names
    assert len(TYPED) > 40


@pytest.mark.parametrize("prefix,action", TYPED, ids=[f"{' '.join(p)} {a.option_strings[-1]}" for p, a in TYPED])
def test_numeric_options_use_a_checked_type(prefix, action):
    # plain int/float accept -1, nan and 1e400: every numeric option must state its range
    assert action.type not in (int, float), f"{' '.join(prefix)} {action.option_strings[-1]} takes any {action.type}"


def _rejected(action: argparse.Action, value: str) -> bool:
    try:
        action.type(value)  # type: ignore[misc]
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return True
    return bool(action.choices) and value not in action.choices


CASES = [(prefix, action.option_strings[0], value) for prefix, action in TYPED for value in BAD_VALUES
         if _rejected(action, value)]


def test_there_are_hundreds_of_cases():
    assert len(CASES) >= 200


@pytest.fixture
def quiet_cwd(tmp_path, monkeypatch):
    """Run in an empty folder and remember what the store folder holds, to prove nothing was written."""
    monkeypatch.chdir(tmp_path)
    store = Path(os.environ["TILEWISE_STORE"])
    before = store.exists()
    yield tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a refused command wrote a file"
    assert store.exists() == before, "a refused command created a store"


@pytest.mark.parametrize("prefix,option,value", CASES, ids=[f"{' '.join(p)} {o}={v!r}" for p, o, v in CASES])
def test_a_bad_value_is_one_clear_error(capsys, quiet_cwd, prefix, option, value):
    assert main([*prefix, f"{option}={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "\n  fix: " in err and "Traceback" not in err
    assert option in err  # the message names the option it refuses
    assert err.count("error: ") == 1


@pytest.mark.parametrize("argv,needle", [
    (["tune", "gemm", "--shape", "99999,99999,99999", "--dry-run"], "is too large"),
    (["tune", "gemm", "--shape", "64,64,64", "--show-source", "BM=abc"], "BM=abc is not a value of parameter BM"),
    (["tune", "gemm", "--show-source", "BM=64;BN=64"], "is not a value of parameter BM"),
    (["tune", "gemm", "--show-source", "BM=64,BM=128"], "given twice"),
    (["tune", "gemm", "--show-source", "SA=global"], "SA=global is not a value"),
    (["tune", "gemm", "--show-source", "BM=64,BN=64"], "is illegal under webgpu-default: threads"),
    (["tune", "gemm", "--shape", "64,64,64", "--json", "."], "is a folder"),
    (["tune", "gemm", "--shape", "64,64,64", "--json", "no/such/dir/r.json"], "does not exist"),
    (["tune", "gemm", "--shape", "64,64,64", "--plot", "r.txt"], "must name a .png file"),
    (["tune", "gemm", "--shape", "64,64,64", "--device", "cuda", "--dry-run", "--space", "nope"], "unknown space"),
    (["tune", "conv1d", "--shape", "4,64", "--dry-run"], "longer than the input"),
    (["tune", "nope"], "unknown family 'nope'"),
    (["sweep", "gemm", "--m", "1..9999999999", "--n", "4", "--k", "4"], "a sweep takes at most"),
    (["sweep", "gemm", "--m", "1,x", "--n", "4", "--k", "4"], "cannot parse M value"),
    (["sweep", "gemm", "--m", "1", "--n", "4", "--k", "4", "--out", "d.json", "--json", "d.json"], "both name"),
    (["sweep", "conv1d", "--m", "1", "--n", "4", "--k", "4"], "sweep needs an M,N,K kernel"),
    (["sweep", "gemm", "--m", "1", "--n", "99999", "--k", "99999"], "is too large"),
    (["play", "--policy", "mystery"], "unknown --policy 'mystery'"),
    (["play", "--json", "."], "is a folder"),
    (["game", "dataset", "--games", "1", "--seed", "0", "--out", "d.txt"], "must end in .npz"),
    (["game", "eval", "--games", "0"], "--games"),
    (["frobnicate"], "unknown command 'frobnicate'"),
    (["devices", "--json", "/"], "is a folder"),
])
def test_hostile_command_lines(capsys, quiet_cwd, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err, err
    assert err.startswith("error: ") and "\n  fix: " in err and "Traceback" not in err


def test_json_never_overwrites_a_store(capsys, tmp_path):
    from tilewise.tune.store import Store

    db = tmp_path / "results.db"
    Store(db).close()
    before = db.read_bytes()
    assert main(["tune", "gemm", "--shape", "64,64,64", "--dry-run", "--json", str(db)]) == 2
    assert "is a SQLite database" in capsys.readouterr().err
    assert db.read_bytes() == before


def test_json_dash_is_stdout_and_nothing_else(capsys, quiet_cwd):
    import json

    assert main(["tune", "gemm", "--shape", "64,64,64", "--dry-run", "--json", "-"]) == 0
    out = capsys.readouterr()
    found = json.loads(out.out)
    assert found["kernel"] == "gemm" and found["legal_count"] == len(found["legal"]) > 0
    assert all(e["reasons"] for e in found["illegal"])
    assert not (quiet_cwd / "-").exists()


def test_json_file_is_written_atomically_and_the_dry_run_lines_still_print(capsys, tmp_path):
    import json

    out = tmp_path / "dry.json"
    assert main(["tune", "gemm", "--shape", "64,64,64", "--dry-run", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "legal" in printed and f"wrote {out}" in printed
    assert json.loads(out.read_text())["shape"] == [64, 64, 64]
    assert [p.name for p in tmp_path.iterdir()] == ["dry.json"]  # no temporary file left behind


def test_output_file_refuses_before_any_work(tmp_path):
    with pytest.raises(argparse.ArgumentTypeError, match="is a folder"):
        common.output_file(str(tmp_path))
    assert common.output_file("-") == "-"
    assert common.output_file(str(tmp_path / "x.json")) == str(tmp_path / "x.json")
