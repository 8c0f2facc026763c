"""Play loop: prefix caching against a fake model, argmax over 6 of 8 scores, stats, CLI, missing model."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tilewise.cli import main
from tilewise.errors import TilewiseError
from tilewise.game.expert import Expert
from tilewise.game.play import ExpertPolicy, ModelPolicy, RandomPolicy, board_panel, load_model_policy, play
from tilewise.game.prompt import parse_prompt
from tilewise.game.tokenizer import encode_prompt, load_tokenizer

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "seed001_prompt.txt"
TOK = load_tokenizer()


class FakeModel:
    """prefill/extend/scores over immutable tuple states; `score_fn(ids)` gives the 8 scores."""

    device = "fake"

    def __init__(self, score_fn, tokenizer=None):
        self.score_fn = score_fn
        self.tokenizer = tokenizer
        self.prefills: list[list[int]] = []
        self.extends: list[tuple[tuple, list[int]]] = []

    def prefill(self, ids):
        self.prefills.append(list(ids))
        return tuple(ids)

    def extend(self, state, ids):
        self.extends.append((state, list(ids)))
        return state + tuple(ids)

    def scores(self, state):
        return self.score_fn(list(state))


def oracle_scores(ids: list[int]) -> np.ndarray:
    """The expert's action as the best of the first 6 scores; the reserved 6 and 7 score higher still."""
    game = parse_prompt(TOK.decode(ids, skip_special_tokens=False)).to_game()
    rng = np.random.default_rng(len(ids) + sum(ids))
    scores = rng.uniform(-1.0, 0.0, 8)
    scores[Expert().act(game)] = 1.0
    scores[6:] = 5.0
    return scores


def test_model_policy_prefills_the_prefix_once_and_extends_per_decision():
    model = FakeModel(oracle_scores)
    policy = ModelPolicy(model)
    stats = play(policy, steps=40, seed=3)
    assert len(model.prefills) == 1 and len(model.prefills[0]) == policy.prefix_tokens == 42
    assert len(model.extends) == stats.steps == 40
    for base, rest in model.extends:
        assert base is policy.prefix_state  # every decision branches off the same cached prefix
        assert len(base) + len(rest) == 348
    assert policy.full_prefills == 0 and stats.extra["prefix_tokens"] == 42


def test_model_policy_tokens_are_the_prompt_tokens():
    seen = []
    model = FakeModel(lambda ids: seen.append(ids) or np.eye(8)[4])
    policy = ModelPolicy(model)
    from tilewise.game.engine import Game
    from tilewise.game.prompt import render_prompt

    g = Game(8)
    assert policy.decide(g) == 4
    assert seen[-1] == encode_prompt(TOK, render_prompt(g))


def test_model_with_oracle_scores_plays_exactly_like_the_expert():
    a = play(ModelPolicy(FakeModel(oracle_scores)), steps=150, seed=12)
    b = play(ExpertPolicy(), steps=150, seed=12)
    assert (a.pieces, a.lines, a.steps) == (b.pieces, b.lines, b.steps)
    assert a.extra["actions"] == b.extra["actions"]


def test_argmax_ignores_reserved_outputs():
    rng = np.random.default_rng(0)
    for _ in range(20):
        s = rng.normal(size=8)
        s[6:] = s.max() + 1.0
        policy = ModelPolicy(FakeModel(lambda ids, s=s: s))
        from tilewise.game.engine import Game

        assert policy.decide(Game(0)) == int(np.argmax(s[:6]))


@pytest.mark.parametrize("scores, match", [
    (np.zeros(6), "6 scores, expected 8"),
    (np.array([np.nan] + [0.0] * 7), "non-finite"),
])
def test_bad_scores_raise(scores, match):
    from tilewise.game.engine import Game

    policy = ModelPolicy(FakeModel(lambda ids: scores))
    with pytest.raises(TilewiseError, match=match):
        policy.decide(Game(0))


def test_a_model_without_the_api_is_refused():
    with pytest.raises(TilewiseError, match="no extend"):
        ModelPolicy(type("M", (), {"prefill": lambda s, i: i, "scores": lambda s, st: st})())


def test_model_tokenizer_is_used_when_present():
    model = FakeModel(lambda ids: np.eye(8)[1], tokenizer=TOK)
    policy = ModelPolicy(model)
    assert policy.tokenizer is TOK


def test_stats_are_consistent():
    stats = play(RandomPolicy(5), steps=30, seed=5)
    assert 1 <= stats.steps <= 30 and stats.policy == "random" and stats.device == "cpu"
    assert stats.latency_ms_p50 <= stats.latency_ms_p90
    assert stats.apm == pytest.approx(60 * stats.decisions_per_s, rel=1e-3)
    assert sum(stats.extra["actions"].values()) == stats.steps
    expert = play(ExpertPolicy(), steps=400, seed=5)
    assert expert.steps == 400 and not expert.game_over and expert.lines > 10


class SlowModel(FakeModel):
    """A FakeModel whose extend takes at least `busy_ms` (a busy wait: the model's share of a decision)."""

    def __init__(self, score_fn, busy_ms):
        super().__init__(score_fn)
        self.busy_ms = busy_ms

    def extend(self, state, ids):
        end = time.perf_counter() + self.busy_ms / 1e3
        while time.perf_counter() < end:
            pass
        return super().extend(state, ids)


def test_play_splits_a_model_decision_into_prompt_and_model_time():
    """Each decision's latency holds its prompt part (render + tokenize) and its model part (extend + scores), so
    the medians are ordered the same way; the model part holds the model's own time."""
    stats = play(ModelPolicy(SlowModel(oracle_scores, busy_ms=2.0)), steps=25, seed=3, compare_expert=False)
    prompt_ms, model_ms = stats.extra["prompt_ms_p50"], stats.extra["model_ms_p50"]
    assert model_ms >= 2.0
    assert 0.0 < prompt_ms < model_ms <= stats.latency_ms_p50
    assert stats.latency_ms_p50 >= prompt_ms
    assert "prompt_ms_p50" not in play(ExpertPolicy(), steps=5, seed=3).extra  # only the model policy has parts


def test_missing_model_suggests_the_expert(monkeypatch):
    from tilewise.model import runtime

    def no_model(*args, **kwargs):
        raise TilewiseError("no bundled model is present", "pass a model path")

    monkeypatch.setattr(runtime, "load", no_model)
    with pytest.raises(TilewiseError, match="no bundled model") as info:
        load_model_policy("default", "cpu")
    assert "--policy expert" in info.value.fix and "pass a model path" in info.value.fix
    assert main(["play", "--policy", "model", "--steps", "2"]) == 2


# ------------------------------------------------------------------ CLI

def test_cli_play_json(capsys):
    assert main(["play", "--policy", "expert", "--steps", "60", "--seed", "2", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("policy", "device", "steps", "pieces", "lines", "decisions_per_s", "apm", "latency_ms_p50",
                "latency_ms_p90"):
        assert key in out
    assert out["policy"] == "expert" and out["steps"] == 60


def test_cli_play_table_and_watch_needs_a_terminal(capsys):
    assert main(["play", "--policy", "random", "--steps", "20", "--watch"]) == 0
    captured = capsys.readouterr()
    assert "only when stdout is a terminal" in captured.err
    assert "latency p90" in captured.out


def test_cli_game_prompt_example_matches_golden(capsys):
    assert main(["game", "prompt", "--example"]) == 0
    captured = capsys.readouterr()
    assert captured.out.removesuffix("\n") == GOLDEN.read_text().removesuffix("\n")
    assert "348 tokens; the first 42" in captured.err


def test_cli_game_tokenizer_and_eval(capsys):
    assert main(["game", "tokenizer", "--json", "-"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["example_prompt_tokens"] == 348 and info["shared_prefix_tokens"] == 42
    assert main(["game", "eval", "--policy", "random", "--games", "3", "--json", "-"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["games"] == 3 and len(res["per_game"]) == 3 and res["mean_pieces"] > 0


def test_cli_game_dataset(tmp_path, capsys):
    out = tmp_path / "d.npz"
    assert main(["game", "dataset", "--games", "2", "--seed", "4", "--max-pieces", "3", "--workers", "1",
                 "--out", str(out)]) == 0
    assert "decisions from 2 games" in capsys.readouterr().out
    from tilewise.game.dataset import read_dataset

    assert len(read_dataset(out)) > 0


def test_cli_rejects_non_integer_seed(capsys):
    assert main(["play", "--policy", "expert", "--seed", "abc"]) == 2
    err = capsys.readouterr().err
    assert "expected a whole number, got 'abc'" in err and "fix: see `tilewise play --help`" in err


def test_board_panel_draws_the_board():
    from rich.console import Console

    from tilewise.game.engine import Game

    g = Game(1)
    console = Console(record=True, width=100)
    console.print(board_panel(g, "expert", 2, 0.5))
    text = console.export_text()
    assert text.count("[]") == g.piece.size and g.piece.name in text and "rotate_cw" in text


def test_real_runtime_with_a_tiny_random_model():
    """When the model runtime exists, play drives it through the same prefix-cached path."""
    pytest.importorskip("tilewise.model.runtime")
    import tilewise

    try:
        model = tilewise.load("tiny", device="cpu", weights="nf4")
    except TilewiseError as exc:
        pytest.skip(f"tiny preset not loadable: {exc}")
    policy = ModelPolicy(model)
    stats = play(policy, steps=3, seed=0)
    assert stats.steps == 3 and policy.full_prefills == 0
    from tilewise.game.engine import Game
    from tilewise.game.prompt import render_prompt

    ids = encode_prompt(policy.tokenizer, render_prompt(Game(0)))
    cached = model.scores(model.extend(policy.prefix_state, ids[policy.prefix_tokens:]))
    full = model.scores(model.prefill(ids))
    np.testing.assert_allclose(cached, full, rtol=1e-4, atol=1e-5)


def test_expert_agreement_is_reported_for_the_model_policy():
    oracle = play(ModelPolicy(FakeModel(oracle_scores)), steps=60, seed=4)
    assert oracle.extra["expert_agreement"] == 1.0
    soft = play(ModelPolicy(FakeModel(lambda ids: np.eye(8)[0])), steps=30, seed=4)
    assert soft.extra["expert_agreement"] == 0.0  # the expert never soft drops
    assert "expert_agreement" not in play(RandomPolicy(1), steps=10, seed=1).extra


def test_cli_game_eval_with_a_model(monkeypatch, capsys):
    from tilewise.model import runtime

    monkeypatch.setattr(runtime, "load", lambda *a, **k: FakeModel(oracle_scores))
    assert main(["game", "eval", "--policy", "model", "--games", "2", "--max-pieces", "15", "--json", "-"]) == 0
    model = json.loads(capsys.readouterr().out)
    assert main(["game", "eval", "--policy", "expert", "--games", "2", "--max-pieces", "15", "--json", "-"]) == 0
    expert = json.loads(capsys.readouterr().out)
    assert model["per_game"] == expert["per_game"]


def test_color_board_tracks_the_settled_cells():
    from tilewise.game.engine import Game
    from tilewise.game.play import ColorBoard

    g = Game(6)
    ex = Expert()
    colors = ColorBoard()
    cleared = 0
    while g.pieces < 80:
        res = g.step(ex.act(g))
        cleared += len(res.cleared_rows)
        colors.update(res)
        painted = [sum(1 << c for c in range(11) if colors.rows[r][c]) for r in range(21)]
        assert painted == g.board
    assert cleared == g.lines > 0


def test_play_refuses_a_device_without_a_classifier_executor(capsys):
    assert main(["play", "--policy", "model", "--device", "tvm-llvm", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "the classifier has no executor for 'tvm-llvm'" in err
    assert "use --device cuda, cuda:N, webgpu, webgpu:N, dawn, dawn:N, cpu or auto" in err


def test_play_says_which_device_it_plays_on(capsys):
    assert main(["play", "--policy", "model", "--device", "cpu", "--steps", "2", "--json", "-"]) == 0
    out = capsys.readouterr()
    assert out.err.startswith("device: cpu (") and json.loads(out.out)["device"] == "cpu"


def _run_on_a_terminal(argv: list[str]) -> str:
    """Run `tilewise argv` with stdout on a pseudo-terminal (as a user's shell has it) and return what it drew."""
    import os
    import pty
    import subprocess

    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "LINES": "40", "TERM": "xterm-256color"}
    proc = subprocess.Popen([sys.executable, "-m", "tilewise", *argv], stdout=follower, stderr=subprocess.PIPE,
                            env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the terminal closes when the process ends
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(leader)
    assert proc.returncode == 0, proc.stderr.read().decode()
    return b"".join(chunks).decode(errors="replace")


def test_play_draws_the_board_by_default_on_a_terminal():
    drawn = _run_on_a_terminal(["play", "--policy", "expert", "--steps", "8", "--delay-ms", "0"])
    assert "tilewise" in drawn and "[]" in drawn and "next" in drawn  # the live board panel
    assert "decisions" in drawn and "latency p50" in drawn  # and the stats after it


def test_play_piped_prints_only_the_stats():
    import subprocess

    run = subprocess.run([sys.executable, "-m", "tilewise", "play", "--policy", "expert", "--steps", "8"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0
    assert "latency p50" in run.stdout and "[]" not in run.stdout
    assert "policy expert: no model, so no device" in run.stderr


def test_no_watch_keeps_the_terminal_plain():
    drawn = _run_on_a_terminal(["play", "--policy", "expert", "--steps", "8", "--no-watch"])
    assert "[]" not in drawn and "latency p50" in drawn
