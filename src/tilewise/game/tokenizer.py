"""The game's tokenizer: a small byte-level BPE (`tokenizer.json`, HF `tokenizers` format) shipped in the package.

Design (why the numbers come out as they do):

- Pre-tokenization splits the text into: tags (`<board>`, `</board>`), keys with their colon (`piece:`,
  ` rot:`, ` x:`, ...), words with an optional leading space, single digits with an optional leading space,
  single other symbols with an optional leading space (` .`, ` #`, ` %`), and single whitespace characters.
  BPE merges never cross these pieces, and every piece of a prompt is one token, so every prompt has the
  same length: 348 tokens (seed 001's LFM2 tokenizer: 346). Each board cell is one token (231) and each
  row ends in a newline token (21).
- The model is byte-level BPE trained on game prompts until every piece is one token, so any text still
  encodes (rare text falls back to byte tokens). The vocabulary is small: 4 special tokens, 256 byte
  tokens and the merges of the prompt's words.
- Special tokens: `<|pad|>` (id 0), `<|startoftext|>` (bos), `<|im_start|>`, `<|im_end|>` (eos). Prompts
  carry `<|startoftext|>` in their text, so always encode with `add_special_tokens=False` (as `encode_prompts`
  does) to avoid a second bos from tokenizers that add one.
- The first 42 tokens (up to and including `<board>\\n`) are the same in every prompt: the prefix a model can
  prefill once and reuse (`shared_prefix_length`).

Any LFM2-compatible `tokenizer.json` loads through `load_tokenizer(path)`; it must have the four special tokens.
Rebuild the shipped file with `python -m tilewise.game.tokenizer` (deterministic).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tilewise.errors import ConfigError
from tilewise.model.text import (
    PRETOKEN_PATTERN,
    PromptEncoder,
    encode_prompt,
    encodes_line_by_line,
    untrained_tokenizer,
)

__all__ = ["PRETOKEN_PATTERN", "PromptEncoder", "encode_prompt", "encodes_line_by_line"]  # re-exported here

SPECIAL_TOKENS: tuple[str, ...] = ("<|pad|>", "<|startoftext|>", "<|im_start|>", "<|im_end|>")
TOKENIZER_PATH = Path(__file__).with_name("tokenizer.json")



def load_tokenizer(path: str | Path | None = None) -> Any:
    """Load the game tokenizer (default: the shipped one) or any LFM2-compatible `tokenizer.json`.

    Args:
        path: a `tokenizer.json` file or a folder holding one; None for the shipped tokenizer.

    Returns:
        A `tokenizers.Tokenizer`.

    Raises:
        ConfigError: the file is missing or unreadable, or lacks one of the special tokens
            `<|startoftext|>`, `<|im_start|>`, `<|im_end|>`, `<|pad|>`.
    """
    from tokenizers import Tokenizer

    p = TOKENIZER_PATH if path is None else Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise ConfigError(f"tokenizer file {p} does not exist",
                          "pass a tokenizer.json (or a folder holding one), or leave the path out for the "
                          "game's shipped tokenizer")
    try:
        tok = Tokenizer.from_file(str(p))
    except Exception as exc:  # the library raises a bare Exception on bad JSON
        raise ConfigError(f"tokenizer file {p} could not be read: {exc}",
                          "pass a Hugging Face tokenizer.json written by the tokenizers library") from None
    check_special_tokens(tok, source=str(p))
    return tok


def check_special_tokens(tok: Any, source: str = "tokenizer") -> None:
    """Raise ConfigError naming every special token of the chat template the tokenizer lacks."""
    missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if missing:
        raise ConfigError(f"{source} has no token for {', '.join(missing)}",
                          "use an LFM2-compatible tokenizer.json (bos <|startoftext|>, <|im_start|>, "
                          "eos <|im_end|>, pad <|pad|>) or the game's shipped tokenizer")


def tokenizer_fingerprint(tok: Any) -> str:
    """A short hash of the vocabulary (stored with datasets so training and play use the same ids)."""
    vocab = tok.get_vocab(with_added_tokens=True)
    return hashlib.sha256(json.dumps(vocab, sort_keys=True).encode()).hexdigest()[:16]


def encode_prompts(tok: Any, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids of each prompt (no extra special tokens: the text already has them)."""
    return [e.ids for e in tok.encode_batch(list(prompts), add_special_tokens=False)]


def shared_prefix_length(tok: Any | None = None) -> int:
    """Number of leading tokens every prompt shares (the part a model can prefill once and cache).

    Measured, not assumed, so it holds for any tokenizer: it is the longest common token prefix of prompts
    whose first board cell differs (`.`, `#`, `%`), since everything before that cell is fixed text.

    Args:
        tok: a tokenizer; None for the shipped one.

    Returns:
        The prefix length in tokens (42 for the shipped tokenizer).
    """
    from tilewise.game.prompt import PROMPT_PREFIX

    tok = load_tokenizer() if tok is None else tok
    text = example_prompt()
    n = len(PROMPT_PREFIX)
    variants = [text[:n] + sym + text[n + 1:] for sym in ".#%"]
    ids = encode_prompts(tok, variants)
    length = 0
    for column in zip(*ids):
        if len(set(column)) != 1:
            break
        length += 1
    return length


def example_prompt() -> str:
    """Seed 001's example prompt (J4 rot 1 at x 4, y 12 over a small stack; next I5)."""
    from tilewise.game.engine import Game
    from tilewise.game.prompt import render_prompt

    rows = ["." * 11] * 17 + ["....##.....", ".....##....", "......###..", ".......#..."]
    return render_prompt(Game.from_state(rows, "J4", 1, 4, 12, "I5"))


def _training_corpus(games: int = 6, steps: int = 300) -> list[str]:
    """Prompts from seeded random games plus lines that cover every digit with and without a space."""
    import random

    from tilewise.game.engine import Game
    from tilewise.game.prompt import render_prompt

    texts = [example_prompt()]
    rng = random.Random(1234)
    for g in range(games):
        game = Game(g)
        for _ in range(steps):
            if game.game_over:
                break
            texts.append(render_prompt(game))
            game.step(rng.randrange(6))
    texts.append(" ".join("0123456789") + " " + "".join("0123456789"))
    # special tokens are matched whole before pre-tokenization: keep their text out of the merges
    for special in SPECIAL_TOKENS:
        texts = [t.replace(special, "\n") for t in texts]
    return texts


def build_tokenizer() -> Any:
    """Train the game tokenizer from scratch (deterministic): what `python -m tilewise.game.tokenizer` ships.

    Returns:
        A `tokenizers.Tokenizer`.
    """
    from tokenizers import decoders, pre_tokenizers, trainers

    tok = untrained_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096,  # a ceiling: training stops when every pre-token is a single token
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer=trainer)
    return tok


def main() -> int:
    """Rebuild the shipped tokenizer.json and print its size and the example prompt's token counts."""
    tok = build_tokenizer()
    tok.save(str(TOKENIZER_PATH), pretty=True)
    tok = load_tokenizer()
    n = len(encode_prompt(tok, example_prompt()))
    print(f"wrote {TOKENIZER_PATH.name}: vocab {tok.get_vocab_size()}, example prompt {n} tokens, "
          f"shared prefix {shared_prefix_length(tok)} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
