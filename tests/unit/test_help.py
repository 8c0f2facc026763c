"""Help a new user can act on: plain `tilewise` lists the commands, every option explains itself and shows its
default, every command ends with examples, `tune` names its kernel families."""

from __future__ import annotations

import argparse

import pytest
from tests.unit.test_bad_inputs import _commands

from tilewise.cli import build_parser, main

COMMANDS = [(p, parser) for p, parser in _commands(build_parser()) if p]
LEAVES = [(p, parser) for p, parser in COMMANDS
          if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)]


def test_plain_tilewise_lists_the_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in ("play", "bench", "tune", "sweep", "report", "store", "devices", "convert", "train", "ladder"):
        assert f"\n    {name} " in out


@pytest.mark.parametrize("prefix,parser", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_option_has_a_help_line(prefix, parser):
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            assert action.help, f"{' '.join(prefix)} {action.option_strings or action.dest} has no help line"


@pytest.mark.parametrize("prefix,parser", LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_command_ends_with_examples(prefix, parser):
    assert "example" in (parser.epilog or ""), f"tilewise {' '.join(prefix)} has no examples"
    assert f"tilewise {prefix[0]}" in parser.epilog


@pytest.mark.parametrize("prefix,parser", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_defaults_are_shown(prefix, parser):
    import re

    text = parser.format_help()
    # one block per option in the rendered help: from its line to the next option's line
    blocks = re.split(r"\n(?=  -)", text[text.find("options:"):])
    for action in parser._actions:
        if action.option_strings and action.default is not None and action.default is not False and \
                action.default != argparse.SUPPRESS:
            (block,) = [b for b in blocks if re.match(rf"\s*{re.escape(action.option_strings[0])}[ ,\n]", b)]
            assert "default" in block, f"{' '.join(prefix)} {action.option_strings[0]} hides its default"


def test_tune_lists_its_kernel_families():
    from tilewise.kernels.registry import kernels

    (tune,) = [parser for p, parser in COMMANDS if p == ("tune",)]
    text = tune.format_help()
    assert all(name in text for name in kernels())
