"""Expert: reachable placements, fixed action order, determinism, and a wide margin over random play."""

from __future__ import annotations

import random

import numpy as np

from tilewise.game.engine import Action, Game
from tilewise.game.expert import Expert, action_toward, best_target, evaluate, placements
from tilewise.game.pieces import BOARD_HEIGHT, BOARD_WIDTH, PIECE_NAMES, get_piece
from tilewise.game.play import ExpertPolicy, RandomPolicy, evaluate_policy

EMPTY = [0] * BOARD_HEIGHT


def test_every_column_of_every_state_is_reachable_on_an_empty_board():
    for name in PIECE_NAMES:
        p = get_piece(name)
        found = {(pl.rot, pl.x) for pl in placements(EMPTY, p)}
        expected = set()
        for rot in p.distinct_states():
            dxs = [dx for dx, _ in p.states[rot]]
            expected |= {(rot, x) for x in range(-min(dxs), BOARD_WIDTH - max(dxs))}
        assert found == expected, name
        for pl in placements(EMPTY, p):  # every landing rests on the floor
            assert max(pl.y + dy for _, dy in p.states[pl.rot]) == BOARD_HEIGHT - 1


def test_blocked_columns_are_not_offered():
    # a wall that starts below the spawn can be passed over (and landed on): see the rows-3-down case
    board = list(EMPTY)
    for r in range(3, BOARD_HEIGHT):
        board[r] = 1 << 3
    over = [pl for pl in placements(board, get_piece("T4")) if pl.rot == 0 and pl.x <= 4]
    assert over and all(pl.y <= 2 for pl in over)  # resting on top of the wall, not inside it
    board = list(EMPTY)
    for r in range(BOARD_HEIGHT):
        board[r] = 1 << 3  # a wall in column 3, top to bottom: the spawn at columns 4..6 cannot pass it
    p = get_piece("T4")
    xs = {pl.x for pl in placements(board, p) if pl.rot == 0}
    assert xs == set(range(5, BOARD_WIDTH - 1))  # T4 state 0 spans x-1..x+1: right of column 3 only


def test_following_the_expert_lands_where_it_planned():
    rng = random.Random(2)
    checked = 0
    for seed in range(12):
        g = Game(seed)
        ex = Expert()
        for _ in range(rng.randrange(0, 40)):  # reach a varied board
            if g.game_over:
                break
            g.step(ex.act(g))
        if g.game_over:
            continue
        # wait for a fresh piece
        while g.y != g.piece.spawn_y or g.rot != 0 or g.x != g.piece.spawn_x:
            g.step(ex.act(g))
        plan = {(pl.rot, pl.x): pl for pl in placements(g.board, g.piece)}
        target = best_target(g.board, g.piece)
        assert target in plan
        piece = g.piece
        pieces = g.pieces
        board_before = list(g.board)
        while g.pieces == pieces:
            g.step(ex.act(g))
        expected = list(board_before)
        for c, r in piece.cells(target[0], target[1], plan[target].y):
            expected[r] |= 1 << c
        full = [r for r in expected if r == (1 << BOARD_WIDTH) - 1]
        expected = [0] * len(full) + [r for r in expected if r != (1 << BOARD_WIDTH) - 1]
        assert g.board == expected
        checked += 1
    assert checked >= 8


def test_action_order_rotations_then_moves_one_way_then_hard_drop():
    g = Game(21)
    ex = Expert()
    per_piece: list[int] = []
    pieces = 0
    while g.pieces < 60 and not g.game_over:
        a = ex.act(g)
        per_piece.append(a)
        g.step(a)
        if g.pieces != pieces:
            pieces = g.pieces
            assert Action.SOFT_DROP not in per_piece
            rots = [x for x in per_piece if x in (Action.ROTATE_CW, Action.ROTATE_CCW)]
            moves = [x for x in per_piece if x in (Action.LEFT, Action.RIGHT)]
            assert per_piece == [*rots, *moves, Action.HARD_DROP] or per_piece[-1] != Action.HARD_DROP
            assert len(set(rots)) <= 1 and len(set(moves)) <= 1 and len(rots) <= 2
            per_piece = []


def test_action_toward():
    assert action_toward((1, 5), 0, 5) == Action.ROTATE_CW
    assert action_toward((2, 5), 0, 5) == Action.ROTATE_CW
    assert action_toward((3, 5), 0, 5) == Action.ROTATE_CCW
    assert action_toward((0, 5), 3, 5) == Action.ROTATE_CW
    assert action_toward((0, 2), 0, 5) == Action.LEFT
    assert action_toward((0, 8), 0, 5) == Action.RIGHT
    assert action_toward((0, 5), 0, 5) == Action.HARD_DROP
    assert action_toward(None, 0, 5) == Action.HARD_DROP


def test_the_expert_is_a_function_of_the_visible_position():
    # same settled board + piece + rot/x: same action, whatever the cache, the seed or the preview
    g = Game(5)
    ex = Expert()
    for _ in range(120):
        g.step(ex.act(g))
    rows = ["".join("#" if (r >> c) & 1 else "." for c in range(BOARD_WIDTH)) for r in g.board]
    a = ex.act(g)
    for next_piece, seed in (("I5", 0), ("O4", 9)):
        other = Game.from_state(rows, g.piece.name, g.rot, g.x, g.y, next_piece=next_piece, seed=seed)
        assert Expert().act(other) == a


def test_evaluation_prefers_clean_boards():
    rng = np.random.default_rng(3)
    for _ in range(30):
        # a flat random stack vs the same stack with one covered hole: the hole must score lower
        h = int(rng.integers(2, 8))
        flat = [0] * (BOARD_HEIGHT - h) + [(1 << BOARD_WIDTH) - 1 - (1 << int(rng.integers(BOARD_WIDTH)))] * h
        holed = list(flat)
        r = BOARD_HEIGHT - 1
        holed[r] &= ~(1 << 5) if holed[r] & (1 << 5) else holed[r] & ~(1 << 6)
        assert evaluate(holed, 0, 0, 3.0) < evaluate(flat, 0, 0, 3.0)
        # clearing lines with more piece cells scores higher, landing higher scores lower
        assert evaluate(flat, 2, 4, 3.0) > evaluate(flat, 1, 4, 3.0) > evaluate(flat, 1, 4, 6.0)


def test_expert_fills_an_obvious_slot():
    # bottom row full except columns 4-7: a flat I4 must go there and clear it
    board = list(EMPTY)
    board[BOARD_HEIGHT - 1] = ((1 << BOARD_WIDTH) - 1) & ~(0b1111 << 4)
    p = get_piece("I4")
    rot, x = best_target(board, p)
    assert rot == 0 and [x + dx for dx, _ in p.states[0]] == [4, 5, 6, 7]


def test_expert_beats_random_by_a_wide_margin():
    expert = evaluate_policy(lambda s: ExpertPolicy(), games=4, max_pieces=120, seed=100)
    rand = evaluate_policy(lambda s: RandomPolicy(s), games=4, max_pieces=120, seed=100)
    assert expert["mean_pieces"] >= 5 * rand["mean_pieces"]
    assert expert["mean_lines"] >= 30 and expert["mean_lines"] > 10 * max(rand["mean_lines"], 1.0)
    assert expert["games_at_cap"] >= 3
