"""tilewise.game: the polyomino game the classifier plays (seed 001).

Engine (`Game`), pieces and rotation system, prompt rendering and parsing, the shipped tokenizer, the
expert player, the training dataset and the play loop. The README section "The game" documents it.
"""

from __future__ import annotations

from tilewise.game.engine import ACTION_NAMES, Action, Game, InvalidAction, StepResult
from tilewise.game.expert import Expert
from tilewise.game.pieces import BOARD_HEIGHT, BOARD_WIDTH, PIECE_NAMES, PIECES, Piece, get_piece
from tilewise.game.prompt import ParsedPrompt, parse_prompt, render_prompt
from tilewise.game.tokenizer import encode_prompt, load_tokenizer, shared_prefix_length

__all__ = [
    "ACTION_NAMES",
    "BOARD_HEIGHT",
    "BOARD_WIDTH",
    "PIECES",
    "PIECE_NAMES",
    "Action",
    "Expert",
    "Game",
    "InvalidAction",
    "ParsedPrompt",
    "Piece",
    "StepResult",
    "encode_prompt",
    "get_piece",
    "load_tokenizer",
    "parse_prompt",
    "render_prompt",
    "shared_prefix_length",
]
