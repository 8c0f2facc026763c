"""Imitation training of the LFM2 classifier: seeded AdamW, bf16 autocast on CUDA, a step or time budget.

The learning rate warms up linearly, then follows a cosine to 10% of its peak over the run; the run's progress
is the larger of `step / max_steps` and `elapsed / time_budget_s`, so a time-bounded run anneals and stops cleanly
when its time is up, and still writes the model.

With `TrainSettings.init` (`tilewise train --init HF_DIR`) the run starts from a saved model's weights instead of a
fresh initialisation (e.g. a DAgger round continuing from the previous round's model); the optimizer state starts
fresh (it is not saved), so the warm-up applies again.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilewise.errors import ConfigError, DeviceUnavailable
from tilewise.model.config import NUM_LABELS, ModelConfig
from tilewise.train.data import Examples

ACTION_LABELS = ("soft_drop", "hard_drop", "rotate_cw", "rotate_ccw", "left", "right", "reserved_6", "reserved_7")


@dataclass
class TrainSettings:
    """Knobs of one run (all recorded in the output folder's `training.json`).

    Attributes:
        epochs: passes over the training set (a cap; `max_steps` and `time_budget_s` may stop earlier).
        max_steps: optimizer steps cap (0: no cap beyond epochs).
        time_budget_s: wall-clock cap on the training loop in seconds (0: none).
        batch_size: decisions per step.
        lr: peak learning rate.
        weight_decay: AdamW decay on matrices (not on norms).
        warmup_steps: linear warm-up length.
        seed: seeds the init, the shuffles and the held-out split.
        device: `auto` (CUDA when available), `cpu` or `cuda[:N]`.
        eval_every_s: seconds between held-out evaluations during training (0: only at the end).
        log_every: steps between progress lines.
        compile: wrap the model in `torch.compile`.
        init: a model folder (`tilewise train` output, or any folder `load_torch_model` reads) whose weights the
            run starts from; its shape must be the run's. Empty: a fresh seeded initialisation.
        aux_target_weight: weight of an auxiliary loss during training only: from the same last hidden state, a
            linear head predicts the expert's target placement (rotation state and pivot column, two
            cross-entropies) where the data records it. The head is not part of the exported model. 0: off.
        train_eval_examples: training decisions (the first ones) whose agreement is reported at the end; 0 skips
            it (train_accuracy stays NaN). On a CPU 20,000 decisions of the default shape take about half an hour.
    """

    epochs: float = 1.0
    max_steps: int = 0
    time_budget_s: float = 0.0
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_steps: int = 100
    seed: int = 0
    device: str = "auto"
    eval_every_s: float = 30.0
    log_every: int = 50
    compile: bool = False
    init: str = ""
    aux_target_weight: float = 0.0
    train_eval_examples: int = 20_000


@dataclass
class TrainResult:
    """What a run did and reached."""

    steps: int = 0
    epochs_done: float = 0.0
    train_time_s: float = 0.0
    examples_seen: int = 0
    tokens_per_s: float = 0.0
    final_train_loss: float = float("nan")
    train_accuracy: float = float("nan")
    heldout_accuracy: float = float("nan")
    heldout_loss: float = float("nan")
    heldout_examples: int = 0
    heldout_per_action: dict[str, float] = field(default_factory=dict)
    heldout_by_data: list[dict[str, Any]] = field(default_factory=list)
    device: str = ""
    stopped_by: str = ""
    aux_target_batch_accuracy: float = float("nan")  # last logged batch: rotation and column both right


def pick_device(name: str) -> Any:
    """Resolve `auto`/`cpu`/`cuda[:N]` to a torch device, with a clear error when CUDA is asked for but absent."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceUnavailable(f"--device {name}: torch {torch.__version__} sees no CUDA GPU",
                                    "use --device cpu (slow) or auto, or install a CUDA build of torch")
        return torch.device(name)
    raise ConfigError(f"unknown training device {name!r}", "use auto, cpu or cuda[:N]")


def lr_factor(progress: float, step: int, warmup_steps: int) -> float:
    """Multiplier of the peak learning rate: linear warm-up, then a cosine from 1 down to 0.1 at progress 1."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    p = min(max(progress, 0.0), 1.0)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * p))


def evaluate(model: Any, ex: Examples, device: Any, batch_size: int = 256) -> dict[str, Any]:
    """Agreement with the expert on `ex`: accuracy, mean cross-entropy, and accuracy per expert action.

    Args:
        model: an `Lfm2Classifier`.
        ex: the examples (e.g. held-out games).
        device: torch device.
        batch_size: decisions per forward.

    Returns:
        dict with `accuracy`, `loss`, `examples`, `per_action` (action name -> accuracy) and `predictions` (N,).
    """
    import torch
    import torch.nn.functional as F

    n = len(ex)
    if n == 0:
        return {"accuracy": float("nan"), "loss": float("nan"), "examples": 0, "per_action": {},
                "predictions": np.zeros(0, np.int64)}
    was_training = model.training
    model.eval()
    preds = np.zeros(n, dtype=np.int64)
    loss_sum = 0.0
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else _null()
    with torch.no_grad(), autocast:
        for start in range(0, n, batch_size):
            sl = slice(start, min(start + batch_size, n))
            lengths = ex.lengths[sl]
            width = int(lengths.max())
            ids = torch.as_tensor(ex.ids[sl, :width], device=device)
            scores = model(ids, torch.as_tensor(lengths, device=device))  # (b, 8)
            target = torch.as_tensor(ex.actions[sl], device=device)
            loss_sum += float(F.cross_entropy(scores[:, :6], target, reduction="sum"))
            preds[sl] = scores[:, :6].argmax(-1).cpu().numpy()
    model.train(was_training)
    return {"accuracy": float((preds == ex.actions).mean()), "loss": loss_sum / n, "examples": n,
            "per_action": per_action_accuracy(preds, ex.actions), "predictions": preds}


def per_action_accuracy(preds: np.ndarray, actions: np.ndarray) -> dict[str, float]:
    """Accuracy of `preds` among the examples of each expert action (actions that occur only)."""
    out = {}
    for a in range(6):
        sel = actions == a
        if sel.any():
            out[ACTION_LABELS[a]] = float((preds[sel] == a).mean())
    return out


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def initial_model(cfg: ModelConfig, settings: TrainSettings) -> Any:
    """The model a run starts from (float32, CPU): `settings.init`'s weights, or a fresh seeded init of `cfg`.

    Raises:
        ConfigError: the init folder's model has another shape than `cfg`.
    """
    import torch

    from tilewise.train.model import Lfm2Classifier

    if settings.init:
        from tilewise.train.export import load_torch_model

        model = load_torch_model(settings.init)
        got, want = shape_key(model.cfg), shape_key(cfg)
        if got != want:
            raise ConfigError(f"the --init model {settings.init} has shape {got}, the run asks for {want}",
                              "leave out --shape and its overrides with --init (the model's shape is used), or "
                              "start a fresh run")
        return model.float().train()
    torch.manual_seed(settings.seed)
    model = Lfm2Classifier(cfg)
    model.init_weights(settings.seed)
    return model


def shape_key(cfg: ModelConfig) -> dict[str, Any]:
    """The fields that make two classifiers' weights interchangeable."""
    return {"vocab": cfg.vocab_size, "hidden": cfg.hidden_size, "ffn": cfg.ffn_dim,
            "layers": list(cfg.layer_types), "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "labels": cfg.num_labels}


def train(cfg: ModelConfig, train_ex: Examples, heldout_ex: Examples, settings: TrainSettings,
          log: Callable[[str], None] = print, heldout_parts: list[Examples] | None = None,
          repeats: np.ndarray | None = None) -> tuple[Any, TrainResult]:
    """Train a classifier of shape `cfg` (fresh, or from `settings.init`) to predict the expert's action.

    Args:
        cfg: model shape (vocab_size must cover the dataset's token ids).
        train_ex: training decisions.
        heldout_ex: held-out decisions (whole games) for agreement numbers.
        settings: the run's knobs.
        log: where progress lines go.
        heldout_parts: the held-out decisions split by source (e.g. per dataset file); when there are two or
            more, the agreement on each is reported too (`TrainResult.heldout_by_data`).
        repeats: (N,) how many times each training decision is in an epoch (oversampling; default once each).

    Returns:
        (the trained `Lfm2Classifier` in float32 on the CPU, the result record).
    """
    import torch
    import torch.nn.functional as F

    if len(train_ex) == 0:
        raise ConfigError("no training decisions left after holding out games", "generate more games")
    if settings.aux_target_weight < 0:
        raise ConfigError(f"aux_target_weight {settings.aux_target_weight} is negative", "use 0 (off) or a weight > 0")
    if settings.batch_size < 1:
        raise ConfigError(f"batch size {settings.batch_size} must be >= 1", "use e.g. --batch 64")
    top = int(train_ex.ids.max())
    if top >= cfg.vocab_size:
        raise ConfigError(f"token id {top} in the data is outside the model's vocabulary of {cfg.vocab_size}",
                          "train with the tokenizer that made the dataset (vocab_size comes from it)")
    device = pick_device(settings.device)
    model = initial_model(cfg, settings)
    if settings.init:
        log(f"train: starting from the weights of {settings.init}")
    model.to(device).train()
    aux_head = None
    if settings.aux_target_weight > 0:
        if train_ex.targets is None:
            log("train: the data records no expert targets (made before they were recorded): auxiliary target "
                "loss off; regenerate the data to use it")
        else:
            from tilewise.game.pieces import BOARD_WIDTH

            # logits: 4 rotation states, then BOARD_WIDTH pivot columns; training only, never exported
            aux_head = torch.nn.Linear(cfg.hidden_size, 4 + BOARD_WIDTH, bias=False).to(device)
            log(f"train: auxiliary target loss, weight {settings.aux_target_weight}")
    params = list(model.parameters()) + ([] if aux_head is None else list(aux_head.parameters()))
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    fused = device.type == "cuda"
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=settings.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    step_fn = torch.compile(model) if settings.compile else model

    n = len(train_ex)
    pool = None  # with repeats: the training indices of one epoch, each repeated
    if repeats is not None:
        repeats = np.asarray(repeats, dtype=np.int64).reshape(-1)
        if repeats.shape != (n,) or int(repeats.min()) < 0 or int(repeats.sum()) == 0:
            raise ConfigError(f"repeats must be {n} non-negative counts, not all 0", "pass one count per decision")
        pool = np.repeat(np.arange(n), repeats)
    n_epoch = n if pool is None else int(pool.size)
    steps_per_epoch = max(1, n_epoch // settings.batch_size)
    max_steps = math.ceil(settings.epochs * steps_per_epoch)
    if settings.max_steps:
        max_steps = min(max_steps, settings.max_steps)
    log(f"train: {n} decisions ({len(np.unique(train_ex.games))} games), held out {len(heldout_ex)} "
        f"({len(np.unique(heldout_ex.games))} games); {cfg.parameter_count():,} parameters; device {device}; "
        f"batch {settings.batch_size}; up to {max_steps} steps"
        + (f" or {settings.time_budget_s:.0f} s" if settings.time_budget_s else ""))
    log(f"train: expert actions {dict(zip(ACTION_LABELS, train_ex.action_counts(), strict=False))}")

    # the whole training set lives on the device (a few GB at most); batches are gathered there
    ids_all = torch.as_tensor(train_ex.ids, device=device)  # (N, T) int32
    len_all = torch.as_tensor(train_ex.lengths, device=device)  # (N,)
    act_all = torch.as_tensor(train_ex.actions, device=device)  # (N,)
    tgt_all = None if aux_head is None else torch.as_tensor(train_ex.targets, device=device)  # (N, 2) rot, x
    gen = torch.Generator(device="cpu").manual_seed(settings.seed + 1)
    pool_t = None if pool is None else torch.as_tensor(pool, device=device)

    def new_order() -> Any:  # on the device: a batch's indices need no copy
        perm = torch.randperm(n_epoch, generator=gen).to(device)
        return perm if pool_t is None else pool_t[perm]

    order = new_order()
    cursor = 0

    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" else _null
    result = TrainResult(device=str(device))
    t_start = time.perf_counter()
    t_log, t_eval = t_start, t_start
    tokens_since, loss_sum, correct, seen = 0, 0.0, 0, 0
    tokens_total = 0
    step = 0
    result.stopped_by = "steps"
    while step < max_steps:
        elapsed = time.perf_counter() - t_start
        if settings.time_budget_s and elapsed >= settings.time_budget_s:
            result.stopped_by = "time budget"
            break
        progress = step / max_steps
        if settings.time_budget_s:
            progress = max(progress, elapsed / settings.time_budget_s)
        for group in opt.param_groups:
            group["lr"] = settings.lr * lr_factor(progress, step, settings.warmup_steps)
        if cursor + settings.batch_size > n_epoch:
            order = new_order()
            cursor = 0
        idx = order[cursor: cursor + settings.batch_size]
        cursor += settings.batch_size
        lengths = len_all[idx]
        # trim to this batch's longest prompt (prompts differ by a few tokens at most)
        width = int(lengths.max()) if device.type == "cpu" else ids_all.shape[1]
        ids = ids_all[idx, :width]
        target = act_all[idx]
        with autocast():
            if aux_head is None:
                scores = step_fn(ids, lengths)  # (B, 8) float32
            else:
                scores, hidden = step_fn(ids, lengths, return_hidden=True)  # (B, 8), (B, H)
                aux = aux_head(hidden).float()  # (B, 4 + BOARD_WIDTH)
        loss = F.cross_entropy(scores[:, :6], target)
        if aux_head is not None:
            tgt = tgt_all[idx]  # (B, 2); -1: nothing reachable, no target
            aux_loss = (F.cross_entropy(aux[:, :4], tgt[:, 0], ignore_index=-1)
                        + F.cross_entropy(aux[:, 4:], tgt[:, 1], ignore_index=-1))
            loss = loss + settings.aux_target_weight * aux_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        tokens = int(settings.batch_size * width)
        tokens_since += tokens
        tokens_total += tokens
        if step % settings.log_every == 0 or step == max_steps:
            # one host sync per log line keeps the GPU queue full between them
            loss_sum = float(loss.detach())
            aux_note = ""
            if aux_head is not None:
                hit = (aux[:, :4].argmax(-1) == tgt[:, 0]) & (aux[:, 4:].argmax(-1) == tgt[:, 1])
                valid = tgt[:, 0] >= 0
                result.aux_target_batch_accuracy = float(hit[valid].float().mean()) if bool(valid.any()) else 0.0
                aux_note = f"  aux {float(aux_loss.detach()):.4f} (target acc {result.aux_target_batch_accuracy:.3f})"
            correct = int((scores[:, :6].argmax(-1) == target).sum())
            seen = int(target.numel())
            now = time.perf_counter()
            log(f"step {step:6d}  epoch {step / steps_per_epoch:5.2f}  loss {loss_sum:.4f}{aux_note}  "
                f"batch acc {correct / seen:.3f}  lr {opt.param_groups[0]['lr']:.2e}  "
                f"{tokens_since / max(now - t_log, 1e-9):,.0f} tok/s  {now - t_start:6.1f} s")
            t_log, tokens_since = now, 0
            result.final_train_loss = loss_sum
            if settings.eval_every_s and now - t_eval >= settings.eval_every_s and len(heldout_ex):
                # a slice of the held-out games keeps the pause short; the full set is scored at the end
                ev = evaluate(model, heldout_ex.subset(np.arange(len(heldout_ex)) < 8192), device)
                log(f"eval  step {step:6d}  held-out agreement {ev['accuracy']:.4f}  loss {ev['loss']:.4f}")
                t_eval = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.synchronize()
    result.train_time_s = time.perf_counter() - t_start
    result.steps = step
    result.epochs_done = step / steps_per_epoch
    result.examples_seen = step * settings.batch_size
    result.tokens_per_s = tokens_total / max(result.train_time_s, 1e-9)
    if step == 0:
        raise ConfigError("training stopped before its first step", "raise --time-budget-s or --steps")

    if heldout_parts is not None and len(heldout_parts) > 1:
        # each source on its own, and the whole held-out set from the same predictions (it is their concatenation)
        evs = [evaluate(model, part, device) for part in heldout_parts]
        for k, ev_k in enumerate(evs):
            result.heldout_by_data.append({"part": k, "accuracy": ev_k["accuracy"], "loss": ev_k["loss"],
                                           "examples": ev_k["examples"], "per_action": ev_k["per_action"]})
        preds = np.concatenate([e["predictions"] for e in evs])
        total = sum(e["examples"] for e in evs)
        ev = {"accuracy": float((preds == heldout_ex.actions).mean()) if total else float("nan"),
              "loss": sum(e["loss"] * e["examples"] for e in evs if e["examples"]) / max(total, 1),
              "examples": total, "per_action": per_action_accuracy(preds, heldout_ex.actions)}
    else:
        ev = evaluate(model, heldout_ex, device)
    sample = train_ex.subset(np.arange(n) < min(n, max(0, settings.train_eval_examples)))
    ev_train = evaluate(model, sample, device)
    result.heldout_accuracy, result.heldout_loss = ev["accuracy"], ev["loss"]
    result.heldout_examples, result.heldout_per_action = ev["examples"], ev["per_action"]
    result.train_accuracy = ev_train["accuracy"]
    log(f"done: {step} steps in {result.train_time_s:.1f} s ({result.stopped_by}), "
        f"{result.tokens_per_s:,.0f} tok/s; train agreement {result.train_accuracy:.4f}, "
        f"held-out agreement {result.heldout_accuracy:.4f} on {result.heldout_examples} decisions")
    for part in result.heldout_by_data:
        log(f"done: held-out agreement on data file {part['part']}: {part['accuracy']:.4f} on {part['examples']} "
            "decisions")
    model = model.to("cpu").float().eval()
    return model, result


def hf_config_dict(cfg: ModelConfig) -> dict[str, Any]:
    """config.json of the trained classifier: HF LFM2 fields plus the 8 labels."""
    d = cfg.to_hf_dict()
    d["architectures"] = ["Lfm2ForSequenceClassification"]
    d["id2label"] = {str(i): name for i, name in enumerate(ACTION_LABELS[:NUM_LABELS])}
    d["label2id"] = {name: i for i, name in enumerate(ACTION_LABELS[:NUM_LABELS])}
    d["torch_dtype"] = "float32"
    return d


def save_hf_folder(model: Any, cfg: ModelConfig, out_dir: str | Path, tokenizer_path: str | Path,
                   training: dict[str, Any] | None = None) -> Path:
    """Write an HF-style folder: config.json, model.safetensors (float32, HF names), tokenizer.json, training.json.

    Args:
        model: the trained `Lfm2Classifier`.
        cfg: its shape.
        out_dir: the folder (created).
        tokenizer_path: the tokenizer.json the dataset was made with (copied).
        training: settings and results recorded next to the weights (skipped when None).

    Returns:
        The folder.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config_dict(cfg), indent=2) + "\n")
    tensors = {k: v.detach().to("cpu").float().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors creates it owner-only
    shutil.copyfile(tokenizer_path, out / "tokenizer.json")
    if training is not None:
        (out / "training.json").write_text(json.dumps(training, indent=2, default=_jsonable) + "\n")
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if hasattr(x, "__dataclass_fields__"):
        return asdict(x)
    return str(x)
