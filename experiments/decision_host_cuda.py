"""How much of a CUDA decision's wall-clock time is the host's? (one model, the device's tuned table, graph replays)

The model benchmark times `model.scores(model.prefill(ids))` on the host clock. On the GPU a decision is one graph
replay; everything else is host work in series with it: the token checks and the state (`Model`), the plan lookup
and the staging of the ids (`CUDAExecutor.forward`), the graph launch call and the wait for the stream. This times
the same decisions four ways, interleaved round by round on the same prompts:

    whole     model.scores(model.prefill(ids)), as `bench/model_cuda.py` times a decision
    forward   executor.forward(ids, 0, None, True): the executor alone
    replay    the plan's graph replayed and waited for (the ids already staged): the launch call and the wait
    events    as replay, with CUDA events recorded on the stream before and after the replay; their elapsed time is
              the GPU's span of the graph (first node to last), the rest of the wall-clock time the launch and wait

So whole - forward is the model's host work, forward - replay the executor's, replay - span the launch call and the
wait, and whole - span the host's whole share (events - replay is what recording and reading the events cost, so the
span is not subtracted from the events mode's own time). Each replay's result row (the normed hidden state and the
GPU's scores) is checked against its prompt's first decision, every value, same bits.

    PYTHONPATH=src python3 experiments/decision_host_cuda.py [--preset lfm2-350m] [--seq 346] [--out DIR]
"""

from __future__ import annotations

import argparse

import numpy as np

from tilewise.model.bench import PREFIX_TOKENS, prompts, race_args, race_lines, race_modes, write_race
from tilewise.model.runtime import from_checkpoint, open_checkpoint
from tilewise.tune.measure import summarize

MODES = ("whole", "forward", "replay", "events")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    race_args(ap, "lfm2-350m", 346, "mode")
    ap.add_argument("--weights", default="nf4", help="weight format")
    ap.add_argument("--out", help="folder for decision_host_cuda.json")
    args = ap.parse_args()
    ck = open_checkpoint(args.preset, weights=args.weights)
    model = from_checkpoint(ck, device=args.device, quiet=True)
    ex = model.executor
    if not getattr(ex, "graphs", False) or not hasattr(ex, "_graph"):
        raise SystemExit(f"{args.device}: the executor does not replay CUDA graphs; this needs --device cuda with "
                         "graphs on (TILEWISE_CUDA_GRAPHS unset)")
    dev = ex.dev
    cp, stream = dev._cp, dev._stream
    _, full = prompts(ck.config.vocab_size, args.seq, 16, PREFIX_TOKENS, seed=5)
    n_res = ck.config.hidden_size + ck.config.num_labels
    first = []  # each prompt's result row, as its first decision left it in the executor's staging array
    for ids in full:
        model.prefill(ids)
        first.append(ex._res_host[:n_res].copy())
    # the plan every prompt of this length shares; its caches go straight back to the pool, so the whole and forward
    # modes decide on the same caches and replay the same graph
    plan = ex.plan(full[0], 0, None, True)[0]
    graph = ex._graph(plan)
    spans_ms: list[float] = []
    bad: list[int] = []
    ev0, ev1 = cp.cuda.Event(), cp.cuda.Event()
    mode = {"m": "whole"}

    def replay(i: int, events: bool) -> None:
        ex._ids_host[:args.seq] = full[i % len(full)]
        if events:
            with dev._dev:
                ev0.record(stream)
                graph.launch(wait=False)
                ev1.record(stream)
                ev1.synchronize()
            if i >= 0:  # a timed call (warm-up and switch calls have negative indices)
                spans_ms.append(float(cp.cuda.get_elapsed_time(ev0, ev1)))
        else:
            graph.launch()
        if not np.array_equal(ex._res_host[:n_res], first[i % len(full)]):
            bad.append(i)

    def decide(i: int) -> None:
        m = mode["m"]
        if m == "whole":
            model.scores(model.prefill(full[i % len(full)]))
        elif m == "forward":
            ex.forward(full[i % len(full)], 0, None, True)
        else:
            replay(i, m == "events")

    samples = race_modes(decide, lambda m: mode.update(m=m), list(MODES), args.rounds, args.per_round)
    stats = {m: summarize(v) for m, v in samples.items()}
    p50 = {m: float(np.median(v)) for m, v in samples.items()}
    span = float(np.median(spans_ms))
    print(f"{dev.info.name} [{dev.info.fingerprint}]: {args.preset} ({args.weights}), {args.seq} rows, "
          f"{len(plan.launches)} launches, PDL {ex.pdl}")
    print("\n".join(race_lines(samples)))
    print(f"GPU span of a replay (events): p50 {span:.4f} ms, p10 {np.percentile(spans_ms, 10):.4f}, "
          f"p90 {np.percentile(spans_ms, 90):.4f} ({len(spans_ms)} replays)")
    parts = {"model_host_us": 1e3 * (p50["whole"] - p50["forward"]),
             "executor_host_us": 1e3 * (p50["forward"] - p50["replay"]),
             "launch_and_wait_us": 1e3 * (p50["replay"] - span), "host_share_us": 1e3 * (p50["whole"] - span),
             "events_cost_us": 1e3 * (p50["events"] - p50["replay"]), "gpu_span_ms": span}
    print(f"the model's host work {parts['model_host_us']:.1f} us, the executor's {parts['executor_host_us']:.1f} us,"
          f" the launch call and the wait {parts['launch_and_wait_us']:.1f} us: the host's share "
          f"{parts['host_share_us']:.1f} us of {p50['whole']:.4f} ms whole, the GPU's span {span:.4f} ms "
          f"(the events themselves cost {parts['events_cost_us']:.1f} us)")
    print(f"replays whose result row differs from the first decision's: {len(bad)}")
    write_race(args.out, "decision_host_cuda.json", "experiments/decision_host_cuda.py", dev, args.preset, args.seq,
               samples, stats, launches=len(plan.launches), pdl=bool(ex.pdl), parts=parts, spans_ms=spans_ms,
               replays_differing=len(bad))
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
