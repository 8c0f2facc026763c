"""DAgger (dataset aggregation) for the classifier: the model plays, the expert labels the positions it reaches.

Behaviour cloning trains only on positions the expert reaches; a model that makes a mistake drifts into
positions it has never seen, and its errors compound (the bundled model agreed with the expert on 80% of
held-out expert positions yet lost its games after ~30 pieces). DAgger (Ross, Gordon & Bagnell, 2011) repeats:

1. let the current model play (with probability `beta` per step the expert's action is played instead: the
   mixture policy), recording every visited position with the EXPERT's action as the label
   (`tilewise.train.collect.collect_on_policy`, expert labelling in CPU worker processes);
2. train on all the data gathered so far (expert games + every round's on-policy records), continuing from the
   current weights (`tilewise train --init HF_DIR --data expert.npz round1.npz ...`).

`recipes/bundled_model/train_h200.py --dagger-rounds N` runs the rounds after the first training. Here: the model as
a batched policy, and one round's collection from a model folder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def torch_policy(model: Any, device: Any = "cpu", bf16: bool = True, max_batch: int = 1024) -> Callable[..., Any]:
    """A batched policy for `collect_on_policy`: argmax of the classifier's first 6 scores per prompt.

    Args:
        model: an `Lfm2Classifier` (any dtype; moved to `device` and put in eval mode).
        device: torch device.
        bf16: bf16 autocast on CUDA (faster; a near-tie decision may differ from float32).
        max_batch: most prompts per forward.

    Returns:
        `policy(tokens (B, T) int, lengths (B,)) -> (B,) int64 actions`.
    """
    import torch

    dev = torch.device(device)
    model = model.to(dev).eval()
    use_bf16 = bf16 and dev.type == "cuda"

    def policy(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        out = []
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
            for start in range(0, tokens.shape[0], max_batch):
                ids = torch.from_numpy(np.ascontiguousarray(tokens[start: start + max_batch], dtype=np.int32))
                n = torch.from_numpy(np.asarray(lengths[start: start + max_batch], dtype=np.int64))
                scores = model(ids.to(dev, non_blocking=True), n.to(dev, non_blocking=True))  # (b, 8)
                out.append(scores[:, :6].argmax(-1).cpu().numpy())
        return np.concatenate(out).astype(np.int64)

    return policy


def collect_round(model_dir: str | Path, games: int, seed: int, max_pieces: int = 400, beta: float = 0.0,
                  device: Any = "cpu", workers: int | None = None, time_budget_s: float = 0.0,
                  prefix_pieces: int = 0, policy_pieces: int = 0, bf16: bool = True,
                  log: Callable[[str], None] | None = None) -> Any:
    """One DAgger collection: the model in `model_dir` plays `games` games on `device`; the expert labels.

    Args:
        model_dir: a model folder (`tilewise train --out`, or NF4/f16; read with `load_torch_model`).
        games: games played in lockstep (game g uses `game_seed(seed, g)`).
        seed: dataset seed; use one per round, apart from the expert data's seeds.
        max_pieces: a game stops after this many pieces.
        beta: probability that a step plays the expert's action instead of the model's.
        device: torch device of the model.
        workers: CPU processes for prompts and expert labels (default: the CPU count).
        time_budget_s: stop all games after this many seconds (0: none).
        prefix_pieces: expert roll-in of 1..N pieces before the model plays (every 4th game starts empty; 0: none).
        policy_pieces: a game stops after the model has placed this many pieces (0: no cap).
        bf16: bf16 autocast on CUDA.
        log: progress lines.

    Returns:
        The on-policy GameDataset (`meta["collector"]` has its statistics; `meta["policy"]` the model folder).
    """
    from tilewise.train.collect import collect_on_policy
    from tilewise.train.export import load_torch_model

    policy = torch_policy(load_torch_model(model_dir), device, bf16=bf16)
    data = collect_on_policy(policy, games, seed, max_pieces=max_pieces, beta=beta, workers=workers,
                             time_budget_s=time_budget_s, prefix_pieces=prefix_pieces, policy_pieces=policy_pieces,
                             progress=log)
    data.meta["policy"] = Path(model_dir).name
    return data
