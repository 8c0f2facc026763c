"""Prompt: seed 001's example byte for byte (golden file), the parser round trip, malformed prompts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tilewise.errors import ConfigError
from tilewise.game.engine import Game
from tilewise.game.prompt import PROMPT_PREFIX, parse_prompt, render_prompt

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "seed001_prompt.txt"
SEED_ROWS = ["." * 11] * 17 + ["....##.....", ".....##....", "......###..", ".......#..."]


def golden_text() -> str:
    # the file ends with one newline that is not part of the prompt (the prompt ends at `action:`)
    return GOLDEN.read_text().removesuffix("\n")


def seed_game() -> Game:
    return Game.from_state(SEED_ROWS, "J4", 1, 4, 12, next_piece="I5")


def test_seed_example_feature_lines_and_board_block():
    text = render_prompt(seed_game())
    golden = golden_text()
    lines = golden.split("\n")
    for wanted in ("piece:J4 rot:1 x:04 y:12", "next:I5", "heights:00 00 00 00 04 04 03 02 02 00 00"):
        assert wanted in lines and wanted in text.split("\n")
    assert "holes:07 drop:03<|im_end|>" in lines and "holes:07 drop:03<|im_end|>" in text.split("\n")
    board = golden[golden.index("<board>\n") + 8:golden.index("\n</board>")]
    ours = text[text.index("<board>\n") + 8:text.index("\n</board>")]
    assert ours == board
    assert len(board.split("\n")) == 21


def test_whole_prompt_matches_the_golden_file():
    assert render_prompt(seed_game()) == golden_text()


def test_parse_golden_reads_back_the_seed_position():
    p = parse_prompt(golden_text())
    assert (p.piece, p.rot, p.x, p.y, p.next_piece) == ("J4", 1, 4, 12, "I5")
    assert p.heights == (0, 0, 0, 0, 4, 4, 3, 2, 2, 0, 0) and (p.holes, p.drop) == (7, 3)
    assert render_prompt(p.to_game()) == golden_text()


def random_positions(n: int, seed: int = 0) -> list[Game]:
    rng = random.Random(seed)
    games = []
    while len(games) < n:
        g = Game(rng.randrange(10_000))
        for _ in range(rng.randrange(1, 120)):
            g.step(rng.randrange(6) if rng.random() < 0.5 else rng.choice([2, 4, 5, 1]))
            if g.game_over:
                break
        if not g.game_over:
            games.append(g)
    return games


def test_parse_render_round_trip_on_random_positions():
    for g in random_positions(60):
        text = render_prompt(g)
        p = parse_prompt(text)
        assert (p.piece, p.rot, p.x, p.y) == (g.piece.name, g.rot, g.x, g.y)
        assert list(p.heights) == g.heights() and p.holes == min(g.holes(), 99) and p.drop == g.drop()
        assert render_prompt(p.to_game()) == text


def corrupt(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize("edit, match", [
    (lambda t: t[1:], "chat template"),
    (lambda t: t.removesuffix("action:"), "action:"),
    (lambda t: corrupt(t, ". . . . % % . . . . .\n", ""), "20 rows"),
    (lambda t: corrupt(t, ". . . . % % . . . . .", ". . . . % % . . . . . ."), "row 11"),
    (lambda t: corrupt(t, ". . . . % % . . . . .", ". . . . % % . . . . @"), "row 11"),
    (lambda t: corrupt(t, ". . . . % % . . . . .", ".  . . % % . . . . . ."), "row 11"),
    (lambda t: corrupt(t, "piece:J4", "piece:Q4"), "unknown piece name 'Q4'"),
    (lambda t: corrupt(t, "next:I5", "next:I9"), "unknown piece name 'I9'"),
    (lambda t: corrupt(t, "x:04", "x:4"), "do not match"),
    (lambda t: corrupt(t, "heights:00 00", "heights:00"), "do not match"),
    (lambda t: corrupt(t, "x:04", "x:05"), "not J4 rot 1 at x=5"),
    (lambda t: corrupt(t, "rot:1", "rot:2"), "not J4 rot 2"),
    (lambda t: corrupt(t, "04 04 03", "04 05 03"), "heights line"),
    (lambda t: corrupt(t, "holes:07", "holes:06"), "holes:06 disagrees"),
    (lambda t: corrupt(t, "drop:03", "drop:04"), "drop:04 disagrees"),
    (lambda t: corrupt(t, "</board>\n", "</board>"), "no `</board>` line"),
])
def test_malformed_prompts_raise_a_clear_error(edit, match):
    with pytest.raises(ConfigError, match=match) as info:
        parse_prompt(edit(golden_text()))
    assert "render_prompt" in info.value.fix or "piece" in str(info.value)


def test_parser_refuses_non_text():
    with pytest.raises(ConfigError, match="expected a str"):
        parse_prompt(b"<|startoftext|>")  # type: ignore[arg-type]


def test_every_prompt_starts_with_the_shared_prefix():
    for g in random_positions(20, seed=3):
        assert render_prompt(g).startswith(PROMPT_PREFIX)
