"""The classifier's prompt (seed 001's format, byte for byte) and a strict parser for it.

    <|startoftext|><|im_start|>system
    You are playing a polyomino game. The board state is below.
    . is an empty cell
    # is a settled cell
    % is your falling piece<|im_end|>
    <|im_start|>user
    <board>
    . . . . . . . . . . .        21 rows of 11 space-separated cells, row 0 at the top
    ...
    </board>
    piece:J4 rot:1 x:04 y:12     falling piece, rotation state, pivot column and row (two digits each)
    next:I5                      previewed piece
    heights:00 00 ... 00         11 column heights, two digits each
    holes:07 drop:03<|im_end|>   holes (capped at 99) and rows the piece can still fall
    <|im_start|>assistant
    action:

The prompt ends right after `action:` (no newline). Everything up to and including `<board>\\n` is the same
in every prompt (`PROMPT_PREFIX`): the cacheable prefix.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from tilewise.errors import ConfigError
from tilewise.game.engine import Game, parse_rows
from tilewise.game.features import column_heights, count_holes, drop_distance
from tilewise.game.pieces import BOARD_HEIGHT, BOARD_WIDTH, get_piece

SYSTEM_TEXT = (
    "You are playing a polyomino game. The board state is below.\n"
    ". is an empty cell\n"
    "# is a settled cell\n"
    "% is your falling piece"
)
PROMPT_PREFIX = (
    "<|startoftext|><|im_start|>system\n" + SYSTEM_TEXT + "<|im_end|>\n<|im_start|>user\n<board>\n"
)
PROMPT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\naction:"
MAX_HOLES_SHOWN = 99  # two digits in the prompt


@functools.lru_cache(maxsize=4096)
def _spaced(row: str) -> str:
    """A board row as the prompt writes it (`. . # % ...`); most rows repeat from one move to the next."""
    return " ".join(row)


def render_prompt(game: Game) -> str:
    """Render the prompt for the game's current position (seed 001's format).

    Args:
        game: a Game that is not over.

    Returns:
        The full prompt text, ending in `action:`.
    """
    board = "\n".join(map(_spaced, game.render_rows()))
    heights = " ".join(f"{h:02d}" for h in game.heights())
    holes = min(game.holes(), MAX_HOLES_SHOWN)
    return (
        PROMPT_PREFIX
        + board
        + "\n</board>\n"
        + f"piece:{game.piece.name} rot:{game.rot} x:{game.x:02d} y:{game.y:02d}\n"
        + f"next:{game.next_piece.name}\n"
        + f"heights:{heights}\n"
        + f"holes:{holes:02d} drop:{game.drop():02d}"
        + PROMPT_SUFFIX
    )


@dataclass(frozen=True)
class ParsedPrompt:
    """A prompt read back.

    Attributes:
        rows: 21 strings of 11 symbols (`.`, `#`, `%`).
        piece, rot, x, y: the falling piece line.
        next_piece: the preview.
        heights, holes, drop: the feature lines as printed.
    """

    rows: tuple[str, ...]
    piece: str
    rot: int
    x: int
    y: int
    next_piece: str
    heights: tuple[int, ...]
    holes: int
    drop: int

    def to_game(self, seed: int = 0) -> Game:
        """A Game in this position (settled cells from `#`, the falling piece from the piece line)."""
        return Game.from_state(list(self.rows), self.piece, self.rot, self.x, self.y, self.next_piece, seed=seed)


_TAIL = re.compile(
    r"piece:(?P<piece>[A-Z][0-9]) rot:(?P<rot>[0-3]) x:(?P<x>[0-9]{2}) y:(?P<y>[0-9]{2})\n"
    r"next:(?P<next>[A-Z][0-9])\n"
    r"heights:(?P<heights>[0-9]{2}(?: [0-9]{2}){" + str(BOARD_WIDTH - 1) + r"})\n"
    r"holes:(?P<holes>[0-9]{2}) drop:(?P<drop>[0-9]{2})\Z"
)


def _bad(problem: str) -> ConfigError:
    return ConfigError(f"malformed prompt: {problem}",
                       "give a prompt rendered by tilewise.game.prompt.render_prompt (seed 001's format)")


def parse_prompt(text: str, check: bool = True) -> ParsedPrompt:
    """Parse a prompt and (by default) check that it is self-consistent.

    Args:
        text: a full prompt, as `render_prompt` writes it.
        check: also check that the `%` cells are the named piece at rot/x/y and that heights, holes and
            drop follow from the board.

    Returns:
        ParsedPrompt.

    Raises:
        ConfigError: the text is not in the format, a piece name is unknown, or (with check) a line
            disagrees with the board; the message names the line.
    """
    if not isinstance(text, str):
        raise _bad(f"expected a str, got {type(text).__name__}")
    if not text.startswith(PROMPT_PREFIX):
        raise _bad("it does not start with the chat template, system text and `<board>` line")
    if not text.endswith(PROMPT_SUFFIX):
        raise _bad("it does not end with `<|im_end|>`, the assistant turn and `action:`")
    body = text[len(PROMPT_PREFIX):len(text) - len(PROMPT_SUFFIX)]
    if "\n</board>\n" not in body:
        raise _bad("no `</board>` line")
    board_text, tail = body.split("\n</board>\n", 1)
    lines = board_text.split("\n")
    if len(lines) != BOARD_HEIGHT:
        raise _bad(f"the board has {len(lines)} rows, expected {BOARD_HEIGHT}")
    rows = []
    for r, line in enumerate(lines):
        cells = line.split(" ")
        if len(cells) != BOARD_WIDTH or any(len(c) != 1 or c not in ".#%" for c in cells):
            raise _bad(f"board row {r} is {line!r}; expected {BOARD_WIDTH} cells of `.`, `#` or `%` "
                       "separated by single spaces")
        rows.append("".join(cells))
    m = _TAIL.match(tail)
    if m is None:
        raise _bad(f"the lines after </board> do not match `piece:J4 rot:1 x:04 y:12`, `next:I5`, "
                   f"`heights:` + {BOARD_WIDTH} two-digit values, `holes:07 drop:03`: {tail!r}")
    parsed = ParsedPrompt(
        rows=tuple(rows), piece=get_piece(m["piece"]).name, rot=int(m["rot"]), x=int(m["x"]), y=int(m["y"]),
        next_piece=get_piece(m["next"]).name, heights=tuple(int(h) for h in m["heights"].split(" ")),
        holes=int(m["holes"]), drop=int(m["drop"]),
    )
    if check:
        _check_consistent(parsed)
    return parsed


def _check_consistent(p: ParsedPrompt) -> None:
    piece = get_piece(p.piece)
    falling = {(c, r) for r, row in enumerate(p.rows) for c, ch in enumerate(row) if ch == "%"}
    expected = set(piece.cells(p.rot, p.x, p.y))
    if falling != expected:
        raise _bad(f"the `%` cells {sorted(falling)} are not {p.piece} rot {p.rot} at x={p.x} y={p.y} "
                   f"(expected {sorted(expected)})")
    board = parse_rows(list(p.rows))
    heights = tuple(column_heights(board))
    if heights != p.heights:
        raise _bad(f"heights line {p.heights} disagrees with the board ({heights})")
    holes = min(count_holes(board), MAX_HOLES_SHOWN)
    if holes != p.holes:
        raise _bad(f"holes:{p.holes:02d} disagrees with the board ({holes})")
    drop = drop_distance(board, piece.states[p.rot], p.x, p.y)
    if drop != p.drop:
        raise _bad(f"drop:{p.drop:02d} disagrees with the board ({drop})")
