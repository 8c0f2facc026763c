"""Training examples: the game dataset's records as padded arrays, split into training and held-out games.

Every record of `tilewise game dataset` is one decision: the prompt's token ids, the expert's action, the game
it came from and the step in that game. Steps of one game are strongly correlated, so the held-out set is made
of whole games: agreement on it measures what the model does on boards it has never seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilewise.errors import ConfigError

NUM_ACTIONS = 6  # outputs 6 and 7 are reserved: never a target


@dataclass
class Examples:
    """Decisions as arrays (right-padded token ids).

    Attributes:
        ids: (N, T) token ids, padded with `pad_id` after each prompt.
        lengths: (N,) real prompt lengths.
        actions: (N,) expert actions in 0..5.
        games: (N,) game ids.
        steps: (N,) step within the game.
        targets: (N, 2) the expert's target (rot, x) per decision, (-1, -1) when none; None when the data has no
            targets (an auxiliary training signal only).
    """

    ids: np.ndarray
    lengths: np.ndarray
    actions: np.ndarray
    games: np.ndarray
    steps: np.ndarray
    targets: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def subset(self, mask: np.ndarray) -> Examples:
        """The examples where `mask` is true, with padding trimmed to the longest kept prompt."""
        lengths = self.lengths[mask]
        width = int(lengths.max()) if lengths.size else 1
        return Examples(self.ids[mask, :width], lengths, self.actions[mask], self.games[mask], self.steps[mask],
                        None if self.targets is None else self.targets[mask])

    def action_counts(self) -> list[int]:
        """How many examples carry each action 0..5."""
        return np.bincount(self.actions, minlength=NUM_ACTIONS)[:NUM_ACTIONS].tolist()

    @staticmethod
    def concat(parts: list[Examples], pad_id: int = 0) -> Examples:
        """The parts' examples in order, padded to the widest; game ids are kept (make them distinct first)."""
        parts = [p for p in parts if len(p)] or parts[:1]
        width = max(p.ids.shape[1] for p in parts)

        def padded(ids: np.ndarray) -> np.ndarray:
            return ids if ids.shape[1] == width else np.pad(ids, ((0, 0), (0, width - ids.shape[1])),
                                                            constant_values=pad_id)

        if len(parts) == 1:
            return parts[0]
        return Examples(np.concatenate([padded(p.ids) for p in parts]), np.concatenate([p.lengths for p in parts]),
                        np.concatenate([p.actions for p in parts]), np.concatenate([p.games for p in parts]),
                        np.concatenate([p.steps for p in parts]),
                        np.concatenate([p.targets for p in parts]) if all(p.targets is not None for p in parts)
                        else None)


def from_records(token_ids: list[np.ndarray] | list[list[int]] | np.ndarray, actions: np.ndarray | list[int],
                 games: np.ndarray | list[int], steps: np.ndarray | list[int], pad_id: int,
                 vocab_size: int | None = None, lengths: np.ndarray | None = None) -> Examples:
    """Pad variable-length prompts into one array and check every field.

    Args:
        token_ids: one sequence of token ids per decision.
        actions: the expert's action per decision (0..5).
        games: game id per decision.
        steps: step within its game per decision.
        pad_id: token written after each prompt (never read: the model is causal and reads the last real token).
        vocab_size: when given, every id must be below it.
        lengths: with `token_ids` an already padded (N, T) int32 array, the real lengths (no copy is made).

    Returns:
        The examples.
    """
    n = len(token_ids)
    actions = np.asarray(actions, dtype=np.int64).reshape(-1)
    games = np.asarray(games, dtype=np.int64).reshape(-1)
    steps = np.asarray(steps, dtype=np.int64).reshape(-1)
    if not (actions.size == games.size == steps.size == n):
        raise ConfigError(f"dataset fields disagree in length: {n} prompts, {actions.size} actions, "
                          f"{games.size} game ids, {steps.size} steps", "regenerate it with `tilewise game dataset`")
    if n == 0:
        raise ConfigError("the dataset holds no decisions", "generate one with `tilewise game dataset --games N`")
    bad = np.flatnonzero((actions < 0) | (actions >= NUM_ACTIONS))
    if bad.size:
        raise ConfigError(f"record {int(bad[0])} has expert action {int(actions[bad[0]])}, outside 0..5 "
                          f"(6 and 7 are reserved outputs)", "regenerate the dataset with `tilewise game dataset`")
    if lengths is None:
        lengths = np.fromiter((len(t) for t in token_ids), dtype=np.int64, count=n)
    if int(lengths.min()) < 1:
        raise ConfigError(f"record {int(np.argmin(lengths))} has an empty prompt", "regenerate the dataset")
    if isinstance(token_ids, np.ndarray) and token_ids.ndim == 2:
        ids = token_ids
    else:
        width = int(lengths.max())
        ids = np.full((n, width), pad_id, dtype=np.int32)  # (N, T)
        for i, t in enumerate(token_ids):
            ids[i, : lengths[i]] = t
    if vocab_size is not None:
        top = int(ids.max())
        if top >= vocab_size or int(ids.min()) < 0:
            raise ConfigError(f"the dataset has token id {top}, but the tokenizer has only {vocab_size} tokens",
                              "regenerate the dataset with the tokenizer the model is trained with")
    return Examples(ids, lengths, actions, games, steps)


def split_games(ex: Examples, heldout_fraction: float, seed: int) -> tuple[Examples, Examples]:
    """Split by whole games: a seeded choice of `heldout_fraction` of the games becomes the held-out set.

    Args:
        ex: all examples.
        heldout_fraction: share of games held out, in [0, 1); at least one game is held out when there are two.
        seed: seed of the choice.

    Returns:
        (train, heldout).
    """
    if not 0.0 <= heldout_fraction < 1.0:
        raise ConfigError(f"held-out fraction {heldout_fraction} is outside [0, 1)", "use e.g. 0.05")
    game_ids = np.unique(ex.games)
    n_held = round(heldout_fraction * game_ids.size)
    if heldout_fraction > 0 and game_ids.size >= 2:
        n_held = min(max(n_held, 1), game_ids.size - 1)
    rng = np.random.default_rng(seed)
    held = rng.permutation(game_ids)[:n_held]
    mask = np.isin(ex.games, held)
    return ex.subset(~mask), ex.subset(mask)


def load_examples(path: str | Path, tokenizer: Any = None, pad_id: int = 0) -> Examples:
    """Read a `tilewise game dataset` file (format checks are `read_dataset`'s) into examples.

    Args:
        path: the dataset file.
        tokenizer: when given, the file must have been made with this tokenizer (same fingerprint) and every
            token id must be below its vocabulary size.
        pad_id: padding token id.

    Returns:
        The examples.
    """
    from tilewise.game.dataset import read_dataset

    data = read_dataset(path)
    vocab_size = None
    if tokenizer is not None:
        from tilewise.game.tokenizer import tokenizer_fingerprint

        vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        made_with = data.meta.get("tokenizer_fingerprint")
        if made_with is not None and made_with != tokenizer_fingerprint(tokenizer):
            raise ConfigError(f"{path} was made with another tokenizer (fingerprint {made_with}, this one "
                              f"{tokenizer_fingerprint(tokenizer)})",
                              "train with --tokenizer set to the dataset's tokenizer, or regenerate the dataset")
    ex = from_arrays(data.tokens, data.lengths, data.actions, data.game_ids, data.steps, pad_id=pad_id,
                     vocab_size=vocab_size)
    if data.targets is not None:
        ex.targets = data.targets.astype(np.int64)  # (N, 2)
    return ex


def from_arrays(tokens: np.ndarray, lengths: np.ndarray, actions: np.ndarray, games: np.ndarray, steps: np.ndarray,
                pad_id: int = 0, vocab_size: int | None = None) -> Examples:
    """Examples from already padded arrays (the dataset file's layout), checked like `from_records`.

    Args:
        tokens: (N, T) right-padded token ids.
        lengths: (N,) real lengths.
        actions: (N,) expert actions 0..5.
        games: (N,) game ids.
        steps: (N,) step in game.
        pad_id: id written over anything past a prompt's length.
        vocab_size: when given, every id must be below it.

    Returns:
        The examples (ids as int32).
    """
    n = int(tokens.shape[0])
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if tokens.ndim != 2 or lengths.size != n:
        raise ConfigError(f"dataset tokens {tokens.shape} and lengths {lengths.shape} disagree",
                          "regenerate it with `tilewise game dataset`")
    if n and (int(lengths.min()) < 1 or int(lengths.max()) > tokens.shape[1]):
        raise ConfigError(f"dataset prompt lengths lie outside 1..{tokens.shape[1]}", "regenerate the dataset")
    ids = tokens.astype(np.int32)  # (N, T)
    ids[np.arange(tokens.shape[1])[None, :] >= lengths[:, None]] = pad_id
    return from_records(ids, actions, games, steps, pad_id=pad_id, vocab_size=vocab_size, lengths=lengths)


def load_split(paths: list[str | Path], heldout_fraction: float, seed: int, tokenizer: Any = None,
               pad_id: int = 0) -> tuple[Examples, Examples, list[Examples], list[int]]:
    """Read several dataset files and split each one by whole games, then join the parts.

    Each file is split on its own with `split_games(file, heldout_fraction, seed)`, so adding files (e.g. DAgger's
    on-policy records) never moves a game of the first file between training and held-out: agreement on the first
    file's held-out games stays comparable across runs, and no game a model was trained on becomes held out later.
    Game ids are renumbered per file (file k's ids are offset past those of the files before it).

    Args:
        paths: dataset files (at least one).
        heldout_fraction: share of each file's games held out.
        seed: seed of the choice of held-out games.
        tokenizer: as in `load_examples`.
        pad_id: padding token id.

    Returns:
        (training examples of all files, held-out examples of all files, held-out examples per file, number of
        training examples per file).
    """
    if not paths:
        raise ConfigError("no dataset files given", "pass --data FILE [FILE ...]")
    trains, helds = [], []
    offset = 0
    for path in paths:
        ex = load_examples(path, tokenizer=tokenizer, pad_id=pad_id)
        ex.games = ex.games + offset
        offset = int(ex.games.max()) + 1
        train, held = split_games(ex, heldout_fraction, seed)
        trains.append(train)
        helds.append(held)
    return Examples.concat(trains, pad_id), Examples.concat(helds, pad_id), helds, [len(t) for t in trains]
