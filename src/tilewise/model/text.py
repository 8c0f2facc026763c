"""How a model reads text: token ids of a prompt, and an encoder that keeps each line's ids.

The game's tokenizer (`tilewise.game.tokenizer`) pre-tokenizes with `PRETOKEN_PATTERN`; this module holds the
pattern because whether a tokenizer may be run line by line depends on it, and models read text below the game.
"""

from __future__ import annotations

import json
from typing import Any

# tags | keys with colon | words | one digit | one other symbol (optional leading space each) | one whitespace
PRETOKEN_PATTERN = r"</?[a-z]+>| ?[A-Za-z]+:| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]|\s"


def encode_prompt(tok: Any, prompt: str) -> list[int]:
    """Token ids of one prompt (no extra special tokens: the text already has them)."""
    return tok.encode(prompt, add_special_tokens=False).ids


def encodes_line_by_line(tok: Any) -> bool:
    """Whether encoding a text line by line gives exactly the ids of encoding it whole.

    True for tokenizers that pre-tokenize as the shipped one does (no normalizer; `PRETOKEN_PATTERN` splits,
    isolating every whitespace character, so no piece holds a newline and BPE never merges across one) and whose
    special tokens neither strip whitespace nor hold a newline. Anything else (an HF LFM2 tokenizer, whose byte-level
    regex keeps runs of whitespace together, for one) is encoded whole.
    """
    spec = json.loads(tok.to_str())
    want = json.loads(untrained_tokenizer().to_str())
    added_ok = all(not (t.get("lstrip") or t.get("rstrip")) and "\n" not in t["content"]
                   for t in spec.get("added_tokens", []))
    post = spec.get("post_processor")
    return (spec.get("normalizer") is None and spec.get("pre_tokenizer") == want["pre_tokenizer"] and added_ok
            and (post is None or post.get("type") == "ByteLevel"))


def untrained_tokenizer() -> Any:
    """A tokenizer with the shipped pre-tokenization and no vocabulary yet (what `build_tokenizer` trains)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    return tok


class PromptEncoder:
    """`encode_prompt` for a stream of prompts, with each line's ids kept.

    A prompt is a few dozen lines, most of them the same from one move to the next (the system text, empty board
    rows), and the tokenizer library spends most of its time on a whole prompt's bookkeeping (offsets, added-token
    matching). Where `encodes_line_by_line` holds, the ids are joined from each line's stored ids, and only lines
    not seen before reach the library; otherwise every prompt is encoded whole. Either way the ids are the ones
    `encode_prompt` gives.

    Args:
        tok: a `tokenizers.Tokenizer`.
        max_lines: lines kept before the store is emptied (bounds its memory over a long game).
    """

    def __init__(self, tok: Any, max_lines: int = 4096) -> None:
        self.tok = tok
        self.line_by_line = encodes_line_by_line(tok)
        self.max_lines = max_lines
        self._lines: dict[str, list[int]] = {}
        self._newline = tok.encode("\n", add_special_tokens=False).ids if self.line_by_line else []

    def __call__(self, prompt: str) -> list[int]:
        if not self.line_by_line:
            return encode_prompt(self.tok, prompt)
        out: list[int] = []
        lines = self._lines
        for line in prompt.split("\n"):
            ids = lines.get(line)
            if ids is None:
                if len(lines) >= self.max_lines:
                    lines.clear()
                ids = lines[line] = self.tok.encode(line, add_special_tokens=False).ids
            out += ids
            out += self._newline
        del out[len(out) - len(self._newline):]  # no newline after the last line
        return out
