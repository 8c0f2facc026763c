"""Expert decisions as training records: `tilewise game dataset --games N --seed S --out FILE`.

File format (version 1): a NumPy `.npz` (zip of `.npy` arrays, compressed; readable without pickle):

    format        str scalar    "tilewise-game-dataset"
    version       int64 scalar  1
    tokens        uint16 (N, T) prompt token ids, right-padded with the tokenizer's `<|pad|>` id
    lengths       int32 (N,)    real prompt length of each record (all equal with the shipped tokenizer: 348)
    actions       uint8 (N,)    the expert's action for that prompt, 0-5 (the training label)
    played        uint8 (N,)    the action actually played (differs from `actions` on exploration steps)
    game_ids      int32 (N,)    game number 0..games-1
    steps         int32 (N,)    decision number within its game, from 0
    pieces        int32 (N,)    pieces locked in that game before this decision
    meta          str scalar    JSON: tilewise version, seed, games, max_pieces, explore, game_seeds,
                                per-game pieces/lines/steps, tokenizer fingerprint and vocab size,
                                prompt and shared-prefix lengths, pad id

Records are ordered by game, then step. Game g plays the piece sequence of seed
`numpy.random.SeedSequence([seed, g]).generate_state(1)[0]`. With probability `explore` a step plays a
uniformly random action instead of the expert's (seeded), so the data also holds positions a model reaches
after a mistake; the label is always the expert's action for the position shown.

`read_dataset(path)` checks the format and version and returns a `GameDataset`.
"""

from __future__ import annotations

import json
import os
import random
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from tilewise.errors import ConfigError

FORMAT_NAME = "tilewise-game-dataset"
FORMAT_VERSION = 1
_ARRAYS = ("tokens", "lengths", "actions", "played", "game_ids", "steps", "pieces")


@dataclass
class GameDataset:
    """A dataset file read back (see the module docstring for the fields).

    Attributes:
        tokens: (N, T) uint16 right-padded token ids; lengths: (N,) real lengths.
        token_ids: per record, the (length,) ids without padding (views into `tokens`).
        actions, played, game_ids, steps, pieces: (N,) arrays.
        meta: the JSON metadata.
    """

    tokens: np.ndarray
    lengths: np.ndarray
    actions: np.ndarray
    played: np.ndarray
    game_ids: np.ndarray
    steps: np.ndarray
    pieces: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def token_ids(self) -> list[np.ndarray]:
        """Per-record token ids without padding."""
        return [self.tokens[i, :n] for i, n in enumerate(self.lengths.tolist())]

    def __len__(self) -> int:
        return int(self.actions.shape[0])


def game_seed(seed: int, game: int) -> int:
    """The engine seed of game number `game` in a dataset made with `seed`."""
    return int(np.random.SeedSequence([seed, game]).generate_state(1)[0])


_WORKER_TOKENIZER: dict[str, Any] = {}


def _play_game(job: tuple[int, int, int, float, str | None]) -> dict[str, Any]:
    """One expert game in a worker: prompts tokenized there, arrays returned."""
    from tilewise.game.engine import Game
    from tilewise.game.expert import Expert
    from tilewise.game.prompt import render_prompt
    from tilewise.game.tokenizer import encode_prompts, load_tokenizer

    game_id, seed, max_pieces, explore, tok_path = job
    key = tok_path or ""
    if key not in _WORKER_TOKENIZER:
        _WORKER_TOKENIZER[key] = load_tokenizer(tok_path)
    tok = _WORKER_TOKENIZER[key]
    game = Game(seed)
    expert = Expert()
    rng = random.Random(seed ^ 0x5EED)  # exploration stream, separate from the piece sequence
    prompts: list[str] = []
    actions: list[int] = []
    played: list[int] = []
    pieces: list[int] = []
    while not game.game_over and game.pieces < max_pieces:
        prompts.append(render_prompt(game))
        a = expert.act(game)
        # exploration turns or shifts the piece (2-5), never drops it: the expert's next label is a recovery
        p = rng.randrange(2, 6) if explore > 0 and rng.random() < explore else a
        actions.append(a)
        played.append(p)
        pieces.append(game.pieces)
        game.step(p)
    ids = encode_prompts(tok, prompts)
    return {"game_id": game_id, "seed": seed, "ids": ids, "actions": actions, "played": played, "pieces": pieces,
            "result": {"pieces": game.pieces, "lines": game.lines, "steps": game.steps,
                       "game_over": game.game_over}}


def generate(games: int, seed: int, max_pieces: int = 1000, explore: float = 0.02, workers: int | None = None,
             tokenizer_path: str | Path | None = None,
             progress: Callable[[str], None] | None = None) -> GameDataset:
    """Play `games` expert games and collect every decision.

    Args:
        games: number of games (>= 1).
        seed: dataset seed (non-negative int); game g uses `game_seed(seed, g)`.
        max_pieces: a game stops after this many pieces (or at game over).
        explore: probability that a step plays a random rotation or move instead of the expert's action
            (labels stay the expert's).
        workers: processes (default: the CPU count, at most `games`); the output does not depend on it.
        tokenizer_path: a tokenizer.json; None for the shipped one.
        progress: called with one line per finished game.

    Returns:
        The GameDataset (not yet written; see `write_dataset`).
    """
    from tilewise import __version__
    from tilewise.game.engine import check_seed
    from tilewise.game.tokenizer import load_tokenizer, shared_prefix_length, tokenizer_fingerprint

    seed = check_seed(seed)
    if isinstance(games, bool) or not isinstance(games, int) or games < 1:
        raise ConfigError(f"games={games!r} is not a positive integer", "pass --games 1 or more")
    if isinstance(max_pieces, bool) or not isinstance(max_pieces, int) or max_pieces < 1:
        raise ConfigError(f"max_pieces={max_pieces!r} is not a positive integer", "pass --max-pieces 1 or more")
    if not 0.0 <= explore < 1.0:
        raise ConfigError(f"explore={explore} is outside [0, 1)", "pass a probability such as 0.05")
    tok_path = None if tokenizer_path is None else str(tokenizer_path)
    tok = load_tokenizer(tok_path)
    pad_id = tok.token_to_id("<|pad|>")
    if tok.get_vocab_size() > 65536:
        raise ConfigError(f"the tokenizer has {tok.get_vocab_size()} tokens; the format stores ids as uint16",
                          "use a tokenizer with at most 65536 tokens")
    workers = max(1, min(workers or os.cpu_count() or 1, games))
    jobs = [(g, game_seed(seed, g), max_pieces, float(explore), tok_path) for g in range(games)]
    results: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    if workers == 1:
        mapped = map(_play_game, jobs)
        for r in mapped:
            results.append(r)
            if progress:
                progress(_progress_line(r, len(results), games, t0))
    else:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(workers) as pool:
            for r in pool.imap(_play_game, jobs):  # imap keeps game order: output independent of workers
                results.append(r)
                if progress:
                    progress(_progress_line(r, len(results), games, t0))
    all_ids = [ids for r in results for ids in r["ids"]]
    n = len(all_ids)
    lengths = np.fromiter((len(t) for t in all_ids), dtype=np.int32, count=n)
    width = int(lengths.max()) if n else 0
    tokens = np.full((n, width), pad_id, dtype=np.uint16)  # (N, T)
    for i, t in enumerate(all_ids):
        tokens[i, : lengths[i]] = t
    meta = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "tilewise_version": __version__, "seed": seed,
        "games": games, "max_pieces": max_pieces, "explore": explore,
        "game_seeds": [r["seed"] for r in results], "results": [r["result"] for r in results],
        "tokenizer": "shipped" if tok_path is None else Path(tok_path).name,
        "tokenizer_fingerprint": tokenizer_fingerprint(tok), "vocab_size": tok.get_vocab_size(), "pad_id": pad_id,
        "prompt_tokens": width, "prefix_tokens": shared_prefix_length(tok),
    }
    return GameDataset(
        tokens=tokens, lengths=lengths,
        actions=np.array([a for r in results for a in r["actions"]], dtype=np.uint8),
        played=np.array([a for r in results for a in r["played"]], dtype=np.uint8),
        game_ids=np.array([r["game_id"] for r in results for _ in r["actions"]], dtype=np.int32),
        steps=np.array([s for r in results for s in range(len(r["actions"]))], dtype=np.int32),
        pieces=np.array([p for r in results for p in r["pieces"]], dtype=np.int32),
        meta=meta,
    )


def _progress_line(r: dict[str, Any], done: int, total: int, t0: float) -> str:
    res = r["result"]
    return (f"game {r['game_id']}: {res['pieces']} pieces, {res['lines']} lines, {len(r['actions'])} decisions "
            f"({done}/{total} games, {time.perf_counter() - t0:.1f} s)")


def write_dataset(data: GameDataset, path: str | Path) -> Path:
    """Write a dataset in format version 1 (compressed `.npz`; the `.npz` suffix is added if missing).

    Returns:
        The path written.
    """
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    if path.parent and not path.parent.exists():
        raise ConfigError(f"folder {path.parent} does not exist", "create it or choose another --out")
    tmp = path.with_name(path.name + ".part.npz")
    np.savez_compressed(
        tmp, format=np.array(FORMAT_NAME), version=np.array(FORMAT_VERSION, dtype=np.int64),
        meta=np.array(json.dumps(data.meta, sort_keys=True)),
        **{name: getattr(data, name) for name in _ARRAYS},
    )
    tmp.replace(path)  # never leave a half-written file under the real name
    return path


def read_dataset(path: str | Path) -> GameDataset:
    """Read and check a dataset file.

    Args:
        path: a file written by `tilewise game dataset`.

    Returns:
        GameDataset (`token_ids`, `actions`, `game_ids`, `steps`, ... as documented in this module).

    Raises:
        ConfigError: missing file, not an npz, another format or version, missing or inconsistent arrays,
            or actions outside 0-5.
    """
    path = Path(path)
    regen = "regenerate it with `tilewise game dataset --games N --seed S --out FILE`"
    if not path.is_file():
        raise ConfigError(f"dataset file {path} does not exist", regen)
    if not zipfile.is_zipfile(path):
        raise ConfigError(f"{path} is not a tilewise game dataset (not an .npz archive)", regen)
    with np.load(path, allow_pickle=False) as z:
        keys = set(z.files)
        if "format" not in keys or "version" not in keys:
            raise ConfigError(f"{path} has no format/version fields: not a tilewise game dataset", regen)
        fmt = str(z["format"][()])
        version = int(z["version"][()])
        if fmt != FORMAT_NAME:
            raise ConfigError(f"{path} is format {fmt!r}, not {FORMAT_NAME!r}", regen)
        if version != FORMAT_VERSION:
            raise ConfigError(f"{path} is dataset format version {version}; this tilewise reads version "
                              f"{FORMAT_VERSION}", regen + " with this tilewise version")
        missing = [k for k in (*_ARRAYS, "meta") if k not in keys]
        if missing:
            raise ConfigError(f"{path} lacks the arrays {', '.join(missing)}", regen)
        arrays = {k: z[k] for k in _ARRAYS}
        meta = json.loads(str(z["meta"][()]))
    tokens = arrays["tokens"]
    n = tokens.shape[0] if tokens.ndim == 2 else -1
    if tokens.ndim != 2:
        raise ConfigError(f"{path}: tokens has shape {tokens.shape}, expected (N, T)", regen)
    for k in _ARRAYS[1:]:
        if arrays[k].shape != (n,):
            raise ConfigError(f"{path}: {k} has shape {arrays[k].shape}, expected ({n},) like tokens", regen)
    lengths = arrays["lengths"]
    if n and (int(lengths.min()) < 1 or int(lengths.max()) > tokens.shape[1]):
        raise ConfigError(f"{path}: prompt lengths outside 1..{tokens.shape[1]}", regen)
    for k in ("actions", "played"):
        if n and int(arrays[k].max()) > 5:
            i = int(np.argmax(arrays[k] > 5))
            raise ConfigError(f"{path}: record {i} has {k} value {int(arrays[k][i])}, outside 0-5 "
                              "(6 and 7 are reserved outputs)", regen)
    return GameDataset(meta=meta, **arrays)
