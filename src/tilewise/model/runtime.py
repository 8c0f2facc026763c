"""The classifier runtime: `load()`, the device-independent `Model` and `State`, and the executors by backend.

Split so that another device only has to add an executor:
- `Model` (any device): token-id checks, positions, the branching contract (`extend` returns a new State and
  never changes its input, so many decisions branch from one cached prefix), `hidden()` and `scores()`.
- `State` (any device): token count, the final-normed hidden state of the last position (a host array: it is
  all the classifier reads) and the executor's own per-layer caches (opaque to `Model`).
- `Executor` (one per device): `forward(ids, state, final_row_slicing)` -> (last hidden, caches). The row
  plan of final-row slicing (`block_rows` below) is shared: after the last attention block only the rows the last
  row's hidden state reaches back to are computed (in the last block one row), while the K/V rows and conv states
  every later token needs are kept.
- `EXECUTORS`: backend -> executor (`model/cpu.py`, `model/webgpu.py`, `model/cuda.py`); `load` resolves its
  device with the one device resolver against these backends, so `auto` is the fastest device that has an executor.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tilewise.devices import Choice, resolve
from tilewise.errors import ConfigError, TilewiseError
from tilewise.model.checkpoint import HEAD, Checkpoint, is_matrix, random_tensors
from tilewise.model.config import PRESETS, ModelConfig
from tilewise.quant.nf4 import FORMATS

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "default"


@dataclass(frozen=True, eq=False)
class State:
    """The model after some tokens; immutable (extend() returns a new one).

    Attributes:
        n_tokens: tokens consumed so far (the next token's position).
        last_hidden: (hidden,) float32, final-normed hidden state at the last position (read-only).
        caches: the executor's per-layer continuation state (conv rows, K/V); never modified in place.
        owner: id of the Model that made it (a state cannot move between models).
    """

    n_tokens: int
    last_hidden: np.ndarray
    caches: Any
    owner: int


class Executor(Protocol):
    """What a device contributes: the forward pass over new tokens with continuation state."""

    device_name: str

    def forward(self, ids: np.ndarray, start: int, caches: Any, final_row_slicing: bool) -> tuple[np.ndarray, Any]:
        """Run new tokens `ids` (n,) at positions start..start+n-1 after `caches` (None at the start).

        Returns:
            ((hidden,) float32 final-normed hidden state of the last new token, new caches). The input caches
            must not be modified.
        """
        ...


@dataclass(frozen=True)
class BlockRows:
    """One block's share of a forward over n new tokens, each count taken from the end (the last rows):
    `inputs` rows go into its mixer (a conv block's Bx rows; an attention block takes every row, whose K and V later
    tokens read) and `outputs` rows come out of it (mixer output, residual, FFN)."""

    inputs: int
    outputs: int


def block_rows(layer_types: Sequence[str], conv_L: int, n_rows: int, final_row_slicing: bool) -> list[BlockRows]:
    """Each block's rows: every row everywhere, or (final-row slicing) only what the last row's hidden state and
    the new caches need, worked out from the last block back. The last block outputs one row; a conv block's output
    rows need the L - 1 Bx rows before them (and its new conv state the last L), so its input is L - 1 rows more;
    an attention block needs every input row for its K/V cache, so every block before the last attention block runs
    whole, and the blocks after it shrink to the few rows the convs after them reach back to."""
    need, plan = (1 if final_row_slicing else n_rows), []
    for kind in reversed(layer_types):
        out = min(need, n_rows)
        need = n_rows if kind != "conv" or out == n_rows else min(n_rows, out + conv_L - 1)
        plan.append(BlockRows(need, out))
    return plan[::-1]


def tail_capacity(layer_types: Sequence[str], conv_L: int) -> int:
    """The most rows a sliced block outputs at any prompt length (the residual rows that leave the full-size
    buffers): at least 1."""
    big = 1 << 30
    return max([1] + [b.outputs for b in block_rows(layer_types, conv_L, big, True) if b.outputs < big])


class Model:
    """An LFM2 classifier on one device; see the module docstring for the contract."""

    def __init__(self, checkpoint: Checkpoint, executor: Executor, head: np.ndarray | None,
                 tokenizer: Any = None) -> None:
        self.config: ModelConfig = checkpoint.config
        self.checkpoint = checkpoint
        self.executor = executor
        self.device = executor.device_name
        self.weights = checkpoint.weights
        self.tokenizer = tokenizer
        self.final_row_slicing = True
        #: the resolved device and why it was picked (set by `from_checkpoint`)
        self.device_choice: Choice | None = None
        self._head = head  # (num_labels, hidden) float32 or None
        self._encoder: Any = None  # a PromptEncoder for text prompts, made on the first one

    def __repr__(self) -> str:
        c = self.config
        return (f"Model({c.name}: {c.num_layers} blocks, hidden {c.hidden_size}, ffn {c.ffn_dim}, vocab "
                f"{c.vocab_size}, weights {self.weights}, device {self.device})")

    def encode(self, text: str) -> list[int]:
        """Token ids of a text prompt (the chat template's special tokens are written in the text itself)."""
        if self.tokenizer is None:
            raise ConfigError(f"model {self.checkpoint.source} has no tokenizer.json, so it cannot read text",
                              "pass token ids, or put the model's tokenizer.json in its folder")
        if self._encoder is None or self._encoder.tok is not self.tokenizer:
            from tilewise.model.text import PromptEncoder

            self._encoder = PromptEncoder(self.tokenizer)
        return self._encoder(text)

    def _ids(self, ids: Sequence[int] | np.ndarray | str, start: int) -> np.ndarray:
        if isinstance(ids, str):
            ids = self.encode(ids)
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise ConfigError(f"token ids must be a 1-D sequence of integers, got shape {arr.shape} of {arr.dtype}",
                              "pass a list of token ids (batch size is 1)")
        if arr.size == 0:
            raise ConfigError("no token ids given", "pass at least one token id")
        ids = arr.astype(np.int64, copy=False)  # the executors stage the ids at once and keep no reference
        # one reduction, no mask (this runs before every decision, in series with the GPU): read as unsigned, a
        # negative id (or a uint64 one past int64) is above every vocabulary
        if ids.view(np.uint64).max() >= self.config.vocab_size:
            bad = (arr < 0) | (arr >= self.config.vocab_size)
            first = int(np.argmax(bad))
            raise ConfigError(f"token id {int(arr[first])} at index {first} is outside the vocabulary "
                              f"(0..{self.config.vocab_size - 1})", "tokenize with this model's tokenizer")
        if start + arr.size > self.config.max_position_embeddings:
            raise ConfigError(f"sequence of {start + arr.size} tokens exceeds the model's "
                              f"{self.config.max_position_embeddings} positions", "shorten the prompt")
        return ids

    def prefill(self, token_ids: Sequence[int] | np.ndarray | str) -> State:
        """Run a prompt from the start.

        Args:
            token_ids: (n,) token ids (or text, when the model has a tokenizer).

        Returns:
            The state after the prompt.
        """
        ids = self._ids(token_ids, 0)
        hidden, caches = self.executor.forward(ids, 0, None, self.final_row_slicing)
        return self._state(ids.size, hidden, caches)

    def extend(self, state: State, token_ids: Sequence[int] | np.ndarray | str) -> State:
        """Continue from a state with more tokens; `state` itself is left unchanged (branch freely).

        Args:
            state: a state from this model's prefill() or extend().
            token_ids: (n,) token ids to append.

        Returns:
            A new state.
        """
        self._check_state(state)
        ids = self._ids(token_ids, state.n_tokens)
        hidden, caches = self.executor.forward(ids, state.n_tokens, state.caches, self.final_row_slicing)
        return self._state(state.n_tokens + ids.size, hidden, caches)

    def hidden(self, state: State) -> np.ndarray:
        """(hidden,) float32 final-normed hidden state at the last position."""
        self._check_state(state)
        return state.last_hidden.copy()

    def scores(self, state: State) -> np.ndarray:
        """(num_labels,) = (8,) float32 classifier scores at the last position."""
        self._check_state(state)
        if self._head is None:
            raise ConfigError(f"checkpoint {self.checkpoint.source} has no classifier head ({HEAD}, "
                              f"{self.config.num_labels} x {self.config.hidden_size})",
                              "use hidden(state), or load a checkpoint trained with a classifier head")
        return self._head @ state.last_hidden

    def _state(self, n_tokens: int, hidden: np.ndarray, caches: Any) -> State:
        hidden = np.array(hidden, dtype=np.float32)
        hidden.setflags(write=False)
        return State(n_tokens=n_tokens, last_hidden=hidden, caches=caches, owner=id(self))

    def _check_state(self, state: State) -> None:
        if not isinstance(state, State):
            raise ConfigError(f"expected a State from prefill() or extend(), got {type(state).__name__}",
                              "pass the state a previous call returned")
        if state.owner != id(self):
            raise ConfigError("this state belongs to another model", "continue a state on the model that made it")


def _cpu_executor(ck: Checkpoint, device: Any, quiet: bool = False) -> Any:
    from tilewise.model.cpu import CPUExecutor

    return CPUExecutor(ck)


def _webgpu_executor(ck: Checkpoint, device: Any, quiet: bool = False) -> Any:
    from tilewise.model.webgpu import WebGPUExecutor  # no GPU library is imported until a WebGPU model is loaded

    return WebGPUExecutor(ck, device=device, quiet=quiet)


def _cuda_executor(ck: Checkpoint, device: Any, quiet: bool = False) -> Any:
    from tilewise.model.cuda import CUDAExecutor  # CuPy is imported only when a CUDA model is loaded

    return CUDAExecutor(ck, device=device, quiet=quiet)


#: backend -> executor factory(checkpoint, device, quiet=...); its keys are the backends `auto` may pick
EXECUTORS: dict[str, Any] = {"cuda": _cuda_executor, "webgpu": _webgpu_executor, "cpu": _cpu_executor}
#: what `auto` may pick for the classifier, fastest first: on an NVIDIA GPU the CUDA executor (tensor cores, one
#: graph replay per decision) decided faster than either WebGPU runtime on the same GPU (docs/journal/model.md)
AUTO_EXECUTORS = ("cuda", "webgpu", "cpu")


# ---------------------------------------------------------------------------------------------------------------
# load


#: a step of `load` is reported once it has taken this long (seconds): a fast load prints nothing
PROGRESS_AFTER_S = 1.0


class Progress:
    """Short lines on stderr for the steps of `load` that take a while (`loading tiny: quantizing 20 tensors to NF4
    ... 3.1 s`). A step is announced once it has run `PROGRESS_AFTER_S`, while it still runs, and finished with its
    time; a step that ends sooner prints nothing, so a fast load (and `quiet=True`) stays silent."""

    def __init__(self, name: str, quiet: bool = False) -> None:
        self.name, self.quiet = name, quiet

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        if self.quiet:
            yield
            return
        t0 = time.perf_counter()
        shown = threading.Event()

        def announce() -> None:
            shown.set()
            print(f"loading {self.name}: {what} ...", end="", file=sys.stderr, flush=True)

        timer = threading.Timer(PROGRESS_AFTER_S, announce)
        timer.daemon = True
        if PROGRESS_AFTER_S <= 0:
            announce()
        else:
            timer.start()
        try:
            yield
        finally:
            timer.cancel()
            if timer.is_alive():
                timer.join()  # an announcement under way ends its line before the time is added
            if shown.is_set():
                print(f" {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


def open_checkpoint(path_or_preset: str | Path, weights: str = "nf4", seed: int = 0,
                    progress: Progress | None = None) -> Checkpoint:
    """The checkpoint behind a preset name, `default`, or a path, with its matrices in `weights` format."""
    if weights not in FORMATS:
        raise ConfigError(f"unknown weights format {weights!r}", f"use one of {', '.join(FORMATS)}")
    name = str(path_or_preset)
    progress = progress or Progress(name, quiet=True)
    if name == "default":
        if not ((DEFAULT_MODEL_DIR / "config.json").exists() or (DEFAULT_MODEL_DIR / "model.safetensors").exists()):
            raise TilewiseError(f"no bundled model is present (expected it in {DEFAULT_MODEL_DIR})",
                                f"pass a preset ({', '.join(PRESETS)}) with seeded random weights, or the path of "
                                "an HF LFM2 folder or a tilewise checkpoint")
        ck = Checkpoint.open(DEFAULT_MODEL_DIR)
    elif name in PRESETS and not Path(name).exists():
        with progress.step(f"seeded random weights (seed {seed})"):
            ck = Checkpoint.from_arrays(PRESETS[name], random_tensors(PRESETS[name], seed), "f32", f"preset:{name}")
    else:
        if not Path(name).exists():
            raise ConfigError(f"{name!r} is neither a model preset nor an existing path",
                              f"use one of {', '.join(PRESETS)}, 'default', or a model folder")
        ck = Checkpoint.open(name)
    if ck.weights == weights:
        return ck
    n_matrices = sum(is_matrix(n) for n in ck.names())
    what = f"quantizing {n_matrices} tensors to NF4" if weights == "nf4" else f"converting {n_matrices} tensors " \
        f"to {weights}"
    with progress.step(what):  # converted now, so the step's time is its own (the executor then only uploads)
        return ck.converted(weights).materialize()


def resolve_device(device: Any = "auto", model: str | None = None) -> Choice:
    """The device a model runs on: a name (`auto`, `cpu`, `webgpu:1`, ...) or a Choice, checked against the
    executors (a device without one is refused with the reason). On a GPU both WebGPU runtimes reach, `auto` takes
    the one `tilewise bench` measured faster (deciding `model` where recorded, `model/measured.py`)."""
    if isinstance(device, Choice):
        return device
    if str(device).strip().lower() == "auto":
        from tilewise.model.measured import faster_runtime

        choice = resolve("auto", AUTO_EXECUTORS, job="the classifier", noun="executor", measured=faster_runtime(model))
        if choice.device.info.backend == "cuda":
            from tilewise.model.cuda import cuda_executor_problem  # no CuPy import: it reads the device's info

            why = cuda_executor_problem(choice.device.info)
            if why is not None:  # an older NVIDIA GPU: the WebGPU executor runs there
                rest = tuple(b for b in AUTO_EXECUTORS if b != "cuda")
                other = resolve("auto", rest, job="the classifier", noun="executor", measured=faster_runtime(model))
                return Choice(other.device, other.name, f"{other.reason}; not CUDA: {why}")
            return Choice(choice.device, choice.name, f"{choice.reason}; the CUDA executor (tensor cores) over "
                                                      "WebGPU on NVIDIA GPUs (--device webgpu takes WebGPU)")
        return choice
    return resolve(str(device), tuple(EXECUTORS), job="the classifier", noun="executor")


def load(path_or_preset: str | Path = "default", device: Any = "auto", weights: str = "nf4", seed: int = 0,
         quiet: bool = False) -> Model:
    """Load a classifier model onto a device.

    Args:
        path_or_preset: `default` (the bundled model), a preset (`lfm2-350m`, `seed-250m`, `tiny`: seeded random
            weights), or a path to an HF LFM2 folder / tilewise checkpoint.
        device: `auto` (the fastest device with an executor: a GPU over the CPU, the CPU over a software
            adapter), `cpu`, `webgpu`, `webgpu:N`, `cuda` or `cuda:N`; `model.device_choice.line()` says which and
            why.
        weights: the storage format the matrices run from: `nf4`, `f16` or `f32`.
        seed: the seed of a preset's random weights.
        quiet: print nothing; otherwise a step that takes over a second (random weights, NF4 quantization,
            the weights' upload) says so on stderr, and a WebGPU device without a tuned table says how to tune.

    Returns:
        The Model (prefill / extend / hidden / scores).
    """
    choice = resolve_device(device, str(path_or_preset))  # a bad device fails before any weights are read
    progress = Progress(Path(str(path_or_preset)).name or str(path_or_preset), quiet)
    ck = open_checkpoint(path_or_preset, weights=weights, seed=seed, progress=progress)
    return from_checkpoint(ck, device=choice, quiet=quiet, progress=progress)


def from_checkpoint(ck: Checkpoint, device: Any = "auto", quiet: bool = False,
                    progress: Progress | None = None) -> Model:
    """Build a Model from an opened (or in-memory) checkpoint; its weights run in the checkpoint's format.

    Args:
        ck: the checkpoint (see `Checkpoint.open`, `Checkpoint.from_arrays`, `Checkpoint.converted`).
        device: as in `load` (a name or a resolved `Choice`).
        quiet: as in `load`.
        progress: where step lines go (default: one for this checkpoint's config name).

    Returns:
        The Model.
    """
    choice = resolve_device(device)
    progress = progress or Progress(ck.config.name, quiet)
    backend = choice.device.info.backend
    with progress.step(f"{'preparing float32 weights for' if backend == 'cpu' else 'uploading weights to'} "
                       f"{choice.device.info.name}"):
        executor = EXECUTORS[backend](ck, choice.device, quiet=quiet)
    head = ck.float32(HEAD).astype(np.float32) if ck.has_head else None
    tokenizer = None
    if ck.tokenizer_path is not None:
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(ck.tokenizer_path))
        except Exception as exc:  # the tokenizers library raises its own exception type
            raise ConfigError(f"cannot read {ck.tokenizer_path}: {exc}", "replace tokenizer.json") from exc
        if tokenizer.get_vocab_size() > ck.config.vocab_size:
            raise ConfigError(f"{ck.tokenizer_path} has {tokenizer.get_vocab_size()} tokens but the model's vocabulary"
                              f" is {ck.config.vocab_size}", "use the tokenizer that belongs to the model")
    model = Model(ck, executor, head, tokenizer)
    model.device_choice = choice
    return model
