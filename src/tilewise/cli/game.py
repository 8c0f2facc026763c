"""`tilewise play` and `tilewise game prompt | tokenizer | eval | dataset`: the game, its data and its players."""

from __future__ import annotations

import argparse
import sys

from tilewise.cli import common


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `play` and `game` commands to the main parser."""
    p = sub.add_parser("play", help="play the polyomino game with a model, the expert or random actions",
                       description="Play the polyomino game. On a terminal the board is drawn live and the stats "
                                   "follow; piped, only the stats are printed.",
                       epilog="examples:\n  tilewise play                       # the bundled model, best device\n"
                              "  tilewise play --policy expert --steps 200 --no-watch --json -")
    p.add_argument("--policy", choices=("model", "expert", "random"), default="model",
                   help="who plays (default: model, the bundled classifier)")
    p.add_argument("--model", default="default", help="model for --policy model: default (bundled), a preset or a path")
    p.add_argument("--device", default="auto",
                   help="device for --policy model: auto (the fastest with a classifier executor), cpu, webgpu, "
                        "webgpu:N, dawn, dawn:N, cuda, cuda:N (default auto)")
    p.add_argument("--steps", type=common.positive, default=500,
                   help="most decisions to make (stops earlier at game over)")
    p.add_argument("--seed", type=common.seed, default=0, help="game seed (piece sequence; also the random policy's)")
    p.add_argument("--watch", action=argparse.BooleanOptionalAction, default=None,
                   help="draw the board live (default: when stdout is a terminal and --json is not -)")
    p.add_argument("--delay-ms", type=common.float_in(0.0, 10_000.0), default=50.0,
                   help="while watching, pause this long after each step so the board can be followed (default 50; "
                        "not counted in the latencies)")
    p.add_argument("--threads", type=common.positive, default=None,
                   help="CPU threads for --device cpu (default: the physical cores available, or OMP_NUM_THREADS)")
    common.add_json(p, "the stats")
    p.set_defaults(func=_cmd_play)

    g = sub.add_parser("game", help="the game's prompt, tokenizer, expert evaluation and training data")
    gs = g.add_subparsers(dest="game_command", metavar="SUBCOMMAND")
    gs.required = True

    q = gs.add_parser("prompt", help="print a prompt and its token counts",
                      epilog="examples:\n  tilewise game prompt --example\n  tilewise game prompt --seed 3 --steps 40")
    q.add_argument("--example", action="store_true", help="seed 001's example position")
    q.add_argument("--seed", type=common.seed, default=0, help="game seed")
    q.add_argument("--steps", type=common.non_negative, default=0, help="expert steps to play before printing")
    q.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the shipped one)")
    q.set_defaults(func=_cmd_prompt)

    t = gs.add_parser("tokenizer", help="vocabulary size, example prompt length and cacheable prefix",
                      epilog="examples:\n  tilewise game tokenizer\n  tilewise game tokenizer --json -")
    t.add_argument("--path", default=None, help="tokenizer.json or a folder with one (default: the shipped one)")
    common.add_json(t, "the tokenizer facts")
    t.set_defaults(func=_cmd_tokenizer)

    e = gs.add_parser("eval", help="mean lines and pieces of a policy over seeded games",
                      epilog="examples:\n  tilewise game eval --games 5\n"
                             "  tilewise game eval --policy model --games 3 --max-pieces 200 --json eval.json")
    e.add_argument("--policy", choices=("expert", "random", "model"), default="expert", help="who plays")
    e.add_argument("--model", default="default", help="model for --policy model: default (bundled), a preset or a path")
    e.add_argument("--device", default="auto",
                   help="device for --policy model: auto, cpu, webgpu, webgpu:N, dawn, dawn:N (default auto)")
    e.add_argument("--games", type=common.int_at_least(1, 100_000), default=20, help="games to play")
    e.add_argument("--max-pieces", type=common.positive, default=1000, help="pieces per game at most")
    e.add_argument("--seed", type=common.seed, default=0, help="first game seed (game g uses seed + g)")
    common.add_json(e, "the per-game results and means")
    e.set_defaults(func=_cmd_eval)

    d = gs.add_parser("dataset", help="expert decisions as training records (.npz, format version 1)",
                      epilog="example:\n  tilewise game dataset --games 50 --seed 1 --out train.npz")
    d.add_argument("--games", type=common.int_at_least(1, 1_000_000), required=True, help="games to record")
    d.add_argument("--seed", type=common.seed, required=True, help="first game seed (game g uses seed + g)")
    d.add_argument("--out", required=True, type=_npz_path, help="output file (.npz)")
    d.add_argument("--max-pieces", type=common.positive, default=1000, help="pieces per game at most")
    d.add_argument("--explore", type=common.float_in(0.0, 1.0), default=0.02,
                   help="probability of a random rotation/move instead of the expert's (labels stay the expert's)")
    d.add_argument("--detour", type=common.float_in(0.0, 1.0), default=0.0,
                   help="probability that a new piece first takes 1-3 random sideways steps (labels stay the "
                        "expert's: shifted, unrotated pieces the expert's own order never shows)")
    d.add_argument("--workers", type=common.int_at_least(1, 1024), default=None, help="processes (default: CPU count)")
    d.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the shipped one)")
    d.set_defaults(func=_cmd_dataset)


def _npz_path(text: str) -> str:
    if not text.endswith(".npz"):
        raise argparse.ArgumentTypeError(f"--out {text!r} must end in .npz (numpy's archive format)")
    return common.output_file(text, "--out")


def _cmd_play(args: argparse.Namespace) -> int:
    from tilewise.game.play import board_panel, make_policy, play

    if args.threads is not None:
        from tilewise.devices.cpu import set_threads

        set_threads(args.threads)
    policy = make_policy(args.policy, model=args.model, device=args.device, seed=args.seed)
    choice = getattr(getattr(policy, "model", None), "device_choice", None)
    if choice is not None:
        print(choice.line(), file=sys.stderr, flush=True)
    else:
        print(f"policy {args.policy}: no model, so no device", file=sys.stderr, flush=True)
    tty = sys.stdout.isatty() and args.json != common.STDOUT
    watch = tty if args.watch is None else args.watch and tty
    if args.watch and not watch:
        print("note: --watch draws only when stdout is a terminal (and --json is not -); playing without it",
              file=sys.stderr)
    if watch:
        import time

        from rich.live import Live

        from tilewise.game.engine import Game, StepResult
        from tilewise.game.play import ColorBoard

        colors = ColorBoard()
        with Live(board_panel(Game(args.seed), policy.name, None, None), refresh_per_second=30,
                  auto_refresh=False) as live:

            def draw(game: Game, result: StepResult, latency_ms: float) -> None:
                colors.update(result)
                live.update(board_panel(game, policy.name, result.action, latency_ms, colors), refresh=True)
                if args.delay_ms > 0:
                    time.sleep(args.delay_ms / 1e3)  # display pacing only; latencies are measured around decide()

            stats = play(policy, steps=args.steps, seed=args.seed, on_step=draw)
    else:
        stats = play(policy, steps=args.steps, seed=args.seed)
    out = common.console(args)
    common.emit_json(args.json, stats.as_dict(), out.print)
    if args.json == common.STDOUT:
        return 0
    from rich.table import Table

    table = Table(title=f"{stats.policy} on {stats.device}, seed {stats.seed}")
    table.add_column("stat")
    table.add_column("value", justify="right")
    rows = [("decisions", stats.steps), ("pieces", stats.pieces), ("lines", stats.lines),
            ("game over", "yes" if stats.game_over else "no"), ("decisions/s", f"{stats.decisions_per_s:.1f}"),
            ("APM", f"{stats.apm:.0f}"), ("latency mean", f"{stats.latency_ms_mean:.3f} ms"),
            ("latency p50", f"{stats.latency_ms_p50:.3f} ms"), ("latency p90", f"{stats.latency_ms_p90:.3f} ms")]
    for k in ("prompt_ms_p50", "model_ms_p50"):  # the model policy's decision, split
        if k in stats.extra:
            rows.append((f"  {k.split('_')[0]} p50", f"{stats.extra[k]:.3f} ms"))
    for k in ("prompt_tokens", "prefix_tokens", "full_prefills"):
        if k in stats.extra:
            rows.append((k.replace("_", " "), stats.extra[k]))
    for k, v in rows:
        table.add_row(k, str(v))
    out.print(table)
    return 0


def _cmd_prompt(args: argparse.Namespace) -> int:
    from tilewise.game.engine import Game
    from tilewise.game.expert import Expert
    from tilewise.game.prompt import render_prompt
    from tilewise.game.tokenizer import encode_prompt, example_prompt, load_tokenizer, shared_prefix_length

    tok = load_tokenizer(args.tokenizer)
    if args.example:
        text = example_prompt()
    else:
        game = Game(args.seed)
        expert = Expert()
        for _ in range(max(0, args.steps)):
            if game.game_over:
                break
            game.step(expert.act(game))
        text = render_prompt(game)
    print(text)
    print(f"\n[{len(encode_prompt(tok, text))} tokens; the first {shared_prefix_length(tok)} are shared by every "
          f"prompt]", file=sys.stderr)
    return 0


def _cmd_tokenizer(args: argparse.Namespace) -> int:
    from tilewise.game.tokenizer import (
        TOKENIZER_PATH,
        encode_prompt,
        example_prompt,
        load_tokenizer,
        shared_prefix_length,
        tokenizer_fingerprint,
    )

    tok = load_tokenizer(args.path)
    info = {"path": str(args.path or TOKENIZER_PATH.name), "vocab_size": tok.get_vocab_size(),
            "example_prompt_tokens": len(encode_prompt(tok, example_prompt())),
            "shared_prefix_tokens": shared_prefix_length(tok), "fingerprint": tokenizer_fingerprint(tok),
            "special_tokens": {t: tok.token_to_id(t) for t in ("<|pad|>", "<|startoftext|>", "<|im_start|>",
                                                                  "<|im_end|>")}}
    common.emit_json(args.json, info, lambda line: print(line, file=sys.stderr))
    if args.json != common.STDOUT:
        for k, v in info.items():
            print(f"{k}: {v}")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    import time

    from tilewise.game.play import ExpertPolicy, Policy, RandomPolicy, evaluate_policy, load_model_policy

    model_policy = load_model_policy(args.model, args.device) if args.policy == "model" else None

    def make(seed: int) -> Policy:
        if model_policy is not None:
            return model_policy  # stateless between decisions: the cached prefix is shared by every game
        return ExpertPolicy() if args.policy == "expert" else RandomPolicy(seed)

    t0 = time.perf_counter()
    result = evaluate_policy(make, games=args.games, max_pieces=args.max_pieces, seed=args.seed)
    result["policy"] = args.policy
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    common.emit_json(args.json, result, lambda line: print(line, file=sys.stderr))
    if args.json == common.STDOUT:
        return 0
    for r in result["per_game"]:
        print(f"seed {r['seed']}: {r['pieces']} pieces, {r['lines']} lines, {r['steps']} steps"
              f"{' (game over)' if r['game_over'] else ''}")
    print(f"{args.policy}: mean {result['mean_lines']:.1f} lines, {result['mean_pieces']:.1f} pieces over "
          f"{args.games} games (cap {args.max_pieces} pieces; {result['games_at_cap']} reached it) "
          f"in {result['wall_s']} s")
    return 0


def _cmd_dataset(args: argparse.Namespace) -> int:
    import time

    from tilewise.game.dataset import generate, write_dataset

    t0 = time.perf_counter()
    data = generate(args.games, args.seed, max_pieces=args.max_pieces, explore=args.explore, workers=args.workers,
                    tokenizer_path=args.tokenizer, progress=lambda line: print(line, file=sys.stderr, flush=True),
                    detour=args.detour)
    path = write_dataset(data, args.out)
    dt = time.perf_counter() - t0
    print(f"wrote {path}: {len(data)} decisions from {args.games} games, {data.tokens.shape[1]} tokens per prompt, "
          f"in {dt:.1f} s ({len(data) / dt:.0f} decisions/s)")
    return 0
