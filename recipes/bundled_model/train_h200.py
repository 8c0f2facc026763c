"""Train the bundled default model in one run on one GPU machine: data, training, DAgger, NF4, quality, time-bounded.

    PYTHONPATH=src python recipes/bundled_model/train_h200.py OUT_DIR [--gen-budget-s 35] [--train-budget-s 140]
        [--dagger-rounds 2] ...
    (recipes/bundled_model/train_h200.sh OUT_DIR runs this with the H200 settings)

Steps, each logged with its time:
1. data: expert games from `tilewise.game.dataset.generate` (all CPU cores, one process pool) in rounds of
   `3 x workers` games, each round with its own dataset seed, until the generation budget would be exceeded;
   merged (`concat_datasets`: game ids offset per round) and written with `write_dataset` into the work folder
   (not OUT_DIR: it is large). `--explore` is the share of random rotations/shifts in those games (labels stay
   the expert's).
2. baselines: expert and random over the quality games (`play_quality.py` here), and the CPU decision latency of
   the model shape on 2 pinned cores (`train_shape_latency.py` here), in background processes while the GPU trains.
3. train (round 0, behaviour cloning): `python -m tilewise.train` (= `tilewise train`) `--time-budget-s ...
   --nf4 OUT_DIR/model-nf4` (HF float32 folder in the work folder; held-out agreement on whole held-out games),
   then OUT_DIR/model-f16.
4. DAgger rounds 1..N (`tilewise.train.dagger`): the current model plays `--dagger-games` games in lockstep on the
   GPU (expert roll-in of up to `--dagger-prefix-pieces` pieces, except every 4th game, which starts empty; then
   the model for up to `--dagger-policy-pieces` pieces; with probability `--beta` per step the expert's action is
   played instead), CPU workers label every visited position with the expert's action; then `tilewise train
   --init <previous model> --data <expert data> <every round's on-policy records> --data-repeat ...` continues
   training for `--dagger-train-budget-s`. Each round that trains successfully replaces OUT_DIR/model-nf4 and
   model-f16; a failing round leaves the previous model there and ends the rounds. Rounds that would not fit in
   `--total-budget-s` (with the final stages' time kept) are shortened or skipped.
5. NF4 agreement: the NF4 model (dequantized, torch) on the expert data's held-out games (the same games in every
   round: `tilewise train` splits each data file on its own).
6. play: the NF4 model plays the quality games in lockstep on the GPU (`play_batched`).
7. OUT_DIR gets: model-nf4/{config.json, model.safetensors, tokenizer.json}, model-f16/{config.json,
   model.safetensors}, train_log.txt, results.json (at most 7 files, each well under 16 MiB).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


class Tee:
    """Print and append to the log file."""

    def __init__(self, path: Path) -> None:
        self.f = path.open("a")

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def generate_rounds(work: Path, budget_s: float, seed: int, max_pieces: int, workers: int, games_per_round: int,
                    max_rounds: int, log: Tee, explore: float = 0.02,
                    detour: float = 0.0) -> tuple[Path, dict[str, Any]]:
    """Expert games in rounds until the budget; returns the merged dataset file and a summary."""
    import multiprocessing as mp

    from tilewise.game.dataset import GameDataset, concat_datasets, generate, write_dataset

    t0 = time.perf_counter()
    parts: list[GameDataset] = []
    round_s: list[float] = []
    r = 0
    with mp.get_context("spawn").Pool(workers) as pool:  # one pool for every round: no start-up per round
        while r < max_rounds:
            elapsed = time.perf_counter() - t0
            # stop when another round like the slowest one so far would overrun the budget
            if parts and elapsed + max(round_s) > budget_s:
                break
            tr = time.perf_counter()
            part = generate(games_per_round, seed + r, max_pieces=max_pieces, explore=explore, workers=workers,
                            pool=pool, detour=detour)
            parts.append(part)
            round_s.append(time.perf_counter() - tr)
            res = part.meta["results"]
            log(f"data: round {r} (dataset seed {seed + r}): {len(part)} decisions from {games_per_round} games, "
                f"mean {np.mean([x['pieces'] for x in res]):.0f} pieces / {np.mean([x['lines'] for x in res]):.0f} "
                f"lines per game, {round_s[-1]:.1f} s")
            r += 1
    merged = concat_datasets(parts)
    merged.meta.update(seed=seed, rounds=len(parts), round_seeds=[seed + i for i in range(len(parts))])
    meta = merged.meta
    gen_s = time.perf_counter() - t0
    path = write_dataset(merged, work / "data.npz", compress=False)  # a scratch file: deflating took ~24 s
    summary = {"decisions": len(merged), "games": meta["games"], "rounds": len(parts), "seed": seed,
               "max_pieces": max_pieces, "games_per_round": games_per_round, "explore": meta.get("explore"),
               "detour": detour, "workers": workers, "generate_s": round(gen_s, 1),
               "write_s": round(time.perf_counter() - t0 - gen_s, 1),
               "decisions_per_s": round(len(merged) / gen_s, 1),
               "expert_mean_lines_per_game": float(np.mean([x["lines"] for x in meta["results"]])),
               "expert_mean_pieces_per_game": float(np.mean([x["pieces"] for x in meta["results"]]))}
    log(f"data: {summary['decisions']} decisions, {summary['games']} games in {gen_s:.1f} s "
        f"({summary['decisions_per_s']:.0f}/s); written in {summary['write_s']} s to {path}")
    return path, summary


def replace_folder_files(src: Path, dst: Path) -> None:
    """Copy every file of `src` into `dst` (created), each written under a temporary name and renamed into place."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.is_file():
            tmp = dst / (f.name + ".part")
            shutil.copyfile(f, tmp)
            os.replace(tmp, dst / f.name)


def onpolicy_repeat(expert_decisions: int, onpolicy_decisions: int, share: float, most: int = 8) -> int:
    """Integer repeat of the on-policy files so that they make about `share` of an epoch's samples (1..most)."""
    if share <= 0 or onpolicy_decisions <= 0:
        return 1
    want = share / max(1e-9, 1.0 - share) * expert_decisions / onpolicy_decisions
    return int(min(most, max(1, round(want))))


def _pin(cores: set[int]) -> Any:
    """preexec_fn that pins a child process to `cores` (ignored where the OS refuses)."""

    def pin() -> None:
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setaffinity(0, cores)

    return pin


def run_logged(cmd: list[str], log: Tee, env: dict[str, str]) -> int:
    """Run a command, streaming its output into the log."""
    log("$ " + " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    for line in proc.stdout:
        log(line.rstrip("\n"))
    return proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="output folder (created)")
    ap.add_argument("--work", default=None, help="scratch folder for the dataset and float32 model "
                    "(default: a new temporary folder)")
    ap.add_argument("--seed", type=int, default=1, help="first dataset seed (round r uses seed + r)")
    ap.add_argument("--gen-budget-s", type=float, default=35.0)
    ap.add_argument("--max-pieces", type=int, default=400, help="pieces per training game at most")
    ap.add_argument("--explore", type=float, default=0.05,
                    help="share of random rotations/shifts in the expert games (labels stay the expert's)")
    ap.add_argument("--detour", type=float, default=0.0,
                    help="share of pieces that first take 1-3 random sideways steps (labels stay the expert's)")
    ap.add_argument("--workers", type=int, default=None, help="generation and DAgger processes (default: CPU count)")
    ap.add_argument("--games-per-round", type=int, default=0, help="default: 3 x workers")
    ap.add_argument("--max-rounds", type=int, default=1000)
    ap.add_argument("--train-budget-s", type=float, default=140.0, help="training before the DAgger rounds")
    ap.add_argument("--train-args", default="--shape default --batch 256 --lr 2e-3 --warmup 200 --epochs 100",
                    help="extra arguments for `tilewise train`")
    ap.add_argument("--dagger-rounds", type=int, default=2, help="DAgger rounds after the first training (0: none)")
    ap.add_argument("--dagger-games", type=int, default=1024, help="games per DAgger round (played in lockstep)")
    ap.add_argument("--dagger-budget-s", type=float, default=30.0, help="collection time per DAgger round")
    ap.add_argument("--dagger-train-budget-s", type=float, default=70.0, help="training time per DAgger round")
    ap.add_argument("--beta", type=float, default=0.0,
                    help="DAgger mixture: probability per step that the expert's action is played instead of the "
                         "model's (the label is the expert's either way)")
    ap.add_argument("--dagger-prefix-pieces", type=int, default=150,
                    help="expert roll-in: DAgger games start after 1..N expert pieces (every 4th game from the empty "
                         "board); 0: all from the empty board")
    ap.add_argument("--dagger-policy-pieces", type=int, default=60,
                    help="a DAgger game stops after the model has placed this many pieces (0: no cap)")
    ap.add_argument("--dagger-share", type=float, default=0.5,
                    help="target share of on-policy records among the DAgger rounds' training samples (their files "
                         "are repeated, at most 8x; 0: plain aggregate)")
    ap.add_argument("--dagger-seed", type=int, default=1000, help="DAgger round r collects with dataset seed S + r")
    ap.add_argument("--dagger-train-args", default="--lr 1e-3 --warmup 50",
                    help="appended to --train-args for the DAgger rounds' training (later options win)")
    ap.add_argument("--total-budget-s", type=float, default=540.0,
                    help="the whole run's target: DAgger rounds are shortened or skipped to keep it")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quality-games", type=int, default=20)
    ap.add_argument("--quality-max-pieces", type=int, default=1000)
    ap.add_argument("--play-budget-s", type=float, default=60.0)
    ap.add_argument("--extra-play-games", type=int, default=0,
                    help="the model also plays this many games from --extra-play-seed on (a larger sample than the "
                         "quality games for comparing runs; no baselines are played on them)")
    ap.add_argument("--extra-play-seed", type=int, default=100, help="first engine seed of the extra games")
    ap.add_argument("--latency-shapes", default="default,small", help="shapes timed on 2 cores (random weights)")
    args = ap.parse_args()

    t_all = time.perf_counter()
    deadline = t_all + args.total_budget_s
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # the dataset and float32 model stay out of OUT (too large to bring back); a temp folder is always writable
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="tilewise-train-"))
    work.mkdir(parents=True, exist_ok=True)
    log = Tee(out / "train_log.txt")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch

    from tilewise.train.card import heldout_expert

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    log(f"work folder: {work}")
    # the cores this process may use (two runs can share a machine, each pinned to its half)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    log(f"env: python {platform.python_version()}, torch {torch.__version__}, GPU {gpu}, {len(cores)} of "
        f"{os.cpu_count()} CPUs")
    workers = args.workers or len(cores)
    results: dict[str, Any] = {"argv": sys.argv[1:], "python": platform.python_version(), "torch": torch.__version__,
                               "gpu": gpu, "cpus": len(cores)}
    save = lambda: (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")  # noqa: E731

    # 1. data
    t = time.perf_counter()
    data_path, results["data"] = generate_rounds(work, args.gen_budget_s, args.seed, args.max_pieces, workers,
                                                 args.games_per_round or 3 * workers, args.max_rounds, log,
                                                 explore=args.explore, detour=args.detour)
    results["time_data_s"] = round(time.perf_counter() - t, 1)

    # 2. baselines in the background (CPU) while the GPU trains
    base_json = work / "baselines.json"
    base_cmd = [sys.executable, str(HERE / "play_quality.py"), "--policies", "expert,random",
                "--games", str(args.quality_games), "--max-pieces", str(args.quality_max_pieces),
                "--workers", str(max(1, min(workers - 2, 2 * args.quality_games))), "--json", str(base_json)]
    # the last two cores time the CPU decision latency (2 BLAS threads, as on a 2-core machine); baselines use
    # the others; the training process is left to the scheduler
    lat_cores, base_cores = set(cores[-2:]), set(cores[:-2] or cores)
    log("$ " + " ".join(base_cmd) + f"  (background, cores {min(base_cores)}-{max(base_cores)})")
    base_proc = subprocess.Popen(base_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                 cwd=ROOT, preexec_fn=_pin(base_cores))
    lat_json = work / "latency.json"
    lat_cmd = [sys.executable, str(HERE / "train_shape_latency.py"), "--shapes", args.latency_shapes,
               "--repeats", "40", "--json", str(lat_json)]
    lat_env = dict(env, OPENBLAS_NUM_THREADS="2", OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")
    log("$ " + " ".join(lat_cmd) + f"  (background, cores {sorted(lat_cores)}, 2 BLAS threads)")
    lat_proc = subprocess.Popen(lat_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=lat_env,
                                cwd=ROOT, preexec_fn=_pin(lat_cores))

    # 3. train (+ NF4): round 0, behaviour cloning on the expert data
    t = time.perf_counter()
    hf = work / "model-hf"
    nf4 = out / "model-nf4"
    train_json = work / "train_results.json"
    # `python -m tilewise.train` is `tilewise train` without importing the other commands (their deps)
    cmd = [sys.executable, "-m", "tilewise.train", "--data", str(data_path), "--out", str(hf), "--nf4", str(nf4),
           "--time-budget-s", str(args.train_budget_s), "--device", args.device, "--results-json", str(train_json),
           *args.train_args.split()]
    rc = run_logged(cmd, log, env)
    results["time_train_s"] = round(time.perf_counter() - t, 1)
    if rc != 0:
        log(f"train failed with exit code {rc}")
        base_proc.kill()
        lat_proc.kill()
        return rc
    results["train"] = json.loads(train_json.read_text())
    results["train_rounds"] = [results["train"]]
    results["final_model"] = "round 0 (behaviour cloning)"
    save()

    # each later stage is guarded, so that a failure there keeps the model and the numbers already made
    def stage(name: str, fn: Any) -> bool:
        t = time.perf_counter()
        ok = True
        try:
            fn()
        except Exception:
            log(f"{name}: FAILED\n" + traceback.format_exc())
            results.setdefault("failed_stages", []).append(name)
            ok = False
        results[f"time_{name}_s"] = round(time.perf_counter() - t, 1)
        save()
        return ok

    current = {"hf": hf}

    def f16_copy() -> None:  # the float32 folder is over the size that comes back; f16 is half
        from tilewise.model.checkpoint import Checkpoint

        f16, tmp = out / "model-f16", work / "model-f16"
        shutil.rmtree(tmp, ignore_errors=True)
        Checkpoint.open(current["hf"]).converted("f16").save(tmp)
        (tmp / "tokenizer.json").unlink(missing_ok=True)  # the NF4 folder carries it
        replace_folder_files(tmp, f16)

    stage("f16", f16_copy)  # right away: a run cut short still leaves both folders of the round-0 model

    # 4. DAgger rounds
    overhead = max(5.0, results["time_train_s"] - args.train_budget_s)  # start-up, loading, final evaluation
    reserve = args.play_budget_s + 30.0  # NF4 agreement, play, baselines, summary
    dagger_rounds: list[dict[str, Any]] = []
    results["dagger"] = {"rounds_asked": args.dagger_rounds, "games": args.dagger_games, "beta": args.beta,
                         "prefix_pieces": args.dagger_prefix_pieces, "policy_pieces": args.dagger_policy_pieces,
                         "budget_s": args.dagger_budget_s, "train_budget_s": args.dagger_train_budget_s,
                         "share": args.dagger_share, "seed": args.dagger_seed, "train_args": args.dagger_train_args,
                         "rounds": dagger_rounds}
    onpolicy_files: list[Path] = []
    onpolicy_decisions = 0

    def collect(r: int, rec: dict[str, Any], path: Path) -> None:
        from tilewise.game.dataset import write_dataset
        from tilewise.train.dagger import collect_round
        from tilewise.train.trainer import pick_device

        device = pick_device(args.device)
        log(f"dagger: round {r}: {current['hf'].name} plays {args.dagger_games} games on {device} (expert roll-in "
            f"1..{args.dagger_prefix_pieces} pieces except every 4th game, then the model for up to "
            f"{args.dagger_policy_pieces} pieces, beta {args.beta}); {workers} CPU workers label with the expert; "
            f"budget {args.dagger_budget_s:.0f} s")
        tc = time.perf_counter()
        data = collect_round(current["hf"], args.dagger_games, args.dagger_seed + r, max_pieces=args.max_pieces,
                             beta=args.beta, device=device, workers=workers, time_budget_s=args.dagger_budget_s,
                             prefix_pieces=args.dagger_prefix_pieces, policy_pieces=args.dagger_policy_pieces,
                             log=log)
        rec["collect_s"] = round(time.perf_counter() - tc, 1)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        c = data.meta["collector"]
        rec["collector"] = c
        if not len(data):
            raise RuntimeError("the collection recorded no positions")
        tw = time.perf_counter()
        write_dataset(data, path, compress=False)
        rec["write_s"] = round(time.perf_counter() - tw, 1)
        fe, pp = c["from_empty"], c["policy_part"]
        log(f"dagger: round {r}: {c['positions']} positions in {rec['collect_s']} s ({c['positions_per_s']:.0f}/s; "
            f"{c['policy_calls']} model calls of {c['mean_batch']:.0f} prompts on average, {c['policy_s']:.1f} s "
            f"in the model){' - stopped by the time budget' if c['stopped_by_time'] else ''}; written in "
            f"{rec['write_s']} s")
        log(f"dagger: round {r}: the model agrees with the expert on {c['policy_agreement']:.4f} of the positions "
            f"it reached")
        if fe.get("games"):
            log(f"dagger: round {r}: from the empty board ({fe['games']} games, cap {args.dagger_policy_pieces} "
                f"pieces): model mean {fe['mean_pieces']:.1f} pieces, {fe['mean_lines']:.1f} lines, "
                f"{fe['game_over_share']:.0%} game over")
        log(f"dagger: round {r}: all games after the roll-in: model mean {pp['mean_pieces']:.1f} pieces, "
            f"{pp['mean_lines']:.1f} lines, {pp['game_over_share']:.0%} game over")

    def dagger_train(r: int, rec: dict[str, Any], train_budget: float, repeat: int) -> None:
        hf_r, nf4_r, json_r = work / f"model-hf-r{r}", work / f"model-nf4-r{r}", work / f"train_results-r{r}.json"
        cmd = [sys.executable, "-m", "tilewise.train", "--data", str(data_path), *map(str, onpolicy_files),
               "--data-repeat", "1", *[str(repeat)] * len(onpolicy_files),
               "--out", str(hf_r), "--nf4", str(nf4_r), "--time-budget-s", f"{train_budget:.1f}",
               "--device", args.device, "--results-json", str(json_r),
               *args.train_args.split(), *args.dagger_train_args.split(),
               # last, so that an `--init` in --train-args (the first training's start) does not override it
               "--init", str(current["hf"])]
        rc = run_logged(cmd, log, env)
        if rc != 0:
            raise RuntimeError(f"tilewise train exited with code {rc}")
        record = json.loads(json_r.read_text())
        replace_folder_files(nf4_r, nf4)  # the round's model replaces the previous one in OUT_DIR
        current["hf"] = hf_r
        results["train"] = record
        results["train_rounds"].append(record)
        results["final_model"] = f"DAgger round {r}"
        res = record["result"]
        parts = res.get("heldout_by_data") or []
        rec["train"] = {"steps": res["steps"], "epochs_done": res["epochs_done"],
                        "train_time_s": res["train_time_s"], "decisions": record["decisions"],
                        "heldout_expert": heldout_expert(record),
                        "heldout_onpolicy": [p["accuracy"] for p in parts[1:]]}
        log(f"dagger: round {r}: trained {res['steps']} steps in {res['train_time_s']:.0f} s on "
            f"{record['decisions']} decisions (on-policy files x{repeat}); held-out agreement: expert games "
            f"{rec['train']['heldout_expert']:.4f}, on-policy games "
            + ", ".join(f"{a:.4f}" for a in rec["train"]["heldout_onpolicy"]) + f"; {nf4.name} replaced")

    for r in range(1, args.dagger_rounds + 1):
        left = deadline - time.perf_counter() - reserve
        train_budget = min(args.dagger_train_budget_s, left - args.dagger_budget_s - overhead - 15.0)
        rec: dict[str, Any] = {"round": r, "seed": args.dagger_seed + r}
        dagger_rounds.append(rec)
        if train_budget < 0.5 * args.dagger_train_budget_s:
            rec["status"] = "skipped"
            log(f"dagger: round {r} skipped: {left:.0f} s left before the final stages' {reserve:.0f} s, "
                f"not enough for collection ({args.dagger_budget_s:.0f} s), training and its ~{overhead:.0f} s "
                f"start-up (--total-budget-s {args.total_budget_s:.0f})")
            break
        path = work / f"dagger-r{r}.npz"
        if not stage(f"dagger{r}_collect", functools.partial(collect, r, rec, path)):
            rec["status"] = "collection failed"
            break
        onpolicy_files.append(path)
        onpolicy_decisions += rec["collector"]["positions"]
        repeat = onpolicy_repeat(results["data"]["decisions"], onpolicy_decisions, args.dagger_share)
        rec["data_repeat"] = repeat
        rec["train_budget_s"] = round(train_budget, 1)
        ok = stage(f"dagger{r}_train", functools.partial(dagger_train, r, rec, train_budget, repeat))
        rec["status"] = "ok" if ok else "training failed"
        if not ok:
            break
        stage(f"dagger{r}_f16", f16_copy)

    # 5.-7.
    state: dict[str, Any] = {}

    def nf4_agreement() -> None:
        from tilewise.train.data import load_examples, split_games
        from tilewise.train.export import load_torch_model
        from tilewise.train.trainer import evaluate, pick_device

        device = state["device"] = pick_device(args.device)
        examples = load_examples(data_path)
        train_rec = results["train"]
        _, held = split_games(examples, float(train_rec["heldout_fraction"]), int(train_rec["settings"]["seed"]))
        state["model"] = load_torch_model(nf4).to(device)
        ev = evaluate(state["model"], held, device)
        results["nf4_heldout_agreement"] = ev["accuracy"]
        results["nf4_heldout_per_action"] = ev["per_action"]
        log(f"nf4: held-out agreement on the expert games {ev['accuracy']:.4f} on {ev['examples']} decisions "
            f"(float32: {heldout_expert(train_rec):.4f})")

    def model_play() -> None:
        from tilewise.train.evaluate import play_batched

        os.environ["TOKENIZERS_PARALLELISM"] = "true"  # one encode_batch per step for all games: use the cores

        def play(key: str, seeds: list[int]) -> None:
            budget = max(10.0, min(args.play_budget_s, deadline - time.perf_counter() - 15.0))
            res = results[key] = play_batched(state["model"], seeds, max_pieces=args.quality_max_pieces,
                                              device=state["device"], log=log, time_budget_s=budget)
            log(f"play: model (NF4, torch on {state['device']}) on seeds {seeds[0]}-{seeds[-1]}: mean "
                f"{res['mean_lines']:.2f} lines, {res['mean_pieces']:.1f} pieces over {res['games']} games (cap "
                f"{res['max_pieces']}), {res['decisions']} decisions in {res['wall_s']} s"
                + (f" - stopped by the time budget ({budget:.0f} s)" if res["stopped_by_time"] else ""))

        play("model_play", list(range(args.quality_games)))
        if args.extra_play_games > 0:
            play("model_play_extra", list(range(args.extra_play_seed, args.extra_play_seed + args.extra_play_games)))

    def baselines() -> None:
        try:
            base_out, _ = base_proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            base_proc.kill()
            raise
        for line in base_out.splitlines():
            log("baselines: " + line)
        results["baselines"] = json.loads(base_json.read_text())["results"]

    def latency() -> None:
        lat_out, _ = lat_proc.communicate(timeout=60)
        for line in lat_out.splitlines():
            log("latency: " + line)
        results["cpu_latency"] = json.loads(lat_json.read_text())

    stage("nf4_agreement", nf4_agreement)
    if "model" in state:
        stage("play", model_play)
    stage("baselines", baselines)
    stage("latency", latency)
    results["time_total_s"] = round(time.perf_counter() - t_all, 1)
    save()

    # summary
    r0 = results["train_rounds"][0]["result"]
    log("")
    log("summary")
    log(f"  data      {results['data']['decisions']} decisions, {results['data']['games']} games, explore "
        f"{results['data']['explore']} ({results['time_data_s']} s)")
    log(f"  train     round 0: {r0['steps']} steps, {r0['epochs_done']:.2f} epochs, {r0['train_time_s']:.0f} s, "
        f"{r0['tokens_per_s']:,.0f} tok/s on {r0['device']}; held-out agreement "
        f"{heldout_expert(results['train_rounds'][0]):.4f}")
    for rec in dagger_rounds:
        if rec.get("status") != "ok":
            log(f"  dagger    round {rec['round']}: {rec.get('status')}")
            continue
        c, tr = rec["collector"], rec["train"]
        log(f"  dagger    round {rec['round']}: {c['positions']} positions ({rec['collect_s']} s), model agreement "
            f"on them {c['policy_agreement']:.4f}, from empty {c['from_empty'].get('mean_pieces', float('nan')):.1f} "
            f"pieces; then {tr['steps']} steps ({tr['train_time_s']:.0f} s), held-out expert "
            f"{tr['heldout_expert']:.4f}")
    log(f"  final     {results['final_model']}; held-out agreement on the expert games float32 "
        f"{heldout_expert(results['train']):.4f}, NF4 {results.get('nf4_heldout_agreement')}")
    rows = []
    for name, rec in (("model", results.get("model_play")), *((n, results.get("baselines", {}).get(n))
                                                               for n in ("expert", "random"))):
        if rec:
            rows.append((name, rec["mean_lines"], rec["mean_pieces"]))
    for name, lines, pieces in rows:
        log(f"  {name:9} mean lines {lines:8.1f}   mean pieces {pieces:8.1f}")
    if results.get("model_play_extra"):
        ex = results["model_play_extra"]
        log(f"  model on {ex['games']} extra games (seeds from {args.extra_play_seed}): mean lines "
            f"{ex['mean_lines']:8.2f}   mean pieces {ex['mean_pieces']:8.1f}")
    for row in results.get("cpu_latency", {}).get("rows", []):
        log(f"  CPU decision ({results['cpu_latency']['usable_cores']} cores) shape {row['shape']}: "
            f"p50 {row['decision_ms_p50']} ms (p20 {row['decision_ms_p20']}, p80 {row['decision_ms_p80']})")
    if results.get("failed_stages"):
        log(f"  FAILED stages: {', '.join(results['failed_stages'])} (tracebacks above)")
    log(f"  total     {results['time_total_s']} s; files in {out}:")
    for p in sorted(out.rglob("*")):
        if p.is_file():
            log(f"    {p.relative_to(out)}  {p.stat().st_size / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
