"""A model of `nf4_mm_wgr`'s stage release with mbarriers (WGR_RELEASE 1 in matmul_wgr.cu), run under random
interleavings: threads in warpgroups, `full` and `empty` mbarriers with phases, cp.async and TMA copies landing at
random later times (a thread's noinc arrival only once its earlier copies have), and each warpgroup's wgmma
reading its x stage until the warpgroup's wait. It checks that every decode reads the step it expects from every
thread's share, that no copy overwrites an x stage a wgmma still reads, and that nothing deadlocks, for ST 3-6 and
1-16 steps. It models the protocol, not the CUDA text: change both together.

    python3 experiments/wgr_release_model.py
"""
from __future__ import annotations

import random
from collections.abc import Iterator


class Barrier:
    """An mbarrier: `count` arrivals complete a phase; `done(parity)` is try_wait.parity."""

    def __init__(self, count: int) -> None:
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self) -> None:
        self.pending -= 1
        assert self.pending >= 0, "more arrivals than the count"
        if self.pending == 0:
            self.phase ^= 1
            self.pending = self.count

    def done(self, parity: int) -> bool:
        return self.phase != parity


def run(st: int, steps: int, warpgroups: int = 2, per_wg: int = 2, seed: int = 0, lead: int = 2) -> None:
    rng = random.Random(seed)
    nt = warpgroups * per_wg
    full = [Barrier(nt + 1) for _ in range(st)]  # every thread's copies + thread 0's expect_tx
    empty = [Barrier(nt) for _ in range(st)]
    w_stage: list[list[int | None]] = [[None] * nt for _ in range(st)]  # each thread's share: the step landed there
    x_stage: list[int | None] = [None] * st
    pending: list[tuple] = []  # copies in flight and noinc arrivals waiting for them
    wgmma: list[list[tuple[int, int]]] = [[] for _ in range(warpgroups)]  # (step, stage) in flight per warpgroup
    ahead = st - lead  # steps issued before the loop; step kt issues kt + ahead, into the stage of step kt - lead

    def thread(tid: int) -> Iterator[None]:
        wg = tid // per_wg

        def issue(j: int) -> None:
            if j >= steps:
                return
            if tid == 0:
                full[j % st].arrive()  # expect_tx
                pending.append(("x", 0, j))
            pending.append(("w", tid, j))
            pending.append(("arrive", tid, j))

        for g in range(ahead):
            issue(g)
        yield
        while not full[0].done(0):
            yield
        assert all(w == 0 for w in w_stage[0]) and x_stage[0] == 0
        decoded = {0}
        for kt in range(steps):
            assert kt in decoded
            if tid % per_wg == 0:  # the warpgroup's wgmma of step kt
                wgmma[wg].append((kt, kt % st))
            yield
            while any(s < kt for s, _ in wgmma[wg]):  # wait<1>: step kt - 1's wgmma is done
                yield
            if kt >= 1:
                empty[(kt - 1) % st].arrive()
            j = kt + ahead
            if j < steps:
                if j >= st:
                    while not empty[j % st].done((j // st - 1) & 1):
                        yield
                issue(j)
            yield
            if kt + 1 < steps:
                nxt = (kt + 1) % st
                while not full[nxt].done(((kt + 1) // st) & 1):
                    yield
                assert all(w == kt + 1 for w in w_stage[nxt]), (tid, kt, w_stage[nxt])
                assert x_stage[nxt] == kt + 1
                decoded.add(kt + 1)
            yield
        while wgmma[wg]:
            yield

    threads = {t: thread(t) for t in range(nt)}
    for _ in range(200_000):
        if not (threads or pending or any(wgmma)):
            return
        r = rng.random()
        if pending and r < 0.3:
            kind, t, j = ev = pending.pop(rng.randrange(len(pending)))
            if kind == "x":
                assert not any(s == j % st for w in wgmma for _, s in w), f"x of step {j} over a stage in use"
                x_stage[j % st] = j
            elif kind == "w":
                w_stage[j % st][t] = j
            elif any(e[1] == t and e[0] != "arrive" for e in pending):  # noinc: after this thread's copies
                pending.append(ev)
            else:
                full[j % st].arrive()
        elif any(wgmma) and r < 0.5:
            w = rng.choice([w for w in wgmma if w])
            step, stage = w.pop(0)
            assert x_stage[stage] == step, f"wgmma of step {step} read x of step {x_stage[stage]}"
        elif threads:
            t = rng.choice(sorted(threads))
            try:
                next(threads[t])
            except StopIteration:
                del threads[t]
    raise AssertionError(f"deadlock: ST {st}, {steps} steps, seed {seed}")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=40, help="random interleavings per (stages, steps)")
    ap.add_argument("--lead", type=int, default=2, choices=(1, 2),
                    help="steps between a stage's use and its refill (2: the kernel's protocol)")
    args = ap.parse_args()
    n = 0
    for st in (3, 4, 5, 6):
        for steps in (1, 2, 3, 5, 8, 16):
            for seed in range(args.seeds):
                run(st, steps, seed=seed, lead=args.lead)
                n += 1
    print(f"ok: {n} random interleavings")
