"""On-policy records (DAgger, dataset aggregation): a policy plays the games, the expert labels every position.

`collect_on_policy(policy, games, seed, beta=...)` lets a policy (e.g. the model being trained, batched on its
device) play the games, and records every position it visits with the EXPERT's action as the label, in the game's
dataset format and version (`tilewise.game.dataset`), so that the records merge with expert data
(`concat_datasets`, or several `--data` files for `tilewise train`). There `played` is the action actually played:
the policy's, or with probability `beta` the expert's (DAgger's mixture policy).

This is training's side of the data: it plays the game and writes the game's format; the game never imports it.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tilewise.errors import ConfigError
from tilewise.game.dataset import (
    GameDataset,
    _assemble,
    _base_meta,
    _check_common,
    _checked_tokenizer,
    _pack_ids,
    _worker_encoder,
    expert_target,
    game_seed,
)

BatchPolicy = Callable[[np.ndarray, np.ndarray], Any]
"""`policy(tokens, lengths) -> actions`: tokens (B, T) right-padded int32 ids, lengths (B,); B actions in 0-5."""


def rollin_pieces(game_id: int, rng: random.Random, prefix_pieces: int) -> int:
    """Pieces the expert plays before the policy takes over in game `game_id` (drawn from the game's own stream).

    Every fourth game (`game_id % 4 == 0`) starts from the empty board, the others after 1..`prefix_pieces`
    expert pieces (uniform); 0 for every game when `prefix_pieces` is 0.
    """
    if prefix_pieces <= 0 or game_id % 4 == 0:
        return 0
    return rng.randint(1, prefix_pieces)


class _OnPolicyShard:
    """Some games of a collection: per position the prompt's ids and the expert's label; then the played action.

    Game g draws its roll-in length and its mixture coins from its own stream (seeded by its engine seed), so which
    games share a worker or a forward batch never changes what is recorded.
    """

    def __init__(self, game_ids: list[int], seeds: list[int], max_pieces: int, beta: float,
                 tok_path: str | None, prefix_pieces: int = 0, policy_pieces: int = 0) -> None:
        from tilewise.game.engine import Game
        from tilewise.game.expert import Expert

        self.enc = _worker_encoder(tok_path)
        self.max_pieces = max_pieces
        self.policy_pieces = policy_pieces
        self.beta = beta
        self.expert = Expert()  # its target cache is keyed by (board, piece): shared by the games
        self.ids = list(game_ids)
        self.seeds = dict(zip(game_ids, seeds))
        self.games = {g: Game(s) for g, s in zip(game_ids, seeds)}
        self.rngs = {g: random.Random(s ^ 0xDA66E5) for g, s in zip(game_ids, seeds)}
        self.rec: dict[int, dict[str, list[Any]]] = {
            g: {"ids": [], "actions": [], "played": [], "policy": [], "pieces": [], "targets": []} for g in game_ids}
        self.pending: list[tuple[int, list[int], int, tuple[int, int]]] = []
        self.start: dict[int, tuple[int, int]] = {}  # (pieces, lines) when the policy took over
        for g in self.ids:  # the expert's roll-in: not recorded (positions like the expert data's)
            game, target = self.games[g], min(rollin_pieces(g, self.rngs[g], prefix_pieces), max_pieces)
            while not game.game_over and game.pieces < target:
                game.step(self.expert.act(game))
            self.start[g] = (game.pieces, game.lines)

    def running(self, g: int) -> bool:
        game = self.games[g]
        return (not game.game_over and game.pieces < self.max_pieces
                and not (self.policy_pieces and game.pieces - self.start[g][0] >= self.policy_pieces))

    def prompts(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(tokens (b, T) uint16, lengths (b,) int32) of the games still running; None when all have ended."""
        from tilewise.game.prompt import render_prompt

        self.pending = []
        for g in self.ids:
            if self.running(g):
                game = self.games[g]
                self.pending.append((g, self.enc.encode(render_prompt(game)), self.expert.act(game),
                                     expert_target(self.expert, game)))
        if not self.pending:
            return None
        lengths = np.array([len(p[1]) for p in self.pending], dtype=np.int32)
        tokens = np.zeros((len(self.pending), int(lengths.max())), dtype=np.uint16)
        for r, (_, ids, _, _) in enumerate(self.pending):
            tokens[r, : len(ids)] = ids
        return tokens, lengths

    def apply(self, actions: Any) -> None:
        """Record each pending position with the expert's label and play the policy's (or the expert's) action."""
        actions = np.asarray(actions).reshape(-1)
        if actions.shape[0] != len(self.pending):
            raise ConfigError(f"the policy returned {actions.shape[0]} actions for {len(self.pending)} positions",
                              "return one action per row of the batch")
        for (g, ids, label, target), a in zip(self.pending, actions.tolist()):
            a = int(a)
            if not 0 <= a <= 5:
                raise ConfigError(f"the policy returned action {a}, outside 0-5",
                                  "take the argmax of the first 6 scores")
            played = a
            if self.beta >= 1.0 or (self.beta > 0.0 and self.rngs[g].random() < self.beta):
                played = label
            rec = self.rec[g]
            rec["ids"].append(ids)
            rec["actions"].append(label)
            rec["played"].append(played)
            rec["policy"].append(a)
            rec["pieces"].append(self.games[g].pieces)
            rec["targets"].append(target)
            self.games[g].step(played)
        self.pending = []

    def results(self) -> list[dict[str, Any]]:
        out = []
        for g in self.ids:
            game, rec = self.games[g], self.rec[g]
            agree = sum(int(p == a) for p, a in zip(rec["policy"], rec["actions"]))
            start_pieces, start_lines = self.start[g]
            tokens, lengths = _pack_ids(rec["ids"], self.enc.tok.token_to_id("<|pad|>"))
            out.append({"game_id": g, "seed": self.seeds[g], "tokens": tokens, "lengths": lengths,
                        "actions": rec["actions"],
                        "played": rec["played"], "pieces": rec["pieces"], "targets": rec["targets"], "agree": agree,
                        "result": {"pieces": game.pieces, "lines": game.lines, "steps": game.steps,
                                   "game_over": game.game_over, "stopped": self.running(g),
                                   "rollin_pieces": start_pieces, "policy_pieces": game.pieces - start_pieces,
                                   "policy_lines": game.lines - start_lines,
                                   "policy_agreement": round(agree / len(rec["actions"]), 4) if rec["actions"]
                                   else None}})
        return out


def _on_policy_worker(conn: Any, job: tuple[Any, ...]) -> None:
    """Worker process: play its games in lockstep, sending each step's prompts and receiving the policy's actions."""
    import traceback

    try:
        shard = _OnPolicyShard(*job)
        while True:
            batch = shard.prompts()
            if batch is None:
                break
            conn.send(("batch", *batch))
            msg = conn.recv()
            if msg[0] == "stop":
                shard.pending = []
                break
            shard.apply(msg[1])
        conn.send(("done", shard.results()))
    except BaseException:  # the parent re-raises it with the traceback
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def collect_on_policy(policy: BatchPolicy, games: int, seed: int, max_pieces: int = 1000, beta: float = 0.0,
                      workers: int | None = None, tokenizer_path: str | Path | None = None,
                      time_budget_s: float = 0.0, max_batch: int = 0, prefix_pieces: int = 0,
                      policy_pieces: int = 0, progress: Callable[[str], None] | None = None,
                      progress_every_s: float = 10.0) -> GameDataset:
    """DAgger's data collection: `policy` plays the games; every visited position is recorded with the expert's label.

    All games advance in lockstep and the policy sees one batch of prompts per call (one forward on its device).
    With `workers` > 1 the games are split over that many processes, which render the prompts, tokenize them and
    ask the expert for its action (the CPU work); this process gathers whichever workers are ready into one batch
    for the policy and sends the actions back, so the policy's device and the workers' CPUs work at once.

    Args:
        policy: `policy(tokens, lengths) -> actions` (see `BatchPolicy`), e.g. `tilewise.train.dagger.torch_policy`.
        games: number of games; game g plays the piece sequence of `game_seed(seed, g)`, as in `generate`.
        seed: dataset seed (non-negative int).
        max_pieces: a game stops after this many pieces (or at game over).
        beta: DAgger's mixture: at each step, with this probability the expert's action is played instead of the
            policy's (the label is the expert's either way). 0: the policy alone plays.
        workers: processes (default: the CPU count, at most `games`); 1 plays in this process. The records do not
            depend on it (for a policy whose action for a prompt does not depend on the rest of its batch).
        tokenizer_path: a tokenizer.json; None for the shipped one (must be the policy's tokenizer).
        time_budget_s: when > 0, stop every game once this much time has passed; positions already played are
            kept, and those games' results say `stopped`.
        max_batch: most prompts per policy call (0: no limit; a larger batch is split).
        prefix_pieces: expert roll-in: games start after the expert has played 1..prefix_pieces pieces (uniform;
            not recorded), except every fourth game (g % 4 == 0), which starts from the empty board; so a short
            collection also reaches the positions of later game phases. 0: every game starts empty.
        policy_pieces: a game also stops after the policy's part has placed this many pieces (0: no cap).
        progress: gets a status line every `progress_every_s` seconds.
        progress_every_s: seconds between status lines.

    Returns:
        A GameDataset in the dataset format (`actions` the expert's labels, `played` what was played, game ids
        0..games-1). `meta["source"]` is "on-policy"; `meta["collector"]` holds beta, `policy_agreement` (share of
        recorded positions where the policy's own action equals the expert's, whether or not it was played),
        the games' mean lines and pieces, `stopped_by_time`, wall time and batch counts. `meta["results"]` has
        per game pieces, lines, steps, game_over, stopped, rollin_pieces, policy_pieces (pieces placed after the
        roll-in), policy_lines and policy_agreement. `collector["from_empty"]` sums up the games without roll-in
        (the policy's own games, capped at `policy_pieces`); `collector["policy_part"]` all games' parts after it.
    """
    seed, games, max_pieces = _check_common(seed, games, max_pieces)
    if not 0.0 <= beta <= 1.0:
        raise ConfigError(f"beta={beta} is outside [0, 1]", "pass a mixture probability such as 0.3")
    if prefix_pieces < 0 or policy_pieces < 0:
        raise ConfigError(f"prefix_pieces={prefix_pieces} / policy_pieces={policy_pieces} is negative",
                          "pass 0 (none) or a positive number of pieces")
    tok_path = None if tokenizer_path is None else str(tokenizer_path)
    tok = _checked_tokenizer(tok_path)
    workers = max(1, min(workers or os.cpu_count() or 1, games))
    seeds = [game_seed(seed, g) for g in range(games)]
    shards = [[g for g in range(games) if g % workers == w] for w in range(workers)]
    stats = {"batches": 0, "rows": 0, "policy_s": 0.0}
    t0 = time.perf_counter()
    t_progress = t0

    def act(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        tp = time.perf_counter()
        out = []
        step = max_batch if max_batch > 0 else tokens.shape[0]
        for start in range(0, tokens.shape[0], step):
            ids = tokens[start: start + step].astype(np.int32)
            out.append(np.asarray(policy(ids, lengths[start: start + step])).reshape(-1))
        stats["batches"] += 1
        stats["rows"] += int(tokens.shape[0])
        stats["policy_s"] += time.perf_counter() - tp
        return np.concatenate(out)

    def over_time() -> bool:
        return bool(time_budget_s) and time.perf_counter() - t0 > time_budget_s

    def report(running: int) -> None:
        nonlocal t_progress
        now = time.perf_counter()
        if progress and now - t_progress >= progress_every_s:
            t_progress = now
            progress(f"on-policy: {stats['rows']} positions, {running} games running, "
                     f"{stats['rows'] / max(now - t0, 1e-9):.0f}/s, {now - t0:.1f} s")

    stopped_by_time = False
    results: list[dict[str, Any]] = []
    if workers == 1:
        shard = _OnPolicyShard(shards[0], [seeds[g] for g in shards[0]], max_pieces, beta, tok_path, prefix_pieces,
                               policy_pieces)
        while (batch := shard.prompts()) is not None:
            if over_time():
                stopped_by_time = True
                shard.pending = []
                break
            shard.apply(act(*batch))
            report(sum(shard.running(g) for g in shard.ids))
        results = shard.results()
    else:
        shard_args = (max_pieces, beta, tok_path, prefix_pieces, policy_pieces)
        results, stopped_by_time = _collect_with_workers(act, shards, seeds, shard_args, over_time, report)
    results.sort(key=lambda r: r["game_id"])
    wall = time.perf_counter() - t0
    meta = _base_meta(tok, tok_path, seed, games, max_pieces)
    n = sum(len(r["actions"]) for r in results)
    finished = [r["result"] for r in results if not r["result"]["stopped"]]

    def part(rows: list[dict[str, Any]]) -> dict[str, Any]:
        if not rows:
            return {"games": 0}
        return {"games": len(rows), "mean_pieces": float(np.mean([r["policy_pieces"] for r in rows])),
                "mean_lines": float(np.mean([r["policy_lines"] for r in rows])),
                "game_over_share": float(np.mean([r["game_over"] for r in rows]))}

    meta.update(explore=0.0, source="on-policy", collector={
        "beta": beta, "workers": workers, "positions": n, "games": games, "prefix_pieces": prefix_pieces,
        "policy_pieces": policy_pieces,
        "policy_agreement": round(sum(r["agree"] for r in results) / n, 4) if n else None,
        "mean_lines": float(np.mean([r["result"]["lines"] for r in results])),
        "mean_pieces": float(np.mean([r["result"]["pieces"] for r in results])),
        "from_empty": part([r["result"] for r in results if r["result"]["rollin_pieces"] == 0]),
        "policy_part": part([r["result"] for r in results]),
        "games_finished": len(finished), "games_at_cap": sum(r["pieces"] >= max_pieces for r in finished),
        "stopped_by_time": stopped_by_time, "wall_s": round(wall, 2), "positions_per_s": round(n / max(wall, 1e-9), 1),
        "policy_calls": stats["batches"], "mean_batch": round(stats["rows"] / max(stats["batches"], 1), 1),
        "policy_s": round(stats["policy_s"], 2),
    })
    return _assemble(results, tok, meta)


def _collect_with_workers(act: Callable[[np.ndarray, np.ndarray], np.ndarray], shards: list[list[int]],
                          seeds: list[int], shard_args: tuple[Any, ...], over_time: Callable[[], bool],
                          report: Callable[[int], None]) -> tuple[list[dict[str, Any]], bool]:
    """Run the shards in worker processes; batch the ready workers' prompts into one policy call per round.

    Returns:
        (per-game results, whether the time budget stopped games).
    """
    import multiprocessing as mp
    from multiprocessing.connection import wait

    from tilewise.errors import TilewiseError

    ctx = mp.get_context("spawn")
    live: dict[Any, int] = {}
    procs = []
    results: list[dict[str, Any]] = []
    stopped = False
    try:
        for w, shard in enumerate(shards):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_on_policy_worker, daemon=True,
                               args=(child, (shard, [seeds[g] for g in shard], *shard_args)))
            proc.start()
            child.close()
            procs.append(proc)
            live[parent] = w
        while live:
            requests = []
            for conn in wait(list(live)):
                try:
                    msg = conn.recv()
                except EOFError:
                    raise TilewiseError(f"on-policy worker {live[conn]} exited without sending its games",
                                        "look for a crash above (out of memory?) and run again") from None
                if msg[0] == "done":
                    results.extend(msg[1])
                    del live[conn]
                elif msg[0] == "error":
                    raise TilewiseError(f"on-policy worker {live[conn]} failed:\n{msg[1]}",
                                        "fix the error above (the policy's actions must be 0-5)")
                else:
                    requests.append((conn, msg[1], msg[2]))
            if not requests:
                continue
            if over_time():
                stopped = True
                for conn, _, _ in requests:
                    conn.send(("stop",))
                continue
            width = max(t.shape[1] for _, t, _ in requests)
            tokens = np.concatenate([t if t.shape[1] == width else np.pad(t, ((0, 0), (0, width - t.shape[1])))
                                     for _, t, _ in requests])
            actions = act(tokens, np.concatenate([n for _, _, n in requests]))
            start = 0
            for conn, t, _ in requests:
                conn.send(("act", actions[start: start + t.shape[0]].astype(np.int64)))
                start += t.shape[0]
            report(tokens.shape[0])
    finally:
        for conn in live:
            conn.close()
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
    return results, stopped
