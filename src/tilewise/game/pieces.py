"""The polyominoes: all 7 of 4 cells and 7 of the 12 of 5 cells, their rotation states, wall kicks and spawn.

The pentominoes U, W, X, F and Z are left out on purpose: each leaves a hole or an overhang almost wherever
it lands. With all 12 pentominoes in the bag the expert placed 122 pieces per game on average (seeds 0-7,
37 lines); with this set it places 982 of a 1000-piece cap (seeds 0-19, 397 lines). A game a good player
can keep clean makes a better yardstick for a model.

Rotation system (documented in the README, "The game"):

- Every piece has a *pivot*, one of its own cells. A piece's position `(x, y)` is the pivot's column
  (0 = left wall) and row (0 = top row), so both are always on the board.
- State 0 is the spawn orientation below. Rotating clockwise on screen (rows grow downwards) maps a cell
  offset `(dx, dy)` from the pivot to `(-dy, dx)`; counter-clockwise maps it to `(dy, -dx)`. States count
  clockwise turns modulo 4. `O4` is the exception: its four states are the same square (a 2x2 block has no
  cell at its centre to turn about), so rotating it only changes `rot`.
- Wall kicks: if the turned piece overlaps a wall, the floor or a settled cell, the offsets in `KICKS`
  (horizontal only: 0, -1, +1, -2, +2 columns) are tried in order and the first that fits wins; if none
  fits the rotation does nothing. Kicks never move a piece up, so every piece reaches the floor in at most
  21 gravity steps.
- Spawn: state 0, pivot column `5 - (min_dx + max_dx) // 2` (the piece centred on the 11-wide board),
  pivot row the smallest one at which every rotation state fits below the top wall.

The seed's example (`J4 rot:1 x:04 y:12`, cells in rows 11-13 and columns 4-5) follows from J4's state 0
offsets `(-1,-1) (-1,0) (0,0) (1,0)` turned clockwise once about the pivot at column 4, row 12.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewise.errors import ConfigError

BOARD_WIDTH = 11
BOARD_HEIGHT = 21

# horizontal kick offsets tried in order after a rotation collides (columns; never upwards)
KICKS: tuple[int, ...] = (0, -1, 1, -2, 2)


def _parse_shape(art: str) -> tuple[tuple[int, int], ...]:
    """Turn a picture with `#` cells and one `P` (the pivot cell) into offsets `(dx, dy)` from the pivot."""
    cells = []
    pivot = None
    for row, line in enumerate(art.strip("\n").splitlines()):
        for col, ch in enumerate(line):
            if ch in "#P":
                cells.append((col, row))
            if ch == "P":
                pivot = (col, row)
    assert pivot is not None, art
    return tuple(sorted((c - pivot[0], r - pivot[1]) for c, r in cells))


# state-0 pictures; `P` marks the pivot (a cell of the piece). Letters follow the usual tetromino and
# pentomino names (one chirality of each pentomino).
_SHAPES: dict[str, str] = {
    "I4": "#P##",
    "O4": "P#\n##",
    "T4": ".#.\n#P#",
    "S4": ".##\n#P.",
    "Z4": "##.\n.P#",
    "J4": "#..\n#P#",
    "L4": "..#\n#P#",
    "I5": "##P##",
    "L5": "...#\n#P##",
    "P5": ".##\n#P#",
    "N5": "..##\n#P#.",
    "T5": ".#.\n.P.\n###",
    "V5": "#..\n#..\nP##",
    "Y5": ".#..\n#P##",
}

# terminal colours for `tilewise play --watch` (each piece drawn distinctly)
PIECE_COLORS: dict[str, str] = {
    "I4": "cyan", "O4": "yellow", "T4": "magenta", "S4": "green", "Z4": "red", "J4": "blue",
    "L4": "dark_orange", "I5": "bright_cyan", "L5": "orange3", "P5": "orchid", "N5": "spring_green3",
    "T5": "medium_purple", "V5": "deep_sky_blue3", "Y5": "hot_pink",
}


def rotate_cw(cells: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """Offsets after one clockwise turn on screen (rows grow downwards): `(dx, dy) -> (-dy, dx)`."""
    return tuple(sorted((-dy, dx) for dx, dy in cells))


@dataclass(frozen=True)
class Piece:
    """One polyomino type.

    Attributes:
        name: letter + size, e.g. `J4`.
        index: position in `PIECE_NAMES` (stable id).
        states: four tuples of `(dx, dy)` offsets from the pivot, for rotation states 0-3.
        spawn_x: pivot column at spawn.
        spawn_y: pivot row at spawn.
    """

    name: str
    index: int
    states: tuple[tuple[tuple[int, int], ...], ...]
    spawn_x: int
    spawn_y: int

    @property
    def size(self) -> int:
        """Number of cells (4 or 5)."""
        return len(self.states[0])

    def cells(self, rot: int, x: int, y: int) -> list[tuple[int, int]]:
        """Board cells `(col, row)` of this piece in state `rot` with its pivot at column x, row y."""
        return [(x + dx, y + dy) for dx, dy in self.states[rot % 4]]

    def distinct_states(self) -> list[int]:
        """Rotation states with different shapes (first of each), e.g. `[0, 1]` for I4, `[0]` for O4."""
        seen: dict[frozenset[tuple[int, int]], int] = {}
        for rot, cells in enumerate(self.states):
            # shapes equal up to translation are the same placement set
            mx = min(c[0] for c in cells)
            my = min(c[1] for c in cells)
            key = frozenset((c[0] - mx, c[1] - my) for c in cells)
            seen.setdefault(key, rot)
        return sorted(seen.values())


def _build() -> dict[str, Piece]:
    pieces: dict[str, Piece] = {}
    for index, (name, art) in enumerate(_SHAPES.items()):
        s0 = _parse_shape(art)
        if name == "O4":
            states = (s0, s0, s0, s0)
        else:
            s1 = rotate_cw(s0)
            s2 = rotate_cw(s1)
            s3 = rotate_cw(s2)
            states = (s0, s1, s2, s3)
        min_dx = min(dx for dx, _ in s0)
        max_dx = max(dx for dx, _ in s0)
        spawn_x = BOARD_WIDTH // 2 - (min_dx + max_dx) // 2
        spawn_y = max(-dy for st in states for _, dy in st)
        pieces[name] = Piece(name, index, states, spawn_x, spawn_y)
    return pieces


PIECES: dict[str, Piece] = _build()
PIECE_NAMES: tuple[str, ...] = tuple(PIECES)


def get_piece(name: str) -> Piece:
    """Look a piece up by name.

    Args:
        name: letter + size, e.g. `J4` or `I5`.

    Returns:
        The Piece.

    Raises:
        ConfigError: the name is not one of the 14 pieces.
    """
    if not isinstance(name, str) or name not in PIECES:
        raise ConfigError(f"unknown piece name {name!r}",
                          f"use one of {', '.join(PIECE_NAMES)} (letter + number of cells)")
    return PIECES[name]
