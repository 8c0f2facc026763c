"""The play loop: a policy (model, expert or random) plays one seeded game; stats at the end.

The model policy renders the prompt, tokenizes it, and runs the classifier with prefix caching: the shared
prefix (42 tokens with the shipped tokenizer: everything up to `<board>\\n`) is prefilled once, and every
decision extends that cached state with the remaining tokens (`model.extend` never changes the state it is
given, so each decision branches off the same base). The action is the argmax of the first 6 of the 8 scores.

Timing: a decision's latency is the wall time from rendering its prompt to having its action (prompt,
tokenizer and model included, the game step and drawing excluded), measured with `time.perf_counter`; the model
policy also reports the median of each part (`prompt_ms_p50`: render + tokenize; `model_ms_p50`: the model); no
sleeping or polling is involved. `decisions_per_s` is decisions divided by the summed latencies, and `apm`
(actions per minute) is 60 times that: one decision is one action.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from tilewise.errors import ConfigError, TilewiseError
from tilewise.game.engine import ACTION_NAMES, NUM_OUTPUTS, Game, StepResult, check_seed
from tilewise.game.expert import Expert
from tilewise.game.prompt import render_prompt

POLICIES = ("model", "expert", "random")


class Policy(Protocol):
    """Something that picks an action id 0-5 for a game position."""

    name: str
    device: str

    def decide(self, game: Game) -> int:
        """The action for the game's current position."""
        ...


class ExpertPolicy:
    """The expert (search + fixed action order), on the host CPU."""

    name = "expert"
    device = "cpu"

    def __init__(self) -> None:
        self._expert = Expert()

    def decide(self, game: Game) -> int:
        """The expert's action."""
        return self._expert.act(game)


class RandomPolicy:
    """Uniformly random actions 0-5 from a seeded stream."""

    name = "random"
    device = "cpu"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(check_seed(seed))

    def decide(self, game: Game) -> int:
        """A random action."""
        return self._rng.randrange(6)


class ModelPolicy:
    """A classifier: prompt -> token ids -> cached prefix + extend -> argmax of scores[0:6].

    Args:
        model: an object with `prefill(ids) -> state`, `extend(state, ids) -> state` (must not change the
            state it is given), `scores(state) -> (8,) array`, and optionally `tokenizer` and `device`.
        tokenizer: a `tokenizers.Tokenizer`; default: `model.tokenizer`, else the game's shipped tokenizer.
    """

    name = "model"

    def __init__(self, model: Any, tokenizer: Any = None) -> None:
        from tilewise.game.tokenizer import (
            PromptEncoder,
            check_special_tokens,
            example_prompt,
            load_tokenizer,
            shared_prefix_length,
        )

        for attr in ("prefill", "extend", "scores"):
            if not callable(getattr(model, attr, None)):
                raise ConfigError(f"the model object has no {attr}() method",
                                  "load the model with tilewise.load(...)")
        self.model = model
        tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        if tok is None:
            tok = load_tokenizer()
        else:
            check_special_tokens(tok, source="the model's tokenizer")
        self.tokenizer = tok
        self._encode = PromptEncoder(tok)
        self.device = str(getattr(model, "device", None) or "unknown")
        self.prefix_tokens = shared_prefix_length(tok)
        self.prefix_ids = self._encode(example_prompt())[: self.prefix_tokens]
        self.prefix_state = model.prefill(self.prefix_ids)
        self.full_prefills = 0  # decisions whose ids did not start with the cached prefix (should stay 0)
        self.last_scores: np.ndarray | None = None
        self.prompt_tokens = 0
        #: the last decision's (prompt, model) milliseconds: rendering + tokenizing, then the model's extend + scores
        self.last_split_ms: tuple[float, float] = (0.0, 0.0)

    def decide(self, game: Game) -> int:
        """Score the current prompt and return argmax of the first 6 scores."""
        t0 = time.perf_counter()
        ids = self._encode(render_prompt(game))
        t1 = time.perf_counter()
        self.prompt_tokens = len(ids)
        p = self.prefix_tokens
        if ids[:p] == self.prefix_ids:
            state = self.model.extend(self.prefix_state, ids[p:])
        else:
            self.full_prefills += 1
            state = self.model.prefill(ids)
        scores = np.asarray(self.model.scores(state), dtype=np.float64).reshape(-1)
        self.last_split_ms = ((t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3)
        if scores.shape != (NUM_OUTPUTS,):
            raise TilewiseError(f"the model returned {scores.size} scores, expected {NUM_OUTPUTS}",
                                "use a classifier with an 8-output head (6 actions + 2 reserved)")
        if not np.all(np.isfinite(scores[:6])):
            raise TilewiseError(f"the model returned non-finite scores {scores.tolist()}",
                                "check the model's weights and the device's results (tilewise bench)")
        self.last_scores = scores
        return int(np.argmax(scores[:6]))


def load_model_policy(model: str = "default", device: str = "auto") -> ModelPolicy:
    """Load the classifier through the public model API and wrap it as a policy.

    Args:
        model: `default` (the bundled model), a preset, or a model folder / checkpoint path.
        device: auto, cpu, webgpu or cuda.

    Returns:
        ModelPolicy.

    Raises:
        TilewiseError: the model is missing or cannot run on the device (the message suggests `--policy expert`).
    """
    from tilewise.model.runtime import load

    fix = "play with --policy expert (or --policy random) meanwhile"

    try:
        loaded = load(model, device=device, weights="nf4")
    except TilewiseError as exc:
        problem = f"cannot load model {model!r} for --policy model: {exc.problem}"
        both = f"{exc.fix}; or {fix}" if exc.fix else fix
        try:
            err = type(exc)(problem, both)  # keep the subclass (DeviceUnavailable, ConfigError, ...)
        except TypeError:
            err = TilewiseError(problem, both)
        raise err from None
    except FileNotFoundError as exc:
        raise TilewiseError(f"cannot load model {model!r}: {exc}", fix) from None
    return ModelPolicy(loaded)


@dataclass
class PlayStats:
    """What `tilewise play` reports (the `--json` object)."""

    policy: str
    device: str
    steps: int
    pieces: int
    lines: int
    decisions_per_s: float
    apm: float
    latency_ms_p50: float
    latency_ms_p90: float
    latency_ms_mean: float
    game_over: bool
    seed: int
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Flat dict (extra keys merged in)."""
        d = asdict(self)
        extra = d.pop("extra")
        d.update(extra)
        return d


def play(policy: Policy, steps: int = 500, seed: int = 0,
         on_step: Callable[[Game, StepResult, float], None] | None = None,
         compare_expert: bool | None = None) -> PlayStats:
    """Play one game until `steps` decisions or game over.

    Args:
        policy: the player.
        steps: the most decisions to make (>= 1).
        seed: the game's seed (non-negative int).
        on_step: called after each step with (game, step result, latency_ms), e.g. to draw the board.
        compare_expert: also ask the expert in every position and report the share of decisions that agree
            (`expert_agreement`; outside the timed window). Default: on for the model policy.

    Returns:
        PlayStats.
    """
    seed = check_seed(seed)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps={steps!r} is not a positive integer", "pass --steps 1 or more")
    if compare_expert is None:
        compare_expert = isinstance(policy, ModelPolicy)
    expert = Expert() if compare_expert else None
    agree = 0
    game = Game(seed)
    latencies_ms: list[float] = []
    splits_ms: list[tuple[float, float]] = []  # the model policy's (prompt, model) part of each decision
    split = isinstance(policy, ModelPolicy)
    actions = [0] * 6
    t_start = time.perf_counter()
    while not game.game_over and len(latencies_ms) < steps:
        t0 = time.perf_counter()
        action = policy.decide(game)
        latencies_ms.append((time.perf_counter() - t0) * 1e3)
        if split:
            splits_ms.append(policy.last_split_ms)  # type: ignore[union-attr]
        if expert is not None:
            agree += int(expert.act(game) == action)
        result = game.step(action)  # refuses anything outside 0-5 with a clear error
        actions[action] += 1
        if on_step is not None:
            on_step(game, result, latencies_ms[-1])
    wall_s = time.perf_counter() - t_start
    lat = np.array(latencies_ms)
    total_s = float(lat.sum()) / 1e3
    dps = len(lat) / total_s if total_s > 0 else float("inf")
    extra: dict[str, Any] = {"actions": dict(zip(ACTION_NAMES, actions))}
    if expert is not None:
        extra["expert_agreement"] = round(agree / len(lat), 4)
    if isinstance(policy, ModelPolicy):
        prompt_ms, model_ms = np.array(splits_ms).T
        extra.update(prompt_tokens=policy.prompt_tokens, prefix_tokens=policy.prefix_tokens,
                     full_prefills=policy.full_prefills, prompt_ms_p50=round(float(np.median(prompt_ms)), 4),
                     model_ms_p50=round(float(np.median(model_ms)), 4))
    return PlayStats(
        policy=policy.name, device=policy.device, steps=len(lat), pieces=game.pieces, lines=game.lines,
        decisions_per_s=round(dps, 3), apm=round(60.0 * dps, 1),
        latency_ms_p50=round(float(np.percentile(lat, 50)), 4), latency_ms_p90=round(float(np.percentile(lat, 90)), 4),
        latency_ms_mean=round(float(lat.mean()), 4), game_over=game.game_over, seed=seed, wall_s=round(wall_s, 3),
        extra=extra,
    )


def make_policy(name: str, model: str = "default", device: str = "auto", seed: int = 0) -> Policy:
    """Build a policy by name (`model`, `expert`, `random`)."""
    if name == "expert":
        return ExpertPolicy()
    if name == "random":
        return RandomPolicy(seed)
    if name == "model":
        return load_model_policy(model, device)  # the device resolver checks the name
    raise ConfigError(f"unknown policy {name!r}", f"use one of {', '.join(POLICIES)}")


# ---------------------------------------------------------------- evaluation over seeded games

def evaluate_policy(make: Callable[[int], Policy], games: int = 20, max_pieces: int = 1000, seed: int = 0,
                    max_steps: int = 100_000) -> dict[str, Any]:
    """Mean lines and pieces of a policy over seeded games (game g uses engine seed `seed + g`).

    Args:
        make: builds a fresh policy for a game seed.
        games: number of games.
        max_pieces: a game stops after this many pieces.
        seed: first game seed.
        max_steps: a game also stops after this many decisions.

    Returns:
        dict with per-game pieces/lines and their means.
    """
    per_game = []
    for g in range(games):
        game = Game(seed + g)
        policy = make(seed + g)
        steps = 0
        while not game.game_over and game.pieces < max_pieces and steps < max_steps:
            game.step(policy.decide(game))
            steps += 1
        per_game.append({"seed": seed + g, "pieces": game.pieces, "lines": game.lines, "steps": steps,
                         "game_over": game.game_over})
    pieces = np.array([r["pieces"] for r in per_game], dtype=np.float64)
    lines = np.array([r["lines"] for r in per_game], dtype=np.float64)
    return {"games": games, "max_pieces": max_pieces, "seed": seed,
            "mean_pieces": float(pieces.mean()), "mean_lines": float(lines.mean()),
            "min_pieces": int(pieces.min()), "games_at_cap": int((pieces >= max_pieces).sum()),
            "per_game": per_game}


# ---------------------------------------------------------------- terminal board

class ColorBoard:
    """Remembers which piece each settled cell came from, so the live board can draw every piece in its colour."""

    def __init__(self) -> None:
        from tilewise.game.pieces import BOARD_HEIGHT, BOARD_WIDTH

        self.width = BOARD_WIDTH
        self.rows: list[list[str]] = [[""] * BOARD_WIDTH for _ in range(BOARD_HEIGHT)]

    def update(self, result: StepResult) -> None:
        """Record a lock and its line clears."""
        if not result.locked:
            return
        for c, r in result.cells:
            self.rows[r][c] = result.piece
        # top to bottom: dropping row r and adding an empty top row moves only the rows above r
        for r in result.cleared_rows:
            del self.rows[r]
            self.rows.insert(0, [""] * self.width)


def board_panel(game: Game, policy: str, action: int | None, latency_ms: float | None,
                colors: ColorBoard | None = None) -> Any:
    """A rich renderable of the board (each piece in its colour) with the game's counters."""
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    from tilewise.game.pieces import PIECE_COLORS

    color = PIECE_COLORS.get(game.piece.name, "white")
    board = Text()
    for r, row in enumerate(game.render_rows()):
        for c, ch in enumerate(row):
            if ch == "%":
                board.append("[]", style=f"bold {color}")
            elif ch == "#":
                name = colors.rows[r][c] if colors is not None else ""
                board.append("[]", style=PIECE_COLORS.get(name, "grey62"))
            else:
                board.append(" .", style="grey30")
        if r < len(game.board) - 1:
            board.append("\n")
    info = Table.grid(padding=(0, 1))
    info.add_row("policy", policy)
    info.add_row("piece", Text(f"{game.piece.name} rot {game.rot}", style=color))
    info.add_row("next", Text(game.next_piece.name, style=PIECE_COLORS.get(game.next_piece.name, "white")))
    info.add_row("pieces", str(game.pieces))
    info.add_row("lines", str(game.lines))
    info.add_row("steps", str(game.steps))
    info.add_row("holes", str(game.holes()))
    if action is not None:
        info.add_row("action", ACTION_NAMES[action])
    if latency_ms is not None:
        info.add_row("latency", f"{latency_ms:.2f} ms")
    if game.game_over:
        info.add_row("", Text("game over", style="bold red"))
    grid = Table.grid(padding=(0, 2))
    grid.add_row(Panel(board, title="tilewise", expand=False), info)
    return grid
