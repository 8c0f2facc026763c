"""Tokenizer: shipped file, token counts, fixed length, shared prefix, rebuild, other LFM2-style tokenizers."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilewise.errors import ConfigError
from tilewise.game.engine import Game
from tilewise.game.prompt import render_prompt
from tilewise.game.tokenizer import (
    SPECIAL_TOKENS,
    TOKENIZER_PATH,
    PromptEncoder,
    build_tokenizer,
    encode_prompt,
    encode_prompts,
    encodes_line_by_line,
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


SHIPPED = load_tokenizer()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), moves=st.lists(st.integers(0, 5), max_size=120))
def test_prompt_encoder_gives_the_librarys_ids_for_random_games(seed, moves):
    enc = PromptEncoder(SHIPPED, max_lines=16)  # small: the store empties and refills within a prompt
    assert enc.line_by_line
    game = Game(seed)
    for move in [0, *moves]:
        if game.game_over:
            break
        text = render_prompt(game)
        assert enc(text) == encode_prompt(SHIPPED, text)
        assert len(enc._lines) <= 16
        game.step(move)


def test_prompt_encoder_handles_any_text_the_library_does():
    enc = PromptEncoder(SHIPPED)
    rng = random.Random(7)
    alphabet = "ab .#%:09\n\t<>/|é😀" + "".join(SPECIAL_TOKENS)
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        assert enc(text) == encode_prompt(SHIPPED, text), repr(text)


def _trained(pre_tokenizer, specials=SPECIAL_TOKENS):
    from tokenizers import Tokenizer, models, trainers

    tok = Tokenizer(models.BPE())
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=list(specials), show_progress=False)
    tok.train_from_iterator(prompts(20, seed=9), trainer=trainer)
    return tok


def test_a_tokenizer_that_merges_across_newlines_is_encoded_whole():
    tok = _trained(None)  # no pre-tokenizer: BPE learns merges such as ".\n."
    texts = prompts(10, seed=3)
    newline = tok.encode("\n", add_special_tokens=False).ids
    joined = []
    for t in texts:
        ids: list[int] = []
        for line in t.split("\n"):
            ids += tok.encode(line, add_special_tokens=False).ids + newline
        joined.append(ids[:len(ids) - len(newline)])
    assert any(a != encode_prompt(tok, t) for a, t in zip(joined, texts))  # joining lines would be wrong here
    enc = PromptEncoder(tok)
    assert not encodes_line_by_line(tok) and not enc.line_by_line
    assert all(enc(t) == encode_prompt(tok, t) for t in texts)


def test_line_by_line_needs_the_shipped_pretokenization_and_plain_special_tokens():
    from tokenizers import AddedToken, pre_tokenizers

    assert not encodes_line_by_line(_trained(pre_tokenizers.ByteLevel(add_prefix_space=False)))
    retrained = build_tokenizer()
    assert encodes_line_by_line(retrained)
    retrained.add_special_tokens([AddedToken("<x>", rstrip=True)])  # would eat the newline after it
    assert not encodes_line_by_line(retrained)
    text = "a<x>\nb"
    assert PromptEncoder(retrained)(text) == encode_prompt(retrained, text)
