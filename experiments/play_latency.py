"""Where a `tilewise play` decision's time goes: the same decisions timed whole, in parts, and with a gap.

`tilewise play` reports a decision's latency from the board to the action (prompt render, tokenizer, model). On the
bundled model through CUDA it read 0.66 ms p50 where the model bench's decision read 0.39 ms. This splits the gap:

    parts     one position, decided back to back: render, encode, extend (with its read-back) and scores timed
              apart; and the same ids prefilled whole (as the model bench decides)
    b2b       the same position decided whole, back to back (no game step, no expert between decisions)
    gap-US    as b2b with a busy wait of US microseconds between decisions (the play loop's host work between
              two decisions: game step, expert comparison), to see if an idle GPU or host thread costs a decision
    wake-US   as gap-US, but a tiny kernel is launched (not waited for) before the prompt is rendered, so the GPU
              wakes while the host works: if the gap's cost is the GPU waking up, this takes it back (CUDA only;
              the timed window starts before that launch)
    play      `play()` with and without the expert comparison, as `tilewise play` runs it

Each mode runs ROUNDS times, interleaved in a fresh random order each round; the table gives the median of each
mode's per-decision samples with their 10th and 90th percentiles.

    PYTHONPATH=src python3 experiments/play_latency.py [--device cuda] [--decisions 100] [--rounds 5] [--out DIR]
"""
from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from tilewise.game import Game
from tilewise.game.play import load_model_policy, play
from tilewise.game.prompt import render_prompt


def busy_wait_us(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def waker(model: object) -> object:
    """A function that launches one tiny kernel on the model's CUDA stream without waiting for it (None where the
    model does not run on the CUDA executor)."""
    dev = getattr(getattr(model, "executor", None), "dev", None)
    if getattr(getattr(dev, "info", None), "backend", None) != "cuda":
        return None
    from tilewise.kernels.rowops.cuda import copy_launch, copy_program

    prog = copy_program(dev)
    src, dst = dev.upload(np.arange(256, dtype=np.float32)), dev.allocate(4 * 256)
    launch = copy_launch(prog, src, 0, dst, 0, 256)
    return lambda: dev.run([launch])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model", default="default")
    ap.add_argument("--decisions", type=int, default=100, help="decisions per mode and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gaps-us", default="100,300,1000", help="busy waits between decisions, comma-separated")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    pol = load_model_policy(args.model, args.device)
    game = Game(7)
    for _ in range(5):  # a position a few moves into the game (one fixed position for every mode)
        game.step(pol.decide(game))
    n = args.decisions
    samples: dict[str, list[float]] = {}

    def add(mode: str, ms: float) -> None:
        samples.setdefault(mode, []).append(ms)

    def parts() -> None:
        m, p = pol.model, pol.prefix_tokens
        for _ in range(n):
            t0 = time.perf_counter()
            text = render_prompt(game)
            t1 = time.perf_counter()
            ids = pol._encode(text)
            t2 = time.perf_counter()
            state = m.extend(pol.prefix_state, ids[p:])
            t3 = time.perf_counter()
            np.asarray(m.scores(state))
            t4 = time.perf_counter()
            np.asarray(m.scores(m.prefill(ids)))
            t5 = time.perf_counter()
            for mode, a, b in (("part render", t0, t1), ("part encode", t1, t2), ("part extend", t2, t3),
                               ("part scores", t3, t4), ("parts whole", t0, t4), ("prefill+scores", t4, t5)):
                add(mode, (b - a) * 1e3)

    wake = waker(pol.model)

    def b2b(gap_us: float, woken: bool = False) -> None:
        name = ("b2b" if gap_us == 0 else f"gap-{gap_us:g}us") + (" wake" if woken else "")
        for _ in range(n):
            busy_wait_us(gap_us)
            t0 = time.perf_counter()
            if woken:
                wake()  # type: ignore[misc]
            pol.decide(game)
            add(name, (time.perf_counter() - t0) * 1e3)

    def play_mode(expert: bool) -> None:
        name = f"play expert={expert}"
        play(pol, steps=n, seed=random.randrange(1 << 20), compare_expert=expert,
             on_step=lambda _g, _r, ms: add(name, ms))

    gaps = [float(g) for g in args.gaps_us.split(",") if g]
    modes = [parts, lambda: b2b(0), *[(lambda g=g: b2b(g)) for g in gaps],
             lambda: play_mode(False), lambda: play_mode(True)]
    if wake is not None:
        modes += [(lambda g=g: b2b(g, True)) for g in gaps]
    for m in modes:  # warm-up: plans, graphs and caches for every mode
        m()
    samples.clear()
    for _ in range(args.rounds):
        random.shuffle(modes)
        for m in modes:
            m()

    rows = []
    print(f"{pol.device}: {args.model}, {args.rounds} rounds x {n} decisions a mode")
    print(f"{'mode':<22} {'p50 ms':>8} {'p10':>8} {'p90':>8} {'n':>6}")
    for mode in sorted(samples):
        a = np.array(samples[mode])
        row = {"mode": mode, "p50_ms": float(np.median(a)), "p10_ms": float(np.percentile(a, 10)),
               "p90_ms": float(np.percentile(a, 90)), "n": int(a.size)}
        rows.append(row)
        print(f"{mode:<22} {row['p50_ms']:8.4f} {row['p10_ms']:8.4f} {row['p90_ms']:8.4f} {row['n']:6d}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        rec = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
               "device": pol.device, "command": " ".join(sys.argv), "rows": rows}
        (out / "play_latency.json").write_text(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
