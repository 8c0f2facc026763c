"""The game engine: an 11x21 board, seeded piece bag with a one-piece preview, six actions, gravity per step.

One `step(action)` is one decision:

1. the action: `0` soft drop (down one row; if it cannot, the piece locks), `1` hard drop (straight down as far
   as it fits, then lock), `2` rotate clockwise, `3` rotate counter-clockwise (with horizontal wall kicks),
   `4` left, `5` right (a blocked move or rotation does nothing);
2. gravity: the piece falls one row; if it cannot, it locks where it is.

Locking writes the piece into the board, clears full rows (rows above move down), counts the piece and the
lines, and spawns the previewed piece; if that spawn overlaps settled cells the game is over. Pieces come from
a bag: all 14 pieces in a seeded random order, then a fresh shuffle.

The board is stored as 21 row bitmasks (bit c = column c, row 0 at the top): the expert searches thousands of
placements per second with the same helper functions the engine uses, so the two can never disagree.
"""

from __future__ import annotations

import operator
import random
from dataclasses import dataclass
from enum import IntEnum

from tilewise.errors import ConfigError, TilewiseError
from tilewise.game.features import FULL_ROW, column_heights, count_holes, drop_distance, fits
from tilewise.game.pieces import BOARD_HEIGHT, BOARD_WIDTH, KICKS, PIECE_NAMES, Piece, get_piece

NUM_OUTPUTS = 8  # classifier outputs; 6 and 7 are reserved and never valid moves
# the text of every settled row (bit c of a row is column c): a prompt is rendered every decision
_ROW_TEXT = tuple("".join("#" if (mask >> c) & 1 else "." for c in range(BOARD_WIDTH))
                  for mask in range(1 << BOARD_WIDTH))


class Action(IntEnum):
    """The six moves (ids 0-5); the classifier's outputs 6 and 7 are reserved."""

    SOFT_DROP = 0
    HARD_DROP = 1
    ROTATE_CW = 2
    ROTATE_CCW = 3
    LEFT = 4
    RIGHT = 5


ACTION_NAMES: tuple[str, ...] = ("soft_drop", "hard_drop", "rotate_cw", "rotate_ccw", "left", "right")


class InvalidAction(ConfigError):
    """An action id outside 0-5 (6 and 7 are reserved classifier outputs, not moves)."""


def check_action(action: object) -> int:
    """Validate an action id.

    Args:
        action: an int (or numpy integer) in 0-5.

    Returns:
        The action as a plain int.

    Raises:
        InvalidAction: not an integer, or outside 0-5.
    """
    if isinstance(action, bool):
        raise InvalidAction(f"action {action!r} is a bool, not an action id", "pass an int in 0-5")
    try:
        value = operator.index(action)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidAction(f"action {action!r} is not an integer",
                            "pass an int in 0-5 (0 soft drop, 1 hard drop, 2 cw, 3 ccw, 4 left, 5 right)") from None
    if not 0 <= value <= 5:
        what = "a reserved classifier output" if value in (6, 7) else "outside 0-5"
        raise InvalidAction(f"action {value} is {what}",
                            "pass an int in 0-5 (0 soft drop, 1 hard drop, 2 cw, 3 ccw, 4 left, 5 right)")
    return value


def check_seed(seed: object) -> int:
    """Validate a seed: a non-negative integer (bools and strings are refused)."""
    if isinstance(seed, bool):
        raise ConfigError(f"seed {seed!r} is a bool", "pass a non-negative integer seed")
    try:
        value = operator.index(seed)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"seed {seed!r} is not an integer", "pass a non-negative integer seed, e.g. 0") from None
    if value < 0:
        raise ConfigError(f"seed {value} is negative", "pass a non-negative integer seed")
    return value


# ---------------------------------------------------------------- pure helpers (shared with the expert)

def try_rotate(board: list[int], piece: Piece, rot: int, x: int, y: int, direction: int) -> tuple[int, int] | None:
    """Rotate by `direction` (+1 clockwise, -1 counter-clockwise) with kicks; returns (rot, x) or None."""
    new_rot = (rot + direction) % 4
    cells = piece.states[new_rot]
    for kick in KICKS:
        if fits(board, cells, x + kick, y):
            return new_rot, x + kick
    return None


def place(board: list[int], cells: tuple[tuple[int, int], ...], x: int, y: int) -> tuple[list[int], int]:
    """Write a piece into a copy of the board and clear full rows; returns (new board, lines cleared)."""
    rows = list(board)
    for dx, dy in cells:
        rows[y + dy] |= 1 << (x + dx)
    kept = [r for r in rows if r != FULL_ROW]
    lines = BOARD_HEIGHT - len(kept)
    return [0] * lines + kept, lines


def apply_action(board: list[int], piece: Piece, rot: int, x: int, y: int,
                 action: int) -> tuple[int, int, int, bool]:
    """One step's movement: the action, then gravity. Returns (rot, x, y, locked); the board is not touched.

    When `locked` is True, (rot, x, y) is where the piece locks.
    """
    cells = piece.states[rot]
    if action == Action.HARD_DROP:
        return rot, x, y + drop_distance(board, cells, x, y), True
    if action == Action.SOFT_DROP:
        if not fits(board, cells, x, y + 1):
            return rot, x, y, True
        y += 1
    elif action == Action.ROTATE_CW or action == Action.ROTATE_CCW:
        turned = try_rotate(board, piece, rot, x, y, 1 if action == Action.ROTATE_CW else -1)
        if turned is not None:
            rot, x = turned
            cells = piece.states[rot]
    else:
        dx = -1 if action == Action.LEFT else 1
        if fits(board, cells, x + dx, y):
            x += dx
    # gravity; a piece that cannot fall locks now, so a landed piece gets exactly one more action
    if fits(board, cells, x, y + 1):
        return rot, x, y + 1, False
    return rot, x, y, True


@dataclass(frozen=True)
class StepResult:
    """What one step did.

    Attributes:
        action: the action id applied.
        locked: the falling piece locked this step.
        lines: rows cleared by that lock (0 otherwise).
        game_over: the next piece could not spawn.
        piece: name of the piece that locked ("" when none did).
        cells: `(col, row)` cells where it locked, before the clear.
        cleared_rows: indices of the rows cleared, before the clear (top to bottom).
    """

    action: int
    locked: bool
    lines: int
    game_over: bool
    piece: str = ""
    cells: tuple[tuple[int, int], ...] = ()
    cleared_rows: tuple[int, ...] = ()


class Game:
    """One seeded game.

    Args:
        seed: non-negative integer; the same seed gives the same piece sequence.

    Attributes:
        board: 21 row bitmasks, row 0 at the top, bit c = column c (settled cells only).
        piece, rot, x, y: the falling piece, its rotation state and its pivot's column and row.
        next_piece: the previewed piece.
        pieces: pieces locked so far; lines: rows cleared so far; steps: actions applied so far.
        game_over: True once a piece could not spawn.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = check_seed(seed)
        self._rng = random.Random(self.seed)
        self._bag: list[str] = []
        self.board: list[int] = [0] * BOARD_HEIGHT
        self.pieces = 0
        self.lines = 0
        self.steps = 0
        self.game_over = False
        self.piece: Piece = get_piece(self._draw())
        self.next_piece: Piece = get_piece(self._draw())
        self.rot, self.x, self.y = 0, self.piece.spawn_x, self.piece.spawn_y

    def _draw(self) -> str:
        if not self._bag:
            bag = list(PIECE_NAMES)
            self._rng.shuffle(bag)
            self._bag = bag[::-1]  # pop() from the end deals the shuffled order
        return self._bag.pop()

    @classmethod
    def from_state(cls, settled: list[str] | list[int], piece: str, rot: int, x: int, y: int,
                   next_piece: str = "I5", seed: int = 0) -> Game:
        """Build a game in a given position (hand-built boards for tests and prompt parsing).

        Args:
            settled: 21 rows, each a string of 11 cells (`#` settled, `.`/`%` empty; spaces ignored) or a
                row bitmask.
            piece: falling piece name; rot: its state 0-3; x, y: its pivot's column and row.
            next_piece: previewed piece name.
            seed: seeds the pieces after `next_piece`.

        Returns:
            The Game.

        Raises:
            ConfigError: malformed rows, unknown piece, or a piece that does not fit there.
        """
        game = cls(seed)
        game.board = parse_rows(settled)
        game.piece = get_piece(piece)
        game.next_piece = get_piece(next_piece)
        for name, v in (("rot", rot), ("x", x), ("y", y)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{name}={v!r} is not an integer", f"pass {name} as an int")
        if not 0 <= rot <= 3:
            raise ConfigError(f"rotation state {rot} is outside 0-3", "pass rot in 0-3")
        if not fits(game.board, game.piece.states[rot], x, y):
            raise ConfigError(f"{piece} rot {rot} at x={x} y={y} leaves the board or overlaps settled cells",
                              "place the falling piece on empty cells inside the 11x21 board")
        game.rot, game.x, game.y = rot, x, y
        return game

    # ------------------------------------------------------------ queries

    def cells(self) -> list[tuple[int, int]]:
        """Board cells `(col, row)` of the falling piece."""
        return self.piece.cells(self.rot, self.x, self.y)

    def heights(self) -> list[int]:
        """Column heights of the settled cells (11 values, 0-21)."""
        return column_heights(self.board)

    def holes(self) -> int:
        """Empty cells under each column's topmost settled cell, summed."""
        return count_holes(self.board)

    def drop(self) -> int:
        """Rows the falling piece can still fall."""
        return drop_distance(self.board, self.piece.states[self.rot], self.x, self.y)

    def render_rows(self) -> list[str]:
        """The 21 board rows as strings of 11 symbols: `.` empty, `#` settled, `%` falling piece."""
        rows = [_ROW_TEXT[row] for row in self.board]
        if not self.game_over:
            for c, r in self.cells():
                rows[r] = rows[r][:c] + "%" + rows[r][c + 1:]
        return rows

    # ------------------------------------------------------------ the one mutation

    def step(self, action: int) -> StepResult:
        """Apply one action and gravity; lock, clear lines and spawn when the piece comes to rest.

        Args:
            action: 0 soft drop, 1 hard drop, 2 rotate cw, 3 rotate ccw, 4 left, 5 right.

        Returns:
            StepResult.

        Raises:
            InvalidAction: action outside 0-5 (the game is left unchanged).
            TilewiseError: the game is over.
        """
        action = check_action(action)
        if self.game_over:
            raise TilewiseError("the game is over; no more actions can be applied",
                                "check Game.game_over and start a new Game")
        # compute everything first, then commit: a failure never leaves the game half-updated
        rot, x, y, locked = apply_action(self.board, self.piece, self.rot, self.x, self.y, action)
        lines = 0
        if not locked:
            self.rot, self.x, self.y = rot, x, y
            self.steps += 1
            return StepResult(action, False, 0, False)
        board, lines = place(self.board, self.piece.states[rot], x, y)
        cells = tuple(self.piece.cells(rot, x, y))
        before = list(self.board)
        for c, r in cells:
            before[r] |= 1 << c
        cleared = tuple(r for r in range(BOARD_HEIGHT) if before[r] == FULL_ROW)
        locked_name = self.piece.name
        nxt = self.next_piece
        following = get_piece(self._draw())
        self.board = board
        self.lines += lines
        self.pieces += 1
        self.steps += 1
        self.piece, self.next_piece = nxt, following
        self.rot, self.x, self.y = 0, nxt.spawn_x, nxt.spawn_y
        if not fits(self.board, nxt.states[0], self.x, self.y):
            self.game_over = True
        return StepResult(action, True, lines, self.game_over, locked_name, cells, cleared)


def parse_rows(settled: list[str] | list[int]) -> list[int]:
    """Rows as strings (`#` settled; `.` or `%` empty; spaces ignored) or bitmasks -> 21 row bitmasks.

    Raises:
        ConfigError: wrong number of rows or cells, or an unknown symbol.
    """
    if len(settled) != BOARD_HEIGHT:
        raise ConfigError(f"board has {len(settled)} rows, expected {BOARD_HEIGHT}",
                          f"give {BOARD_HEIGHT} rows of {BOARD_WIDTH} cells")
    rows = []
    for r, row in enumerate(settled):
        if isinstance(row, int) and not isinstance(row, bool):
            if not 0 <= row <= FULL_ROW:
                raise ConfigError(f"row {r} bitmask {row} is outside 0..{FULL_ROW}",
                                  f"use {BOARD_WIDTH}-bit row masks")
            rows.append(row)
            continue
        if not isinstance(row, str):
            raise ConfigError(f"row {r} is {type(row).__name__}, not a string or int", "give rows as strings")
        cells = row.replace(" ", "")
        if len(cells) != BOARD_WIDTH:
            raise ConfigError(f"row {r} has {len(cells)} cells, expected {BOARD_WIDTH}: {row!r}",
                              f"give {BOARD_WIDTH} cells per row")
        mask = 0
        for c, ch in enumerate(cells):
            if ch == "#":
                mask |= 1 << c
            elif ch not in ".%":
                raise ConfigError(f"row {r} column {c} has unknown symbol {ch!r}",
                                  "use `.` empty, `#` settled, `%` falling piece")
        rows.append(mask)
    return rows
