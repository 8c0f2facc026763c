"""The expert player: a one-piece placement search with a fixed board evaluation, then a fixed action order.

What it does, so that a small model can imitate it:

1. When a piece appears, the expert tries every distinct rotation state and every pivot column. For each
   target `(rot, x)` it simulates, with the engine's own step function (gravity included), the one action
   sequence it would play from the spawn position: rotate (clockwise for +1 and +2 turns, counter-clockwise
   for +3) until `rot` is reached, then move left or right until `x` is reached, then hard drop. Targets
   that this sequence does not reach (blocked, or the piece locks on the way) are skipped.
2. Each landing is scored on the board after the lock and line clears with Pierre Dellacherie's features
   and the El-Tetris weights (landing height, eroded piece cells, row and column transitions, holes, well
   depth sums). The best score wins; ties go to the lower rotation state, then the lower column.
3. Its action in any position is a pure function of what the prompt shows: the target depends only on the
   settled board and the falling piece's name (the preview is not used), and the action is "rotate toward
   the target state, else move toward the target column, else hard drop". It never soft drops.

With no reachable target (a nearly full board) it hard drops.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewise.game.engine import Action, Game, apply_action
from tilewise.game.features import FULL_ROW, count_holes, drop_distance
from tilewise.game.pieces import BOARD_HEIGHT, BOARD_WIDTH, Piece

# El-Tetris weights (Islam El-Ashi, 2011) for Dellacherie's features; higher score is better
W_LANDING = -4.500158825082766
W_ERODED = 3.4181268101392694
W_ROW_TRANS = -3.2178882868487753
W_COL_TRANS = -9.348695305445199
W_HOLES = -7.899265427351652
W_WELLS = -3.3855972247263626

WEIGHTS = (W_LANDING, W_ERODED, W_ROW_TRANS, W_COL_TRANS, W_HOLES, W_WELLS)

_WALLS = 1 | (1 << (BOARD_WIDTH + 1))  # the side walls around a row shifted left by one
_ROW_PAIRS = (1 << (BOARD_WIDTH + 1)) - 1
_RIGHT_WALL = 1 << (BOARD_WIDTH - 1)


def evaluate(board: list[int], lines: int, eroded_cells: int, landing_height: float,
             weights: tuple[float, ...] | None = None) -> float:
    """Dellacherie/El-Tetris score of a board after a placement (higher is better).

    Args:
        board: row bitmasks after the lock and line clears.
        lines: rows the placement cleared.
        eroded_cells: cells of the placed piece inside those rows.
        landing_height: mean height above the floor of the piece's cells where it landed.
        weights: (landing, eroded, row transitions, column transitions, holes, wells); default `WEIGHTS`.

    Returns:
        The weighted sum.
    """
    row_trans = 0
    col_trans = 0
    wells = 0
    prev = 0  # above the top row counts as empty
    runs: list[int] = []  # runs[k]: columns whose well run covers the last k+1 rows
    for row in board:
        w = (row << 1) | _WALLS
        row_trans += ((w ^ (w >> 1)) & _ROW_PAIRS).bit_count()
        col_trans += (row ^ prev).bit_count()
        prev = row
        well = ~row & ((row << 1) | 1) & ((row >> 1) | _RIGHT_WALL) & FULL_ROW
        if well:
            new_runs = [well]
            for r in runs:
                r &= well
                if not r:
                    break
                new_runs.append(r)
            runs = new_runs
            for r in runs:  # a cell at depth k of its well adds k
                wells += r.bit_count()
        else:
            runs = []
    col_trans += (~prev & FULL_ROW).bit_count()  # the floor counts as filled
    w_land, w_eroded, w_row, w_col, w_holes, w_wells = WEIGHTS if weights is None else weights
    return (w_land * landing_height + w_eroded * lines * eroded_cells + w_row * row_trans
            + w_col * col_trans + w_holes * count_holes(board) + w_wells * wells)


def action_toward(target: tuple[int, int] | None, rot: int, x: int) -> int:
    """The expert's fixed action order: rotate toward the target state, then move to its column, then drop."""
    if target is None:
        return Action.HARD_DROP
    t_rot, t_x = target
    if rot != t_rot:
        return Action.ROTATE_CCW if (t_rot - rot) % 4 == 3 else Action.ROTATE_CW
    if x < t_x:
        return Action.RIGHT
    if x > t_x:
        return Action.LEFT
    return Action.HARD_DROP


@dataclass(frozen=True)
class Placement:
    """One reachable landing: target state and column, where it locks, and its score."""

    rot: int
    x: int
    y: int
    score: float


def _score_landing(board: list[int], piece: Piece, rot: int, x: int, y: int,
                   weights: tuple[float, ...] | None = None) -> float:
    cells = piece.states[rot]
    rows = list(board)
    for dx, dy in cells:
        rows[y + dy] |= 1 << (x + dx)
    full = {r for r in range(BOARD_HEIGHT) if rows[r] == FULL_ROW}
    eroded = sum(1 for _, dy in cells if y + dy in full)
    if full:
        kept = [r for r in rows if r != FULL_ROW]
        rows = [0] * len(full) + kept
    landing = sum(BOARD_HEIGHT - (y + dy) - 0.5 for _, dy in cells) / len(cells)
    return evaluate(rows, len(full), eroded, landing, weights)


def placements(board: list[int], piece: Piece, weights: tuple[float, ...] | None = None) -> list[Placement]:
    """Every landing the expert's action order reaches from the spawn position, with its score.

    Args:
        board: settled row bitmasks.
        piece: the piece that just spawned (rot 0 at its spawn position).

    Returns:
        Placements in a fixed order (rotation state, then the order the column sweep reaches them).
    """
    found: list[Placement] = []
    limit = 4 * BOARD_HEIGHT  # every step falls a row or locks, so this is never reached
    for t_rot in piece.distinct_states():
        rot, x, y = 0, piece.spawn_x, piece.spawn_y
        locked = False
        steps = 0
        while rot != t_rot and not locked and steps < limit:
            rot, x, y, locked = apply_action(board, piece, rot, x, y, action_toward((t_rot, x), rot, x))
            steps += 1
        if locked:
            if rot == t_rot:  # it came to rest just as the rotation finished
                found.append(Placement(rot, x, y, _score_landing(board, piece, rot, x, y, weights)))
            continue
        cells = piece.states[rot]
        land_y = y + drop_distance(board, cells, x, y)
        found.append(Placement(rot, x, land_y, _score_landing(board, piece, rot, x, land_y, weights)))  # drop now
        # pivot columns at which the piece touches the left and the right wall
        sweeps = ((Action.LEFT, -min(d for d, _ in cells)), (Action.RIGHT, BOARD_WIDTH - 1 - max(d for d, _ in cells)))
        for move, wall_x in sweeps:
            cx, cy = x, y
            locked = False
            # the policy pushes the same way every step until it reaches its column, so one trajectory
            # visits every target column on this side: the first time it stands in a column is that target's
            while not locked and cx != wall_x:
                _, nx, ny, locked = apply_action(board, piece, rot, cx, cy, move)
                if nx != cx:
                    land_y = ny if locked else ny + drop_distance(board, cells, nx, ny)
                    found.append(Placement(rot, nx, land_y, _score_landing(board, piece, rot, nx, land_y, weights)))
                cx, cy = nx, ny
    return found


def best_target(board: list[int], piece: Piece, weights: tuple[float, ...] | None = None) -> tuple[int, int] | None:
    """The expert's target `(rot, x)` for a piece at spawn on this board (None: nothing reachable)."""
    best: Placement | None = None
    for p in placements(board, piece, weights):
        # strict comparison keeps the first of equal scores; the key orders ties by rot, then x
        if best is None or p.score > best.score or (p.score == best.score and (p.rot, p.x) < (best.rot, best.x)):
            best = p
    return None if best is None else (best.rot, best.x)


class Expert:
    """The expert policy. `expert(game)` or `expert.act(game)` returns an action id 0-5.

    Targets are cached per (settled board, piece name); the cache is bounded.
    """

    def __init__(self, weights: tuple[float, ...] | None = None, cache_size: int = 4096) -> None:
        self.weights = WEIGHTS if weights is None else tuple(weights)
        self._cache: dict[tuple[tuple[int, ...], str], tuple[int, int] | None] = {}
        self._cache_size = cache_size

    def target(self, board: list[int], piece: Piece) -> tuple[int, int] | None:
        """The target `(rot, x)` for this board and piece (from the spawn position)."""
        key = (tuple(board), piece.name)
        hit = self._cache.get(key, False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        target = best_target(board, piece, self.weights)
        self._cache[key] = target
        return target

    def act(self, game: Game) -> int:
        """The expert's action for the game's current position.

        Args:
            game: a Game that is not over.

        Returns:
            An action id 0-5.
        """
        return int(action_toward(self.target(game.board, game.piece), game.rot, game.x))

    __call__ = act
