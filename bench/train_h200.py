"""Train the bundled default model in one run on one GPU machine: data, training, NF4, quality, all time-bounded.

    PYTHONPATH=src python bench/train_h200.py OUT_DIR [--gen-budget-s 100] [--train-budget-s 210] ...
    (bench/train_h200.sh OUT_DIR runs this with the H200 settings)

Steps, each logged with its time:
1. data: expert games from `tilewise.game.dataset.generate` (all CPU cores) in rounds of `3 x workers` games,
   each round with its own dataset seed, until the generation budget would be exceeded; merged (game ids
   offset per round) and written with `write_dataset` into the work folder (not OUT_DIR: it is large).
2. baselines: expert and random over the quality games (`bench/play_quality.py`), and the CPU decision latency of
   the model shape on 2 pinned cores (`bench/train_shape_latency.py`), in background processes while the GPU trains.
3. train: `python -m tilewise.train` (= `tilewise train`) `--time-budget-s ... --nf4 OUT_DIR/model-nf4` (HF
   float32 folder in the work folder; held-out agreement on whole held-out games).
4. NF4 agreement: the NF4 model (dequantized, torch) on the same held-out games.
5. play: the NF4 model plays the quality games in lockstep on the GPU (`play_batched`).
6. OUT_DIR gets: model-nf4/{config.json, model.safetensors, tokenizer.json}, model-f16/{config.json,
   model.safetensors}, train_log.txt, results.json (at most 6 files, each well under 16 MiB).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


class Tee:
    """Print and append to the log file."""

    def __init__(self, path: Path) -> None:
        self.f = path.open("a")

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def generate_rounds(work: Path, budget_s: float, seed: int, max_pieces: int, workers: int, games_per_round: int,
                    max_rounds: int, log: Tee) -> tuple[Path, dict[str, Any]]:
    """Expert games in rounds until the budget; returns the merged dataset file and a summary."""
    from tilewise.game.dataset import GameDataset, generate, write_dataset

    t0 = time.perf_counter()
    parts: list[GameDataset] = []
    round_s: list[float] = []
    r = 0
    while r < max_rounds:
        elapsed = time.perf_counter() - t0
        # stop when another round like the slowest one so far would overrun the budget
        if parts and elapsed + max(round_s) > budget_s:
            break
        tr = time.perf_counter()
        part = generate(games_per_round, seed + r, max_pieces=max_pieces, workers=workers)
        part.game_ids = part.game_ids.astype(np.int64) + r * games_per_round
        parts.append(part)
        round_s.append(time.perf_counter() - tr)
        res = part.meta["results"]
        log(f"data: round {r} (dataset seed {seed + r}): {len(part)} decisions from {games_per_round} games, "
            f"mean {np.mean([x['pieces'] for x in res]):.0f} pieces / {np.mean([x['lines'] for x in res]):.0f} "
            f"lines per game, {round_s[-1]:.1f} s")
        r += 1
    width = max(p.tokens.shape[1] for p in parts)
    pad = int(parts[0].meta["pad_id"])

    def padded(t: np.ndarray) -> np.ndarray:
        return t if t.shape[1] == width else np.pad(t, ((0, 0), (0, width - t.shape[1])), constant_values=pad)

    meta = dict(parts[0].meta)
    meta.update(seed=seed, rounds=len(parts), games=len(parts) * games_per_round,
                round_seeds=[seed + i for i in range(len(parts))],
                game_seeds=[s for p in parts for s in p.meta["game_seeds"]],
                results=[x for p in parts for x in p.meta["results"]])
    merged = GameDataset(
        tokens=np.concatenate([padded(p.tokens) for p in parts]),
        lengths=np.concatenate([p.lengths for p in parts]),
        actions=np.concatenate([p.actions for p in parts]),
        played=np.concatenate([p.played for p in parts]),
        game_ids=np.concatenate([p.game_ids for p in parts]).astype(np.int32),
        steps=np.concatenate([p.steps for p in parts]),
        pieces=np.concatenate([p.pieces for p in parts]),
        meta=meta,
    )
    gen_s = time.perf_counter() - t0
    path = write_dataset(merged, work / "data.npz")
    summary = {"decisions": len(merged), "games": meta["games"], "rounds": len(parts), "seed": seed,
               "max_pieces": max_pieces, "games_per_round": games_per_round, "explore": meta.get("explore"),
               "workers": workers, "generate_s": round(gen_s, 1),
               "write_s": round(time.perf_counter() - t0 - gen_s, 1),
               "decisions_per_s": round(len(merged) / gen_s, 1),
               "expert_mean_lines_per_game": float(np.mean([x["lines"] for x in meta["results"]])),
               "expert_mean_pieces_per_game": float(np.mean([x["pieces"] for x in meta["results"]]))}
    log(f"data: {summary['decisions']} decisions, {summary['games']} games in {gen_s:.1f} s "
        f"({summary['decisions_per_s']:.0f}/s); written in {summary['write_s']} s to {path}")
    return path, summary


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
    ap.add_argument("--gen-budget-s", type=float, default=90.0)
    ap.add_argument("--max-pieces", type=int, default=400, help="pieces per training game at most")
    ap.add_argument("--workers", type=int, default=None, help="generation processes (default: CPU count)")
    ap.add_argument("--games-per-round", type=int, default=0, help="default: 3 x workers")
    ap.add_argument("--max-rounds", type=int, default=1000)
    ap.add_argument("--train-budget-s", type=float, default=200.0)
    ap.add_argument("--train-args", default="--shape default --batch 256 --lr 2e-3 --warmup 200 --epochs 100",
                    help="extra arguments for `tilewise train`")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quality-games", type=int, default=20)
    ap.add_argument("--quality-max-pieces", type=int, default=1000)
    ap.add_argument("--play-budget-s", type=float, default=70.0)
    ap.add_argument("--latency-shapes", default="default,small", help="shapes timed on 2 cores (random weights)")
    args = ap.parse_args()

    t_all = time.perf_counter()
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

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    log(f"work folder: {work}")
    log(f"env: python {platform.python_version()}, torch {torch.__version__}, GPU {gpu}, {os.cpu_count()} CPUs")
    workers = args.workers or os.cpu_count() or 1
    results: dict[str, Any] = {"argv": sys.argv[1:], "python": platform.python_version(), "torch": torch.__version__,
                               "gpu": gpu, "cpus": os.cpu_count()}

    # 1. data
    t = time.perf_counter()
    data_path, results["data"] = generate_rounds(work, args.gen_budget_s, args.seed, args.max_pieces, workers,
                                                 args.games_per_round or 3 * workers, args.max_rounds, log)
    results["time_data_s"] = round(time.perf_counter() - t, 1)

    # 2. baselines in the background (CPU) while the GPU trains
    base_json = work / "baselines.json"
    base_cmd = [sys.executable, str(ROOT / "bench" / "play_quality.py"), "--policies", "expert,random",
                "--games", str(args.quality_games), "--max-pieces", str(args.quality_max_pieces),
                "--workers", str(max(1, min(workers - 2, 2 * args.quality_games))), "--json", str(base_json)]
    n_cpu = os.cpu_count() or 1
    # the last two cores time the CPU decision latency (2 BLAS threads, as on a 2-core machine); baselines use
    # the others; the training process is left to the scheduler
    lat_cores, base_cores = set(range(max(0, n_cpu - 2), n_cpu)), set(range(max(1, n_cpu - 2)))
    log("$ " + " ".join(base_cmd) + f"  (background, cores {min(base_cores)}-{max(base_cores)})")
    base_proc = subprocess.Popen(base_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                 cwd=ROOT, preexec_fn=_pin(base_cores))
    lat_json = work / "latency.json"
    lat_cmd = [sys.executable, str(ROOT / "bench" / "train_shape_latency.py"), "--shapes", args.latency_shapes,
               "--repeats", "40", "--json", str(lat_json)]
    lat_env = dict(env, OPENBLAS_NUM_THREADS="2", OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")
    log("$ " + " ".join(lat_cmd) + f"  (background, cores {sorted(lat_cores)}, 2 BLAS threads)")
    lat_proc = subprocess.Popen(lat_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=lat_env,
                                cwd=ROOT, preexec_fn=_pin(lat_cores))

    # 3. train (+ NF4)
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

    save = lambda: (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")  # noqa: E731
    save()

    # 4.-6.: each stage is guarded, so that a failure there keeps the model and the numbers already made
    def stage(name: str, fn: Any) -> None:
        t = time.perf_counter()
        try:
            fn()
        except Exception:
            log(f"{name}: FAILED\n" + traceback.format_exc())
            results.setdefault("failed_stages", []).append(name)
        results[f"time_{name}_s"] = round(time.perf_counter() - t, 1)
        save()

    def f16_copy() -> None:  # the float32 folder is over the size that comes back; f16 is half
        from tilewise.model.checkpoint import Checkpoint

        f16 = out / "model-f16"
        Checkpoint.open(hf).converted("f16").save(f16)
        (f16 / "tokenizer.json").unlink(missing_ok=True)  # the NF4 folder carries it

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
        log(f"nf4: held-out agreement {ev['accuracy']:.4f} on {ev['examples']} decisions "
            f"(float32: {train_rec['result']['heldout_accuracy']:.4f})")

    def model_play() -> None:
        from tilewise.train.evaluate import play_batched

        os.environ["TOKENIZERS_PARALLELISM"] = "true"  # one encode_batch per step for all games: use the cores
        play = play_batched(state["model"], list(range(args.quality_games)), max_pieces=args.quality_max_pieces,
                            device=state["device"], log=log, time_budget_s=args.play_budget_s)
        results["model_play"] = play
        log(f"play: model (NF4, torch on {state['device']}) mean {play['mean_lines']:.1f} lines, "
            f"{play['mean_pieces']:.1f} pieces over {play['games']} games (cap {play['max_pieces']}), "
            f"{play['decisions']} decisions in {play['wall_s']} s"
            + (" - stopped by the time budget" if play["stopped_by_time"] else ""))

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

    stage("f16", f16_copy)
    stage("nf4_agreement", nf4_agreement)
    if "model" in state:
        stage("play", model_play)
    stage("baselines", baselines)
    stage("latency", latency)
    results["time_total_s"] = round(time.perf_counter() - t_all, 1)
    save()

    # summary
    r = results["train"]["result"]
    log("")
    log("summary")
    log(f"  data      {results['data']['decisions']} decisions, {results['data']['games']} games "
        f"({results['time_data_s']} s)")
    log(f"  train     {r['steps']} steps, {r['epochs_done']:.2f} epochs, {r['train_time_s']:.0f} s, "
        f"{r['tokens_per_s']:,.0f} tok/s on {r['device']}")
    log(f"  agreement held-out float32 {r['heldout_accuracy']:.4f}, NF4 {results.get('nf4_heldout_agreement')}")
    rows = []
    for name, rec in (("model", results.get("model_play")), *((n, results.get("baselines", {}).get(n))
                                                               for n in ("expert", "random"))):
        if rec:
            rows.append((name, rec["mean_lines"], rec["mean_pieces"]))
    for name, lines, pieces in rows:
        log(f"  {name:9} mean lines {lines:8.1f}   mean pieces {pieces:8.1f}")
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
