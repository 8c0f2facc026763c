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
    targets       int8 (N, 2)   optional: the expert's target (rotation state, pivot column) for the falling
                                piece, (-1, -1) when nothing is reachable; the action is "rotate toward the
                                target state, else move toward its column, else drop" (`expert.action_toward`).
                                Files written before it existed lack it (training then has no target signal)
    meta          str scalar    JSON: tilewise version, seed, games, max_pieces, explore, game_seeds,
                                per-game pieces/lines/steps, tokenizer fingerprint and vocab size,
                                prompt and shared-prefix lengths, pad id

Records are ordered by game, then step. Game g plays the piece sequence of seed
`numpy.random.SeedSequence([seed, g]).generate_state(1)[0]`. With probability `explore` a step plays a
uniformly random action instead of the expert's (seeded), so the data also holds positions a model reaches
after a mistake; the label is always the expert's action for the position shown. With probability `detour` a
new piece first takes 1-3 random sideways steps (one direction) before the expert plays on: the expert always
rotates before it moves, so without detours its data never shows a shifted, unrotated piece, the position a model
that moves first reaches.

`read_dataset(path)` checks the format and version and returns a `GameDataset`.

On-policy records (DAgger: a policy plays, the expert labels; `tilewise.train.collect`) are written in this same
format and version, so they merge with expert data (`concat_datasets`).

Prompts are tokenized with `PromptEncoder` (each prompt line encoded once and cached; exactly the tokenizer's ids).
"""

from __future__ import annotations

import contextlib
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
        targets: (N, 2) int8 expert targets (rot, x), or None (older files).
    """

    tokens: np.ndarray
    lengths: np.ndarray
    actions: np.ndarray
    played: np.ndarray
    game_ids: np.ndarray
    steps: np.ndarray
    pieces: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    targets: np.ndarray | None = None  # (N, 2) int8 expert target (rot, x); None in files made before it

    @cached_property
    def token_ids(self) -> list[np.ndarray]:
        """Per-record token ids without padding."""
        return [self.tokens[i, :n] for i, n in enumerate(self.lengths.tolist())]

    def __len__(self) -> int:
        return int(self.actions.shape[0])


def expert_target(expert: Any, game: Any) -> tuple[int, int]:
    """The expert's target (rot, x) for the game's falling piece; (-1, -1) when nothing is reachable."""
    t = expert.target(game.board, game.piece)
    return (-1, -1) if t is None else (int(t[0]), int(t[1]))


def _targets_array(rows: list[tuple[int, int]]) -> np.ndarray:
    return np.array(rows, dtype=np.int8).reshape(-1, 2)  # (N, 2)


def game_seed(seed: int, game: int) -> int:
    """The engine seed of game number `game` in a dataset made with `seed`."""
    return int(np.random.SeedSequence([seed, game]).generate_state(1)[0])


class PromptEncoder:
    """Token ids of game prompts, the tokenizer's exact ids about 30x faster: each prompt line is encoded once.

    The game's tokenizer never merges across a newline (its pre-tokenizer isolates every whitespace character), so
    a prompt's ids are its lines' ids joined by the newline's id. Lines repeat a lot (the fixed header, board rows,
    the piece line), so a cache of line -> ids turns a ~300 us encode of a 348-token prompt into ~10 us, and
    tokenization stops being the bottleneck of data generation. For a tokenizer where that might not hold, the
    encoder checks itself: the first `verify_first` prompts and every `verify_every`-th after are also encoded
    whole; at the first difference it returns the whole-prompt ids and encodes whole prompts from then on.

    Args:
        tok: a `tokenizers.Tokenizer` (prompts carry their special tokens: encoded without adding any).
        verify_first: prompts checked against the whole-prompt encoding at the start.
        verify_every: then every this many prompts are checked.
        max_cache: lines kept (the cache is emptied when full).
    """

    def __init__(self, tok: Any, verify_first: int = 64, verify_every: int = 256, max_cache: int = 200_000) -> None:
        self.tok = tok
        self.fast = True
        self.checked = 0
        self.mismatches = 0
        self._count = 0
        self._verify_first = verify_first
        self._verify_every = max(1, verify_every)
        self._max_cache = max_cache
        self._cache: dict[str, list[int]] = {}
        self._nl = tok.encode("\n", add_special_tokens=False).ids

    def _whole(self, prompt: str) -> list[int]:
        return self.tok.encode(prompt, add_special_tokens=False).ids

    def encode(self, prompt: str) -> list[int]:
        """The prompt's token ids (no special tokens added: the prompt text has them)."""
        if not self.fast:
            return self._whole(prompt)
        cache, nl = self._cache, self._nl
        if len(cache) >= self._max_cache:
            cache.clear()
        ids: list[int] = []
        for i, line in enumerate(prompt.split("\n")):
            if i:
                ids.extend(nl)
            part = cache.get(line)
            if part is None:
                part = cache[line] = self.tok.encode(line, add_special_tokens=False).ids
            ids.extend(part)
        self._count += 1
        if self._count <= self._verify_first or self._count % self._verify_every == 0:
            self.checked += 1
            whole = self._whole(prompt)
            if whole != ids:
                self.mismatches += 1
                self.fast = False
                return whole
        return ids

    def encode_many(self, prompts: list[str]) -> list[list[int]]:
        """`encode` of each prompt."""
        return [self.encode(p) for p in prompts]


_WORKER_ENCODER: dict[str, PromptEncoder] = {}


def _worker_encoder(tok_path: str | None) -> PromptEncoder:
    """One cached `PromptEncoder` per tokenizer per process (worker processes keep it across jobs)."""
    from tilewise.game.tokenizer import load_tokenizer

    key = tok_path or ""
    if key not in _WORKER_ENCODER:
        _WORKER_ENCODER[key] = PromptEncoder(load_tokenizer(tok_path))
    return _WORKER_ENCODER[key]


def _play_game(job: tuple[int, int, int, float, str | None, float]) -> dict[str, Any]:
    """One expert game in a worker: prompts tokenized there, arrays returned."""
    from tilewise.game.engine import Action, Game
    from tilewise.game.expert import Expert
    from tilewise.game.prompt import render_prompt

    game_id, seed, max_pieces, explore, tok_path, detour = job
    enc = _worker_encoder(tok_path)
    game = Game(seed)
    expert = Expert()
    rng = random.Random(seed ^ 0x5EED)  # exploration stream, separate from the piece sequence
    ids: list[list[int]] = []
    actions: list[int] = []
    played: list[int] = []
    pieces: list[int] = []
    targets: list[tuple[int, int]] = []
    detour_steps, detour_move, new_piece = 0, 0, True
    while not game.game_over and game.pieces < max_pieces:
        ids.append(enc.encode(render_prompt(game)))
        a = expert.act(game)
        targets.append(expert_target(expert, game))  # cached: `act` just computed it
        if detour > 0 and new_piece and rng.random() < detour:  # draws only when detours are on: same data at 0
            detour_steps, detour_move = rng.randrange(1, 4), rng.choice((Action.LEFT, Action.RIGHT))
        new_piece = False
        if detour_steps:
            p = int(detour_move)
            detour_steps -= 1
        else:
            # exploration turns or shifts the piece (2-5), never drops it: the expert's next label is a recovery
            p = rng.randrange(2, 6) if explore > 0 and rng.random() < explore else a
        actions.append(a)
        played.append(p)
        pieces.append(game.pieces)
        if game.step(p).locked:
            new_piece, detour_steps = True, 0
    tokens, lengths = _pack_ids(ids, enc.tok.token_to_id("<|pad|>"))
    return {"game_id": game_id, "seed": seed, "tokens": tokens, "lengths": lengths, "actions": actions,
            "played": played, "pieces": pieces, "targets": targets,
            "result": {"pieces": game.pieces, "lines": game.lines, "steps": game.steps,
                       "game_over": game.game_over}}


def _pack_ids(ids: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists -> ((n, width) uint16 right-padded with `pad_id`, (n,) int32 lengths); compact to send back."""
    lengths = np.fromiter((len(t) for t in ids), dtype=np.int32, count=len(ids))
    width = int(lengths.max()) if len(ids) else 0
    if len(ids) and int(lengths.min()) == width:
        return np.array(ids, dtype=np.uint16).reshape(len(ids), width), lengths  # equal lengths: one C loop
    tokens = np.full((len(ids), width), pad_id, dtype=np.uint16)
    for i, t in enumerate(ids):
        tokens[i, : lengths[i]] = t
    return tokens, lengths


def generate(games: int, seed: int, max_pieces: int = 1000, explore: float = 0.02, workers: int | None = None,
             tokenizer_path: str | Path | None = None,
             progress: Callable[[str], None] | None = None, pool: Any = None, detour: float = 0.0) -> GameDataset:
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
        pool: a `multiprocessing` pool (spawn context) to play the games in, instead of starting `workers`
            processes for this call (repeated calls then share one pool); the output does not depend on it.
        detour: probability that a new piece first takes 1-3 random sideways steps before the expert plays on
            (labels stay the expert's: mostly "rotate" on those positions).

    Returns:
        The GameDataset (not yet written; see `write_dataset`).
    """
    seed, games, max_pieces = _check_common(seed, games, max_pieces)
    if not 0.0 <= explore < 1.0:
        raise ConfigError(f"explore={explore} is outside [0, 1)", "pass a probability such as 0.05")
    if not 0.0 <= detour <= 1.0:
        raise ConfigError(f"detour={detour} is outside [0, 1]", "pass a probability such as 0.3")
    tok_path = None if tokenizer_path is None else str(tokenizer_path)
    tok = _checked_tokenizer(tok_path)
    workers = max(1, min(workers or os.cpu_count() or 1, games))
    jobs = [(g, game_seed(seed, g), max_pieces, float(explore), tok_path, float(detour)) for g in range(games)]
    results: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    if pool is not None or workers > 1:
        import multiprocessing as mp

        with contextlib.ExitStack() as stack:
            if pool is None:
                pool = stack.enter_context(mp.get_context("spawn").Pool(workers))
            for r in pool.imap(_play_game, jobs):  # imap keeps game order: output independent of workers
                results.append(r)
                if progress:
                    progress(_progress_line(r, len(results), games, t0))
    else:
        for r in map(_play_game, jobs):
            results.append(r)
            if progress:
                progress(_progress_line(r, len(results), games, t0))
    meta = _base_meta(tok, tok_path, seed, games, max_pieces)
    meta["explore"] = explore
    meta["detour"] = detour
    return _assemble(results, tok, meta)


def _checked_tokenizer(tok_path: str | None) -> Any:
    from tilewise.game.tokenizer import load_tokenizer

    tok = load_tokenizer(tok_path)
    if tok.get_vocab_size() > 65536:
        raise ConfigError(f"the tokenizer has {tok.get_vocab_size()} tokens; the format stores ids as uint16",
                          "use a tokenizer with at most 65536 tokens")
    return tok


def _base_meta(tok: Any, tok_path: str | None, seed: int, games: int, max_pieces: int) -> dict[str, Any]:
    from tilewise import __version__
    from tilewise.game.tokenizer import shared_prefix_length, tokenizer_fingerprint

    return {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "tilewise_version": __version__, "seed": seed,
        "games": games, "max_pieces": max_pieces,
        "tokenizer": "shipped" if tok_path is None else Path(tok_path).name,
        "tokenizer_fingerprint": tokenizer_fingerprint(tok), "vocab_size": tok.get_vocab_size(),
        "pad_id": tok.token_to_id("<|pad|>"), "prefix_tokens": shared_prefix_length(tok),
    }


def _assemble(results: list[dict[str, Any]], tok: Any, meta: dict[str, Any]) -> GameDataset:
    """Per-game results (ids, actions, played, pieces, result; in game order) -> one GameDataset."""
    pad_id = tok.token_to_id("<|pad|>")
    width = max((r["tokens"].shape[1] for r in results), default=0)
    tokens = np.concatenate([np.pad(r["tokens"], ((0, 0), (0, width - r["tokens"].shape[1])), constant_values=pad_id)
                             for r in results]) if results else np.zeros((0, 0), np.uint16)  # (N, T)
    lengths = np.concatenate([r["lengths"] for r in results]) if results else np.zeros(0, np.int32)
    meta = dict(meta)
    meta.update(game_seeds=[r["seed"] for r in results], results=[r["result"] for r in results],
                prompt_tokens=width)
    return GameDataset(
        tokens=tokens, lengths=lengths,
        actions=np.array([a for r in results for a in r["actions"]], dtype=np.uint8),
        played=np.array([a for r in results for a in r["played"]], dtype=np.uint8),
        game_ids=np.array([r["game_id"] for r in results for _ in r["actions"]], dtype=np.int32),
        steps=np.array([s for r in results for s in range(len(r["actions"]))], dtype=np.int32),
        pieces=np.array([p for r in results for p in r["pieces"]], dtype=np.int32),
        meta=meta,
        targets=_targets_array([t for r in results for t in r["targets"]])
        if all("targets" in r for r in results) else None,
    )


def _check_common(seed: Any, games: Any, max_pieces: Any) -> tuple[int, int, int]:
    from tilewise.game.engine import check_seed

    seed = check_seed(seed)
    if isinstance(games, bool) or not isinstance(games, int) or games < 1:
        raise ConfigError(f"games={games!r} is not a positive integer", "pass --games 1 or more")
    if isinstance(max_pieces, bool) or not isinstance(max_pieces, int) or max_pieces < 1:
        raise ConfigError(f"max_pieces={max_pieces!r} is not a positive integer", "pass --max-pieces 1 or more")
    return seed, games, max_pieces


def _progress_line(r: dict[str, Any], done: int, total: int, t0: float) -> str:
    res = r["result"]
    return (f"game {r['game_id']}: {res['pieces']} pieces, {res['lines']} lines, {len(r['actions'])} decisions "
            f"({done}/{total} games, {time.perf_counter() - t0:.1f} s)")


def concat_datasets(parts: list[GameDataset], meta: dict[str, Any] | None = None) -> GameDataset:
    """Records of several datasets as one (same format and version), game ids renumbered so they stay distinct.

    Args:
        parts: datasets made with the same tokenizer (their prompts are re-padded to the widest).
        meta: the result's metadata (default: the first part's, with `games`, `game_seeds` and `results`
            joined and `parts` holding each part's `seed`, `games` and `source`).

    Returns:
        The merged GameDataset: part k's game g becomes game `offset_k + g`, where `offset_k` is the number of
        game ids the parts before it used (their highest game id + 1).

    Raises:
        ConfigError: no parts, or parts made with different tokenizers.
    """
    if not parts:
        raise ConfigError("no datasets to merge", "pass at least one dataset")
    prints = {p.meta.get("tokenizer_fingerprint") for p in parts}
    if len(prints) > 1:
        raise ConfigError(f"the datasets were made with different tokenizers ({sorted(map(str, prints))})",
                          "merge only datasets made with one tokenizer")
    width = max(p.tokens.shape[1] for p in parts)
    pad = int(parts[0].meta.get("pad_id", 0))

    def padded(t: np.ndarray) -> np.ndarray:
        return t if t.shape[1] == width else np.pad(t, ((0, 0), (0, width - t.shape[1])), constant_values=pad)

    game_ids, offset = [], 0
    for p in parts:
        game_ids.append(p.game_ids.astype(np.int64) + offset)
        offset += int(p.game_ids.max()) + 1 if len(p) else 0
    if meta is None:
        meta = dict(parts[0].meta)
        meta.update(games=offset, prompt_tokens=width,
                    game_seeds=[s for p in parts for s in p.meta.get("game_seeds", [])],
                    results=[x for p in parts for x in p.meta.get("results", [])],
                    parts=[{"seed": p.meta.get("seed"), "games": p.meta.get("games"),
                            "source": p.meta.get("source", "expert")} for p in parts])
    return GameDataset(
        tokens=np.concatenate([padded(p.tokens) for p in parts]),
        lengths=np.concatenate([p.lengths for p in parts]),
        actions=np.concatenate([p.actions for p in parts]),
        played=np.concatenate([p.played for p in parts]),
        game_ids=np.concatenate(game_ids).astype(np.int32),
        steps=np.concatenate([p.steps for p in parts]),
        pieces=np.concatenate([p.pieces for p in parts]),
        meta=meta,
        # the target signal only where every part has it (a file from before it existed has none)
        targets=np.concatenate([p.targets for p in parts]) if all(p.targets is not None for p in parts) else None,
    )


def write_dataset(data: GameDataset, path: str | Path, compress: bool = True) -> Path:
    """Write a dataset in format version 1 (`.npz`; the `.npz` suffix is added if missing).

    Args:
        data: the dataset.
        path: the file.
        compress: deflate the arrays (the default; about 5x smaller). Uncompressed files read the same and are
            written and read several times faster: for a scratch file on the machine that uses it.

    Returns:
        The path written.
    """
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    if path.parent and not path.parent.exists():
        raise ConfigError(f"folder {path.parent} does not exist", "create it or choose another --out")
    tmp = path.with_name(path.name + ".part.npz")
    (np.savez_compressed if compress else np.savez)(
        tmp, format=np.array(FORMAT_NAME), version=np.array(FORMAT_VERSION, dtype=np.int64),
        meta=np.array(json.dumps(data.meta, sort_keys=True)),
        **{name: getattr(data, name) for name in _ARRAYS},
        **({} if data.targets is None else {"targets": np.asarray(data.targets, dtype=np.int8)}),
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
        targets = z["targets"] if "targets" in keys else None
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
    if targets is not None and targets.shape != (n, 2):
        raise ConfigError(f"{path}: targets has shape {targets.shape}, expected ({n}, 2)", regen)
    if targets is not None and n and (int(targets[:, 0].min()) < -1 or int(targets[:, 0].max()) > 3):
        raise ConfigError(f"{path}: a target rotation state is outside -1..3", regen)
    return GameDataset(meta=meta, targets=targets, **arrays)
