"""Engine: moves, rotations, kicks, gravity, locking, line clears, game over, features, bad input."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tilewise.errors import ConfigError, TilewiseError
from tilewise.game.engine import Action, Game, InvalidAction, check_action, parse_rows, place
from tilewise.game.features import column_heights, count_holes, drop_distance, fits
from tilewise.game.pieces import BOARD_HEIGHT, BOARD_WIDTH, KICKS, PIECE_NAMES, PIECES, get_piece

EMPTY = ["." * BOARD_WIDTH] * BOARD_HEIGHT


def snapshot(g: Game) -> tuple:
    return (tuple(g.board), g.piece.name, g.next_piece.name, g.rot, g.x, g.y, g.pieces, g.lines, g.steps,
            g.game_over)


def random_board(rng: np.random.Generator, fill: float = 0.4, top: int = 8) -> np.ndarray:
    """(21, 11) bool board with random cells below row `top` (no full rows)."""
    cells = rng.random((BOARD_HEIGHT, BOARD_WIDTH)) < fill
    cells[:top] = False
    for r in range(BOARD_HEIGHT):
        if cells[r].all():
            cells[r, rng.integers(BOARD_WIDTH)] = False
    return cells


def to_masks(cells: np.ndarray) -> list[int]:
    return [int(sum(1 << c for c in range(BOARD_WIDTH) if cells[r, c])) for r in range(BOARD_HEIGHT)]


# ------------------------------------------------------------------ pieces and rotation system

def _canonical(cells, flips: bool) -> tuple:
    """Smallest normalised cell tuple over the rotations (and mirror images when `flips`)."""
    variants = []
    for flip in (1, -1) if flips else (1,):
        pts = [(flip * dx, dy) for dx, dy in cells]
        for _ in range(4):
            pts = [(-dy, dx) for dx, dy in pts]
            mx, my = min(c[0] for c in pts), min(c[1] for c in pts)
            variants.append(tuple(sorted((a - mx, b - my) for a, b in pts)))
    return min(variants)


def test_pieces_are_4_or_5_cells_distinct_named_and_pivot_is_a_cell():
    for name, p in PIECES.items():
        assert name[0].isalpha() and int(name[1]) == p.size and p.size in (4, 5)
        assert (0, 0) in p.states[0], f"{name}: the pivot must be a cell"
        xs = [dx for dx, _ in p.states[0]]
        ys = [dy for _, dy in p.states[0]]
        assert len(set(p.states[0])) == p.size and max(xs) - min(xs) + max(ys) - min(ys) + 1 <= p.size * 2
    # no two pieces share a shape under rotation (J4/L4 and S4/Z4 are mirror images, as usual)
    assert len({_canonical(p.states[0], flips=False) for p in PIECES.values()}) == len(PIECES)
    # the pentominoes are 7 different free pentominoes
    fives = [p for p in PIECES.values() if p.size == 5]
    assert len({_canonical(p.states[0], flips=True) for p in fives}) == len(fives) == 7
    # every piece is connected (a polyomino)
    for p in PIECES.values():
        cells = set(p.states[0])
        seen, todo = set(), [next(iter(cells))]
        while todo:
            c = todo.pop()
            if c in seen:
                continue
            seen.add(c)
            near = [(c[0] + a, c[1] + b) for a, b in ((1, 0), (-1, 0), (0, 1), (0, -1))]
            todo += [n for n in near if n in cells]
        assert seen == cells, p.name


@pytest.mark.parametrize("name", [n for n in PIECE_NAMES if n != "O4"])
def test_rotation_states_turn_about_the_pivot(name):
    p = get_piece(name)
    for r in range(4):
        expected_cw = sorted((-dy, dx) for dx, dy in p.states[r])
        assert sorted(p.states[(r + 1) % 4]) == expected_cw
    g = Game.from_state(EMPTY, name, 0, 5, 10)
    for expected_rot in (1, 2, 3, 0):
        g.step(Action.ROTATE_CW)
        assert (g.rot, g.x) == (expected_rot, 5)
        assert sorted(g.cells()) == sorted(p.cells(expected_rot, 5, g.y))
    for expected_rot in (3, 2, 1, 0):
        g.step(Action.ROTATE_CCW)
        assert (g.rot, g.x) == (expected_rot, 5)


def test_o4_rotation_keeps_its_cells():
    g = Game.from_state(EMPTY, "O4", 0, 5, 5)
    before = {(c, r - g.y) for c, r in g.cells()}
    g.step(Action.ROTATE_CW)
    assert g.rot == 1 and {(c, r - g.y) for c, r in g.cells()} == before


def test_seed_example_geometry():
    # seed 001: J4 rot 1 x 4 y 12 occupies rows 11-13, columns 4-5
    cells = sorted(get_piece("J4").cells(1, 4, 12))
    assert cells == [(4, 11), (4, 12), (4, 13), (5, 11)]


def test_spawn_every_rotation_fits_on_an_empty_board():
    for p in PIECES.values():
        for r in range(4):
            assert fits([0] * BOARD_HEIGHT, p.states[r], p.spawn_x, p.spawn_y), p.name
        # centred: left and right margins differ by at most one column
        xs = [p.spawn_x + dx for dx, _ in p.states[0]]
        assert abs(min(xs) - (BOARD_WIDTH - 1 - max(xs))) <= 1, p.name


# ------------------------------------------------------------------ moves, gravity, drops

def test_left_right_move_one_column_and_gravity_one_row():
    g = Game.from_state(EMPTY, "T4", 0, 5, 3)
    g.step(Action.LEFT)
    assert (g.x, g.y) == (4, 4)
    g.step(Action.RIGHT)
    g.step(Action.RIGHT)
    assert (g.x, g.y) == (6, 6)


def test_blocked_move_does_nothing_but_gravity_still_applies():
    g = Game.from_state(EMPTY, "I4", 0, 1, 3)  # cells at columns 0..3: the left wall blocks
    g.step(Action.LEFT)
    assert (g.x, g.y) == (1, 4)
    rows = list(EMPTY)
    rows[5] = "....#......"  # a settled cell right of the piece's right end (column 3) at row 5
    g = Game.from_state(rows, "I4", 0, 1, 5)
    g.step(Action.RIGHT)
    assert (g.x, g.y) == (1, 6)


def test_soft_drop_falls_two_rows_hard_drop_lands_and_locks():
    g = Game.from_state(EMPTY, "L4", 0, 5, 3, next_piece="I5")
    g.step(Action.SOFT_DROP)
    assert g.y == 5 and g.pieces == 0
    d = g.drop()
    assert d == BOARD_HEIGHT - 1 - 5
    res = g.step(Action.HARD_DROP)
    assert res.locked and g.pieces == 1
    assert g.board[BOARD_HEIGHT - 1] == 0b111 << 4 and g.board[BOARD_HEIGHT - 2] == 1 << 6
    assert g.piece.name == "I5" and (g.rot, g.x, g.y) == (0, g.piece.spawn_x, g.piece.spawn_y)


def test_piece_locks_when_gravity_cannot_move_it():
    g = Game.from_state(EMPTY, "O4", 0, 5, BOARD_HEIGHT - 3)  # bottom cells on row 19: one row to go
    r1 = g.step(Action.LEFT)
    assert not r1.locked and (g.x, g.y) == (4, BOARD_HEIGHT - 2)  # now resting on the floor
    r2 = g.step(Action.LEFT)  # one more action while resting, then gravity fails: lock
    assert r2.locked and g.pieces == 1
    assert g.board[BOARD_HEIGHT - 1] == 0b11 << 3 and g.board[BOARD_HEIGHT - 2] == 0b11 << 3


def test_soft_drop_on_a_resting_piece_locks_it():
    g = Game.from_state(EMPTY, "O4", 0, 5, BOARD_HEIGHT - 2)
    assert g.drop() == 0
    assert g.step(Action.SOFT_DROP).locked


# ------------------------------------------------------------------ kicks

def test_kick_order_prefers_left_then_right():
    p = get_piece("I4")
    # vertical I4 (state 1) at column 0 turned to state 2 would need columns -2..1: kicks 0, -1 and +1 leave
    # the board, so the first fitting kick in KICKS order is +2
    g = Game.from_state(EMPTY, "I4", 1, 0, 10)
    g.step(Action.ROTATE_CW)
    kick = next(k for k in KICKS if fits([0] * BOARD_HEIGHT, p.states[2], 0 + k, 10))
    assert (g.rot, g.x) == (2, kick) and kick == 2
    # in open space with a blocker on the right only, the left kick (-1) wins over +1
    rows = list(EMPTY)
    rows[10] = ".......#..."  # blocks column 7 on the pivot row
    g = Game.from_state(rows, "I4", 1, 6, 10)  # vertical at column 6; state 2 would span columns 4..7
    g.step(Action.ROTATE_CW)
    assert (g.rot, g.x) == (2, 5)


def test_rotation_without_a_fitting_kick_does_nothing():
    rows = list(EMPTY)
    for r in range(6, 14):
        rows[r] = "####.######"  # a one-wide shaft at column 4
    g = Game.from_state(rows, "I4", 1, 4, 8)
    g.step(Action.ROTATE_CW)
    assert (g.rot, g.x, g.y) == (1, 4, 9)


def test_kicks_never_move_a_piece_up():
    assert all(isinstance(k, int) for k in KICKS)  # horizontal offsets only
    rng = random.Random(5)
    for _ in range(200):
        g = Game(rng.randrange(1000))
        for _ in range(rng.randrange(40)):
            if g.game_over:
                break
            y, pieces = g.y, g.pieces
            g.step(rng.choice([2, 3]))
            assert g.pieces != pieces or g.y >= y


# ------------------------------------------------------------------ line clears

def test_line_clears_remove_full_rows_and_shift_the_rest_down():
    rows = list(EMPTY)
    rows[18] = ".#.#.#.#.#."  # survives, must move down by 2
    rows[19] = "####.######"
    rows[20] = "####.######"
    g = Game.from_state(rows, "I4", 1, 4, 12)  # vertical I4 into the column 4 gap
    res = g.step(Action.HARD_DROP)
    assert res.lines == 2 and g.lines == 2
    assert g.board[20] == 0b01010101010 | (1 << 4)  # row 18 plus the I4's top cell at column 4, now at the bottom
    assert g.board[19] == 1 << 4 and all(r == 0 for r in g.board[:19])


def test_place_clears_exactly_the_full_rows_on_random_boards():
    rng = np.random.default_rng(7)
    for _ in range(100):
        cells = random_board(rng, fill=0.8, top=10)
        board = to_masks(cells)
        name = PIECE_NAMES[rng.integers(len(PIECE_NAMES))]
        p = get_piece(name)
        rot = int(rng.integers(4))
        spots = [(x, y) for x in range(BOARD_WIDTH) for y in range(BOARD_HEIGHT) if fits(board, p.states[rot], x, y)]
        x, y = spots[int(rng.integers(len(spots)))]
        new, lines = place(board, p.states[rot], x, y)
        full = cells.copy()
        for c, r in p.cells(rot, x, y):
            full[r, c] = True
        kept = [r for r in range(BOARD_HEIGHT) if not full[r].all()]
        assert lines == BOARD_HEIGHT - len(kept)
        assert new == [0] * lines + [to_masks(full)[r] for r in kept]


# ------------------------------------------------------------------ game over, determinism, bag

def test_game_over_when_the_next_piece_cannot_spawn():
    rows = list(EMPTY)
    for r in range(3, BOARD_HEIGHT):
        rows[r] = "##########." if r % 2 else ".##########"
    g = Game.from_state(rows, "O4", 0, 5, 0, next_piece="T4")
    res = g.step(Action.HARD_DROP)
    assert res.game_over and g.game_over
    before = snapshot(g)
    with pytest.raises(TilewiseError, match="game is over"):
        g.step(Action.LEFT)
    assert snapshot(g) == before


def test_same_seed_same_game_different_seed_different_pieces():
    def run(seed: int) -> list:
        g = Game(seed)
        rng = random.Random(99)
        trace = []
        while not g.game_over and g.steps < 400:
            g.step(rng.randrange(6))
            trace.append(snapshot(g))
        return trace

    assert run(3) == run(3)
    seqs = set()
    for seed in range(5):
        g = Game(seed)
        seqs.add((g.piece.name, g.next_piece.name, *g._bag))
    assert len(seqs) == 5


def test_bag_deals_every_piece_once_per_round():
    g = Game(11)
    names = [g.piece.name, g.next_piece.name]
    for _ in range(40):
        names.append(g._draw())
    n = len(PIECE_NAMES)
    for k in range(3):
        assert sorted(names[k * n:(k + 1) * n]) == sorted(PIECE_NAMES)


# ------------------------------------------------------------------ features on hand-built and random boards

def test_features_seed_example():
    rows = ["." * 11] * 17 + ["....##.....", ".....##....", "......###..", ".......#..."]
    g = Game.from_state(rows, "J4", 1, 4, 12, "I5")
    assert g.heights() == [0, 0, 0, 0, 4, 4, 3, 2, 2, 0, 0]
    assert g.holes() == 7
    assert g.drop() == 3


def test_features_match_a_plain_reference_on_random_boards():
    rng = np.random.default_rng(1)
    for _ in range(200):
        cells = random_board(rng, fill=float(rng.uniform(0.1, 0.7)), top=int(rng.integers(0, 15)))
        board = to_masks(cells)
        heights = []
        holes = 0
        for c in range(BOARD_WIDTH):
            filled = np.flatnonzero(cells[:, c])
            if filled.size:
                top = int(filled[0])
                heights.append(BOARD_HEIGHT - top)
                holes += int((~cells[top:, c]).sum())
            else:
                heights.append(0)
        assert column_heights(board) == heights
        assert count_holes(board) == holes
        p = get_piece(PIECE_NAMES[rng.integers(len(PIECE_NAMES))])
        rot = int(rng.integers(4))
        spots = [(x, y) for x in range(BOARD_WIDTH) for y in range(BOARD_HEIGHT) if fits(board, p.states[rot], x, y)]
        if not spots:
            continue
        x, y = spots[int(rng.integers(len(spots)))]
        d = 0
        while all(r + d + 1 < BOARD_HEIGHT and not cells[r + d + 1, c] for c, r in p.cells(rot, x, y)):
            d += 1
        assert drop_distance(board, p.states[rot], x, y) == d


def test_fits_and_drop_match_a_cell_by_cell_reference_everywhere():
    """Every piece and rotation at every pivot, off the board too, on random boards: `fits` is the plain per-cell test
    and `drop_distance` the count of rows it still fits below (0 where it does not fit one row down)."""

    def fits_ref(board, cells, x, y):
        return all(0 <= x + dx < BOARD_WIDTH and 0 <= y + dy < BOARD_HEIGHT and not (board[y + dy] >> (x + dx)) & 1
                   for dx, dy in cells)

    def drop_ref(board, cells, x, y):
        d = 0
        while fits_ref(board, cells, x, y + d + 1):
            d += 1
        return d

    rng = np.random.default_rng(7)
    for _ in range(12):
        board = to_masks(random_board(rng, fill=float(rng.uniform(0.1, 0.7)), top=int(rng.integers(0, 18))))
        for name in PIECE_NAMES:
            for cells in get_piece(name).states:
                for x in range(-3, BOARD_WIDTH + 3):
                    for y in range(-3, BOARD_HEIGHT + 3):
                        assert fits(board, cells, x, y) == fits_ref(board, cells, x, y), (name, cells, x, y)
                        assert drop_distance(board, cells, x, y) == drop_ref(board, cells, x, y), (name, x, y)


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("bad", [6, 7, -1, 8, 100, 1.0, "2", None, True])
def test_invalid_actions_raise_and_leave_the_game_unchanged(bad):
    g = Game(4)
    for a in (2, 4, 4):
        g.step(a)
    before = snapshot(g)
    with pytest.raises(InvalidAction) as info:
        g.step(bad)
    assert "0-5" in str(info.value)
    assert snapshot(g) == before
    if bad in (6, 7) and not isinstance(bad, bool):
        assert "reserved" in str(info.value)


def test_numpy_integer_actions_are_accepted():
    assert check_action(np.int64(5)) == 5


@pytest.mark.parametrize("seed", ["3", 1.5, True, None, -1])
def test_seed_must_be_a_non_negative_integer(seed):
    with pytest.raises(ConfigError, match="seed"):
        Game(seed)


def test_unknown_piece_names_are_refused():
    with pytest.raises(ConfigError, match="unknown piece name 'Q4'") as info:
        get_piece("Q4")
    assert "J4" in info.value.fix
    with pytest.raises(ConfigError, match="unknown piece"):
        Game.from_state(EMPTY, "X9", 0, 5, 5)
    with pytest.raises(ConfigError, match="unknown piece"):
        Game.from_state(EMPTY, "J4", 0, 5, 5, next_piece="j4")


@pytest.mark.parametrize("rows, match", [
    (["." * 11] * 20, "20 rows"),
    (["." * 11] * 20 + ["." * 10], "10 cells"),
    (["." * 11] * 20 + ["....x......"], "unknown symbol 'x'"),
    (["." * 11] * 20 + [1 << 11], "outside"),
])
def test_malformed_boards_are_refused(rows, match):
    with pytest.raises(ConfigError, match=match):
        parse_rows(rows)


def test_from_state_refuses_a_piece_that_does_not_fit():
    rows = list(EMPTY)
    rows[12] = "....#......"
    with pytest.raises(ConfigError, match="overlaps"):
        Game.from_state(rows, "J4", 1, 4, 12)
    with pytest.raises(ConfigError, match="outside 0-3"):
        Game.from_state(EMPTY, "J4", 4, 4, 12)
    with pytest.raises(ConfigError, match="leaves the board"):
        Game.from_state(EMPTY, "I5", 0, 0, 12)


def test_step_result_reports_the_lock():
    rows = list(EMPTY)
    rows[19] = "####.######"
    rows[20] = "####.######"
    g = Game.from_state(rows, "I4", 1, 4, 3)
    res = g.step(Action.HARD_DROP)
    assert res.piece == "I4" and sorted(res.cells) == [(4, 17), (4, 18), (4, 19), (4, 20)]
    assert res.cleared_rows == (19, 20) and res.lines == 2
    res = g.step(Action.LEFT)
    assert not res.locked and res.cells == () and res.piece == ""


@pytest.mark.parametrize("seed", [0, 7, 123])
def test_render_rows_shows_every_settled_cell_and_the_falling_piece(seed):
    """The table-driven rows against the board read cell by cell, over random play to a game over."""
    rng = random.Random(seed)
    game, checked = Game(seed), 0
    while checked < 400:
        want = [["#" if (row >> c) & 1 else "." for c in range(BOARD_WIDTH)] for row in game.board]
        if not game.game_over:
            for c, r in game.cells():
                want[r][c] = "%"
        assert game.render_rows() == ["".join(w) for w in want]
        checked += 1
        if game.game_over:
            game = Game(rng.randrange(1000))
        else:
            game.step(rng.randrange(6))
