"""From a trained HF folder to what tilewise ships: NF4 conversion, and reading a folder back into torch.

Both go through `tilewise.model.checkpoint.Checkpoint`, the loader every tilewise executor uses, so a folder
that converts here is one the runtime reads: a missing tensor, a wrong shape or a truncated file fails with
that loader's message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tilewise.errors import ConfigError


def convert_to_nf4(src: str | Path, dst: str | Path, blocksize: int = 64) -> Path:
    """Convert an HF LFM2 classifier folder to tilewise's NF4 format (what `tilewise convert --format nf4` does).

    Args:
        src: the HF folder written by `tilewise train`.
        dst: the output folder (config.json, model.safetensors with NF4 matrices, tokenizer.json).
        blocksize: NF4 block size (64, bitsandbytes' default).

    Returns:
        The output folder.
    """
    from tilewise.model.checkpoint import Checkpoint

    ck = Checkpoint.open(src)
    if not ck.has_head:
        raise ConfigError(f"{src} has no classifier head (score.weight)", "convert a folder written by tilewise train")
    return ck.converted("nf4", blocksize=blocksize).save(dst)


def checkpoint_weights(path: str | Path) -> tuple[Any, dict[str, np.ndarray]]:
    """Open any tilewise-readable model folder and return (config, float32 tensors by canonical name).

    NF4 matrices come back dequantized, so the result feeds `load_torch_model` or the float64 reference.
    """
    from tilewise.model.checkpoint import Checkpoint

    ck = Checkpoint.open(path)
    if not ck.has_head:
        raise ConfigError(f"{path} has no classifier head (score.weight)", "use a folder written by tilewise train")
    return ck.config, {name: ck.float32(name) for name in ck.names()}


def load_torch_model(path: str | Path) -> Any:
    """Read a model folder (HF float or tilewise NF4/f16/f32) into an `Lfm2Classifier` (float32, CPU, eval mode).

    Args:
        path: the folder.

    Returns:
        The torch model.
    """
    import torch

    from tilewise.train.model import Lfm2Classifier

    cfg, tensors = checkpoint_weights(path)
    model = Lfm2Classifier(cfg)
    state = {("score.weight" if k == "score.weight" else "model." + k): torch.from_numpy(np.array(v, np.float32))
             for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConfigError(f"{path}: tensors missing {missing[:3]} / unexpected {unexpected[:3]} for an LFM2 classifier",
                          "use a folder written by tilewise train or tilewise convert")
    return model.eval()
