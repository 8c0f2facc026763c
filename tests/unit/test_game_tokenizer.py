"""Tokenizer: shipped file, token counts, fixed length, shared prefix, rebuild, other LFM2-style tokenizers."""

from __future__ import annotations

import json
import random

import pytest

from tilewise.errors import ConfigError
from tilewise.game.engine import Game
from tilewise.game.prompt import render_prompt
from tilewise.game.tokenizer import (
    SPECIAL_TOKENS,
    TOKENIZER_PATH,
    build_tokenizer,
    encode_prompt,
    encode_prompts,
    example_prompt,
    load_tokenizer,
    shared_prefix_length,
    tokenizer_fingerprint,
)


def prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    g = Game(seed)
    while len(out) < n:
        if g.game_over:
            g = Game(rng.randrange(10_000))
        out.append(render_prompt(g))
        g.step(rng.randrange(6))
    return out


def test_shipped_tokenizer_counts():
    tok = load_tokenizer()
    for t in SPECIAL_TOKENS:
        assert tok.token_to_id(t) is not None
    assert tok.token_to_id("<|pad|>") == 0
    assert tok.get_vocab_size() < 512  # small: the model is a few million parameters
    n = len(encode_prompt(tok, example_prompt()))
    assert n == 348  # seed 001's LFM2 tokenizer: 346
    assert shared_prefix_length(tok) == 42


def test_every_prompt_has_the_same_length_and_decodes_back():
    tok = load_tokenizer()
    texts = prompts(200, seed=1)
    ids = encode_prompts(tok, texts)
    assert {len(i) for i in ids} == {348}
    for text, i in zip(texts[:20], ids[:20]):
        assert tok.decode(i, skip_special_tokens=False) == text


def test_cell_symbols_digits_are_single_tokens():
    tok = load_tokenizer()
    enc = tok.encode(example_prompt(), add_special_tokens=False)
    toks = enc.tokens
    board = toks[toks.index("<board>") + 2:toks.index("</board>")]
    assert len(board) == 21 * 12  # 11 cells + newline per row
    assert set(board) == {".", "Ġ.", "Ġ#", "Ġ%", "Ċ"}


def test_prefix_ids_are_shared_by_random_prompts():
    tok = load_tokenizer()
    p = shared_prefix_length(tok)
    ids = encode_prompts(tok, prompts(100, seed=2))
    first = ids[0][:p]
    assert all(i[:p] == first for i in ids)
    assert len({tuple(i[: p + 1]) for i in ids}) > 1 or len({i[p] for i in ids}) >= 1


def test_build_reproduces_the_shipped_file():
    assert tokenizer_fingerprint(build_tokenizer()) == tokenizer_fingerprint(load_tokenizer())


def _write_tokenizer(tmp_path, specials):
    """A differently built byte-level BPE with LFM2's special tokens (stands in for an LFM2 tokenizer.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(prompts(50, seed=4), trainer=trainer)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_other_lfm2_style_tokenizer_loads_and_has_a_prefix(tmp_path):
    path = _write_tokenizer(tmp_path, ["<|pad|>", "<|startoftext|>", "<|im_start|>", "<|im_end|>"])
    tok = load_tokenizer(tmp_path)  # a folder works too
    assert tok.get_vocab_size() == load_tokenizer(path).get_vocab_size()
    p = shared_prefix_length(tok)
    assert p > 3
    ids = encode_prompts(tok, prompts(30, seed=5))
    assert all(i[:p] == ids[0][:p] for i in ids)


def test_missing_special_tokens_are_named(tmp_path):
    _write_tokenizer(tmp_path, ["<|pad|>", "<|im_start|>"])
    with pytest.raises(ConfigError, match=r"no token for <\|startoftext\|>, <\|im_end\|>"):
        load_tokenizer(tmp_path / "tokenizer.json")


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_tokenizer(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "a tokenizer"}))
    with pytest.raises(ConfigError, match="could not be read"):
        load_tokenizer(bad)


def test_shipped_path_is_inside_the_package():
    assert TOKENIZER_PATH.name == "tokenizer.json" and TOKENIZER_PATH.parent.name == "game"
