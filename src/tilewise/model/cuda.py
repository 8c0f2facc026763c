"""The CUDA executor of the LFM2 classifier: the same `forward` contract as the WebGPU executor, on CUDA C++ kernels.

- weights are uploaded once in the checkpoint's format (NF4 packed as stored, f16, f32; norms, conv taps and head
  in f32); q/k/v rows are stacked (one projection launch per attention block);
- activation buffers have a row capacity (a power of two) and are reused; a decision writes only its token ids;
- a decision's launch list (`plan`) is reused per shape (length, start, cached base, pooled caches); per-op GPU
  times come from `forward(..., timed=True)`;
- each block's two RMSNorms are fused into the matmuls that read them (in_proj / qkv, gate/up); a matmul's f16
  prologue joins the launch before it where that one wrote exactly its rows: a residual split-K reduction, or the
  gate/up wgr launch and the short conv, which then store f16 rows for ffn.down and conv.out_proj (`fuse_prep`,
  bit-identical; `fuse_preps=False` keeps them apart, for a race);
- matmuls and attention take kernel and config per shape and row count from the device's dispatch table; without
  one, the short-row kernel below `MMA_FROM_ROWS` rows and the mma.sync kernel's default tile (`matmul_choice`);
- final-row slicing and the prefix cache as in model/webgpu.py: the blocks after the last attention block run the
  mixers' output projections and the FFNs on the rows the last row reaches back to (the last block on one);
  `forward` never writes its input caches (a new state gets pooled buffers, the K/V prefix rows are copied by a
  kernel in the same launch list, the conv reads the old state and writes another);
- one decision is one CUDA graph replay: a plan's launches, with the copy of the token ids in from a pinned staging
  array and of the result row out to another, are captured on the plan's first run and replayed by later decisions
  of that plan (`run_plan`); timed decisions, and `TILEWISE_CUDA_GRAPHS=0`, run launch by launch;
- with `TILEWISE_CUDA_PDL=1` (or `pdl=True`) untimed decisions launch each kernel with programmatic dependent launch
  (`devices/cuda_pdl.py`). Unless the caller or that variable says, PDL, the fused prologues, `serial_reduce`
  (split-K summed in each tile's last block, `cuda_fuse.summed_config`) and `fold_norm` (a residual matmul that
  sums in its launch hands the next wgr matmul its rows unnormed with their sums of squares, `cuda_fuse.fold_norm`)
  and `fuse_rope` (the q/k/v matmul writes q and the KV cache rows normed and rotated itself, `cuda_fuse.fuse_rope`)
  and `zero_copy` (the embedding reads the ids from the pinned array and the head writes the result row into the
  other, so a graph is only kernels) follow the dispatch table's `settings` for this model (raced on whole
  decisions by `tilewise tune model`, model/tune_settings.py; `CUDA_SETTINGS` defaults).

Device loss (a kernel fault poisons the CUDA context) raises `DeviceLost`; the next `forward` rebuilds the device
and weights and refuses states made before. A matmul's scratch (split-K's sums, f16 x rows) is executor-owned.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tilewise.devices.base import Buffer, Device, Program, capability, env_switch
from tilewise.devices.cuda import HostCopy
from tilewise.devices.cuda_pdl import PDL_ENV, pdl_from_env
from tilewise.errors import ConfigError, DeviceLost, DeviceUnavailable, LaunchError
from tilewise.kernels.attention import cuda as attn_k
from tilewise.kernels.attention.problem import rope_table
from tilewise.kernels.base import KernelTemplate
from tilewise.kernels.cudasrc import FMT_CODE, zeroed
from tilewise.kernels.matmul import cuda as mm
from tilewise.kernels.matmul.cuda_fuse import fold_norm, fuse_prep, fuse_rope, summed_config
from tilewise.kernels.rowops import cuda as rowops
from tilewise.kernels.shortconv.cuda import CudaShortConv
from tilewise.kernels.space import Config
from tilewise.model import dispatch as model_dispatch
from tilewise.model import gpu_state
from tilewise.model.checkpoint import Checkpoint
from tilewise.model.dispatch import (
    attention_key,
    attention_shape,
    checked_table,
    conv_choice,
    load_model_table,
    matmul_key,
)
from tilewise.model.gpu_state import GPUCaches, GPUResult, Plan, begin_decision, cache_capacity, keep_plan
from tilewise.quant.nf4 import stored_shape, weight_arrays

ROW_NT = 128  # embed threads per block
HEAD_NT = 256
MIN_ROW_CAPACITY = 64
GRAPHS_ENV = "TILEWISE_CUDA_GRAPHS"


def graphs_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether decisions replay CUDA graphs: `TILEWISE_CUDA_GRAPHS` 1/on (the default) or 0/off."""
    return env_switch(GRAPHS_ENV, True, f"set {GRAPHS_ENV}=0 to run decisions launch by launch, or 1 (the default) "
                      "to replay one CUDA graph per decision", environ)


#: the matmuls use `mma.sync.m16n8k16` f16 with f32 accumulation and `ldmatrix`: Ampere (8.0) or newer
MIN_COMPUTE_CAPABILITY = (8, 0)


def cuda_executor_problem(info: Any) -> str | None:
    """Why the CUDA executor cannot run on the device `info` describes (None: it can)."""
    cc = info.limits.compute_capability
    if cc is None:
        return None
    if capability(cc) < MIN_COMPUTE_CAPABILITY:
        return (f"{info.name} has compute capability {cc}; the CUDA executor's tensor-core matmuls need "
                f"{'.'.join(map(str, MIN_COMPUTE_CAPABILITY))} (Ampere) or newer")
    return None


class CUDAExecutor(GPUResult):
    """Runs the classifier's forward pass on an NVIDIA GPU (see the module docstring)."""

    device_name = "cuda"

    def __init__(self, checkpoint: Checkpoint, device: Device | str | None = None, quiet: bool = False,
                 dispatch: Any = None, graphs: bool | None = None, pdl: bool | None = None) -> None:
        self.checkpoint = checkpoint
        self._given_dispatch = dispatch
        self.cfg = checkpoint.config
        self.fmt = checkpoint.weights
        if self.fmt not in FMT_CODE:
            raise ConfigError(f"the CUDA executor runs nf4, f16 or f32 weights, not {self.fmt!r}",
                              "load with weights='nf4' (or f16 / f32)")
        self._given_device = device if not isinstance(device, str) and device is not None else None
        self._device_name = (device if isinstance(device, str) or device is None else f"cuda:{device.info.index}")
        self.quiet = quiet
        self.generation = 0
        self._lost = False
        self.last_op_times: list[tuple[str, float]] = []
        self.graphs = graphs_from_env() if graphs is None else graphs  # may be switched between decisions
        self.pdl = pdl_from_env() if pdl is None else pdl  # likewise; a plan's graph is captured per setting
        self.fuse_preps = True  # likewise; part of a plan's key
        self.serial_reduce = False  # likewise
        self.fold_norm = False  # likewise
        self.fuse_rope = False  # likewise
        self.zero_copy = False  # likewise (where the device maps pinned arrays: `_mapped`)
        self.graph_captures = 0
        self.graph_replays = 0
        self._check_model()
        self._setup()
        #: the table's raced settings this executor took (setting -> value); what the caller or env set is not here
        self.measured_settings = model_dispatch.model_settings(self.dispatch, self.cfg, self.fmt, pdl)
        for name, value in self.measured_settings.items():
            setattr(self, name, value)

    def _check_model(self) -> None:
        cfg = self.cfg
        for dim, what in ((cfg.hidden_size, "hidden_size"), (cfg.ffn_dim, "ffn size"),
                          (cfg.num_attention_heads * cfg.head_dim, "heads * head_dim")):
            if dim % 64:
                raise ConfigError(f"{what} {dim} is not a multiple of 64, which the CUDA matmuls need (NF4 blocks of "
                                  "64 along each row)", "use the CPU executor for this model")
        if cfg.head_dim % 16 or not 16 <= cfg.head_dim <= 256:
            raise ConfigError(f"head_dim {cfg.head_dim} must be a multiple of 16 in 16..256 (the attention kernels)",
                              "use the CPU executor for this model")
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ConfigError(f"{cfg.num_attention_heads} query heads do not share {cfg.num_key_value_heads} K/V "
                              "heads evenly", "use the CPU executor for this model")

    # -- setup -----------------------------------------------------------------------------------------------------
    def _setup(self) -> None:
        from tilewise.devices import get_device

        if self._given_device is not None and not getattr(self._given_device, "_lost", False):
            dev = self._given_device
        else:
            dev = get_device(self._device_name or "cuda")
            if dev.info.backend != "cuda":
                raise ConfigError(f"device {dev.info.name} is not a CUDA device", "pass device='cuda'")
        why = cuda_executor_problem(dev.info)
        if why is not None:
            raise DeviceUnavailable(why, "use --device webgpu (or device='webgpu') on this GPU")
        self.dev = dev
        # a table's configs pass their kernels' rules before any is compiled (model/dispatch.py)
        check = (dev.info.limits, (), self.cfg.norm_eps, "cuda")
        self.dispatch = (checked_table(self._given_dispatch, *check) if self._given_dispatch is not None
                         else load_model_table(dev.info.fingerprint, None, self.quiet, *check))
        self.generation += 1
        self._programs: dict[Any, Program] = {}
        self._templates: dict[str, KernelTemplate] = {}
        self._pool: dict[int, list[tuple[Any, Any]]] = {}  # capacity -> free (kv, conv) buffers
        self._rows = 0
        self._scratch: dict[str, Buffer] = {}
        self._rope_positions = 0
        self._plans: dict[tuple[Any, ...], Plan] = {}
        self._upload_weights()
        self._lost = False

    def _upload(self, arr: np.ndarray) -> Buffer:
        return self.dev.upload(np.ascontiguousarray(arr))

    def _matrix(self, names: Sequence[str], by_step: bool = True) -> dict[str, Buffer]:
        """One matrix (rows of several stored matrices stacked) as {"w": ..., "absmax": ...} (absmax for nf4), and
        with `by_step` (a matmul's weights) on a GPU that runs the wgr kind (Hopper) nf4's absmax stored (K / 64, N)
        too, as "absmax_t" (what wgr reads; 1/8 more weight memory, so only where it can run)."""
        tensors = [self.checkpoint.get(n) for n in names]
        packs = [weight_arrays(t, self.fmt) for t in tensors]
        out = {"w": self._upload(np.concatenate([p["w"].reshape(-1) for p in packs]))}
        if self.fmt == "nf4":
            absmax = np.concatenate([p["absmax"] for p in packs])
            out["absmax"] = self._upload(absmax)
            if by_step and self.dev.info.limits.compute_capability == mm.WG_COMPUTE_CAPABILITY:
                out["absmax_t"] = self._upload(mm.absmax_by_step(absmax, sum(stored_shape(t)[0] for t in tensors)))
        return out

    def _upload_weights(self) -> None:
        gpu_state.upload_model(self, lambda name, arr: self._upload(arr), self._matrix)
        for lay in self.layers:  # gate and up are one launch: w1's rows and absmax, up's as w_up / absmax_up*
            up = lay.pop("w3")
            lay["w13"] = {**lay.pop("w1"), "w_up": up["w"],
                          **{f"absmax_up{k[6:]}": up[k] for k in ("absmax", "absmax_t") if k in up}}

    # -- buffers -----------------------------------------------------------------------------------------------------
    def _ensure_rows(self, n: int) -> None:
        if n <= self._rows:
            return
        cfg = self.cfg
        H, F = cfg.hidden_size, cfg.ffn_dim
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        rows = max(MIN_ROW_CAPACITY, 1 << (n - 1).bit_length())
        wide = max(3 * H, (hq + 2 * hkv) * d, F)
        alloc = self.dev.allocate
        self.act = {"x": alloc(4 * rows * H), "big": alloc(4 * rows * wide), "y": alloc(4 * rows * max(H, hq * d)),
                    "q": alloc(4 * rows * hq * d), "ids": alloc(4 * rows), **gpu_state.tail_buffers(cfg, alloc),
                    "res": alloc(4 * (H + cfg.num_labels))}
        # the token ids in and the result row out pass through these; a graph copies from/to their addresses
        self._ids_host = self._host_array(rows, np.int32)
        self._res_host = self._host_array(H + cfg.num_labels, np.float32)
        # `zero_copy`: the same two arrays as buffers, the embedding reading the ids and the head writing the row
        # across the bus, so a graph has no copy steps; None where the device cannot map them
        self._mapped = None
        if hasattr(self.dev, "pinned") and hasattr(self.dev, "mapped"):
            with contextlib.suppress(LaunchError):  # not mapped: decisions copy, as with zero_copy off
                self._mapped = {"ids": self.dev.mapped(self._ids_host), "res": self.dev.mapped(self._res_host)}
        self._rows = rows
        self._scratch = {}  # split-K's partial sums, the f16 x rows: sized for this row capacity at their first use
        self._plans.clear()  # plans bind the old buffers

    def _host_array(self, size: int, dtype: Any) -> np.ndarray:
        pinned = getattr(self.dev, "pinned", None)
        return pinned(size, dtype) if pinned is not None else np.empty(size, dtype)

    def _ensure_rope(self, positions: int) -> None:
        if positions <= self._rope_positions:
            return
        cap = cache_capacity(positions, self.cfg.max_position_embeddings)
        cos, sin = rope_table(cap, self.cfg.head_dim, self.cfg.rope_theta)
        self.rope = (self._upload(cos), self._upload(sin))
        self._rope_positions = cap
        self._plans.clear()

    # -- kernels -------------------------------------------------------------------------------------------------------
    def _template(self, name: str) -> KernelTemplate:
        tpl = self._templates.get(name)
        if tpl is None:
            eps = self.cfg.norm_eps
            makers: dict[str, Any] = {"attention": attn_k.CudaAttention, "shortconv": CudaShortConv,
                                      "rope": lambda: attn_k.CudaQKNormRope(self.cfg.rope_theta, eps),
                                      "head": lambda: rowops.CudaHead(eps), "embed": lambda: rowops.CudaEmbed(self.fmt)}
            tpl = makers[name]() if name in makers else mm.CudaMatmul.from_name(name, eps)
            self._templates[name] = tpl
        return tpl

    def program(self, tpl: KernelTemplate, config: Config, shape: tuple[int, ...]) -> Program:
        """The compiled program of a template's config (once per program key)."""
        key = ("tpl", tpl.name, tpl.program_key(config, shape))
        prog = self._programs.get(key)
        if prog is None:
            prog = tpl.compile(self.dev, config, shape)
            self._programs[key] = prog
        return prog

    def matmul_choice(self, epilogue: str, n: int, k: int, rows: int, norm: bool) -> tuple[mm.CudaMatmul, Config]:
        """The matmul kernel and config for `rows` rows of an N x K matmul: the dispatch table's, else the
        defaults."""
        picked = self.dispatch.pick(matmul_key(self.fmt, epilogue, n, k, norm), rows)
        if picked is not None:  # checked at load for exactly this N, K
            tpl = self._template(picked[0])
            assert isinstance(tpl, mm.CudaMatmul)
            return tpl, tpl.config_of(picked[1])
        kind = "rows" if rows < mm.MMA_FROM_ROWS else "mma"
        tpl = self._template(f"{self.fmt}_matmul.{kind}.{epilogue}" + (".norm" if norm else ""))
        assert isinstance(tpl, mm.CudaMatmul)
        return tpl, tpl.default_config()

    def attention_choice(self, rows: int) -> Config:
        """The attention config at `rows` query rows: the dispatch table's, else the default."""
        cfg = self.cfg
        picked = self.dispatch.pick(attention_key(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim),
                                    rows)
        if picked is not None:
            return self._template("attention").config_of(picked[1])
        return self._template("attention").config_of(attn_k.default_attention(self.dev.info.limits,
                                                                              attention_shape(cfg, rows)))

    def _matmul(self, plan: Plan, label: str, epilogue: str, x: Buffer, x_row0: int, rows: int,
                weights: dict[str, Buffer], out: Buffer, n: int, k: int, norm: Buffer | None = None) -> None:
        tpl, cfg = self.matmul_choice(epilogue, n, k, rows, norm is not None)
        shape = (rows, n, k)
        if self.serial_reduce:
            cfg = summed_config(tpl, cfg, self.dev.info.limits, shape, lambda c: self.program(tpl, c, shape))
        bufs = {"x": x, "out": out, **weights, **({"norm_w": norm} if norm is not None else {})}
        for name, nbytes in tpl.scratch_bytes(cfg, self._rows, n, k).items():  # split-K's sums, ring's f16 x
            # the f16 rows alternate between two buffers, so that a launch fused with the next prologue
            # (`fuse_prep`) never writes the rows it reads
            key = name + "2" * (self._xh_turn % 2) if name == "xh" else name
            bufs[name] = self._scratch_buffer(key, nbytes, zero=name in tpl.zeroed_scratch)
        self._xh_turn += tpl.preps()
        launches = tpl.launches_at(self.program(tpl, cfg, shape), bufs, cfg, shape, x_row0)
        if self.fold_norm and plan.launches and tpl.kind == "wgr" and norm is not None:
            # the residual launch before writes x; ss: each row's sums of squares per 64 columns
            ss = self._scratch_buffer("ss", 4 * self._rows * (k // 64))
            folded = fold_norm(plan.launches[-1], launches[0], launches[1], ss)
            if folded is not None:
                plan.launches[-1] = folded[0]
                launches = [folded[1], *launches[2:]]
        if self.fuse_preps and plan.launches and tpl.preps():
            # the launch before writes these rows; every matmul's input here has this matmul as its only reader
            fused = fuse_prep(self.dev, plan.launches[-1], launches[0], self._programs)
            if fused is not None:
                plan.launches[-1] = fused
                launches = launches[1:]
        plan.add(label, launches)

    def _scratch_buffer(self, name: str, nbytes: int, zero: bool = False) -> Buffer:
        """One buffer per scratch name shared by every matmul (they run one after another), grown to the largest use
        at the row capacity (a plan bound to a smaller one keeps it)."""
        buf = self._scratch.get(name)
        if buf is None or buf.nbytes < nbytes:
            # zero: counters the kernels leave at 0 (wgr's tiles); the others are written before they are read
            buf = self._scratch[name] = zeroed(self.dev, nbytes) if zero else self.dev.allocate(nbytes)
        return buf

    def _fixed_program(self, name: str, make: Callable[[Any], Program]) -> Program:
        """A program with no config (the copy kernels), compiled once."""
        prog = self._programs.get((name,))
        if prog is None:
            prog = self._programs[(name,)] = make(self.dev)
        return prog

    def _copy(self, plan: Plan, label: str, src: Buffer, src_word: int, dst: Buffer, dst_word: int,
              words: int) -> None:
        prog = self._fixed_program("copy", rowops.copy_program)
        plan.add(label, [rowops.copy_launch(prog, src, src_word, dst, dst_word, words)])

    # -- forward -------------------------------------------------------------------------------------------------------
    def plan(self, ids: np.ndarray, start: int, caches: GPUCaches | None,
             final_row_slicing: bool) -> tuple[Plan, GPUCaches]:
        """Stage the token ids (host side) and build (or reuse) the launches of one decision (nothing runs yet)."""
        n = int(ids.size)
        new = begin_decision(self, n, start, caches, "CUDA")
        self._ids_host[:n] = ids
        zero_copy = self.zero_copy and self._mapped is not None
        key = (n, start, final_row_slicing, self.fuse_preps, self.serial_reduce, self.fold_norm, self.fuse_rope,
               zero_copy, None if caches is None else (id(caches.kv), id(caches.conv)), id(new.kv), id(new.conv))
        cached = self._plans.get(key)
        if cached is None:
            cached = self._build_plan(n, start, caches, new, final_row_slicing, zero_copy)
            cached.tokens = n
            keep_plan(self._plans, key, cached)
        return cached, new

    def _build_plan(self, n: int, start: int, caches: GPUCaches | None, new: GPUCaches,
                    final_row_slicing: bool, zero_copy: bool = False) -> Plan:
        cfg = self.cfg
        H, hkv, d = cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim
        a = self.act
        io = self._mapped if zero_copy else a  # where the ids come from and the result row goes
        plan = Plan()
        plan.zero_copy = zero_copy
        self._xh_turn = 0  # which of the two f16 x buffers the next prepping matmul takes (`_matmul`)
        if caches is not None and start > 0:  # every layer's K and V prefix rows, eight buffers a launch
            prog = self._fixed_program("copy_pairs", rowops.copy_pairs_program)
            pairs = [(old, nw) for i, olds in caches.kv.items() for old, nw in zip(olds, new.kv[i])]
            plan.add("copy.kv_prefix", rowops.copy_pairs_launches(prog, pairs, start * hkv * d))
        embed = self._template("embed")
        ecfg = embed.config_of({"NT": ROW_NT})
        eshape = (n, H, cfg.vocab_size)
        plan.add("embed", embed.launches(self.program(embed, ecfg, eshape), {"ids": io["ids"], **self.embed,
                                                                              "out": a["x"]}, ecfg, eshape))
        res, res_rows = gpu_state.plan_blocks(self, plan, n, start, caches, new, final_row_slicing)
        head = self._template("head")
        assert isinstance(head, rowops.CudaHead)
        hcfg = head.config_of({"NT": HEAD_NT})
        hshape = (res_rows, H, cfg.num_labels)
        plan.add("head", head.launches_row(self.program(head, hcfg, hshape), {
            "x": res, "norm_weight": self.final_norm, "head_weight": self.head, "out": io["res"]}, hshape,
            res_rows - 1))
        return plan

    def _mix_conv(self, plan: Plan, lay: dict[str, Any], rows: int, state_in: Buffer, state_out: Buffer) -> None:
        conv, a, cfg = self._template("shortconv"), self.act, self.cfg
        cshape, ccfg = (rows, cfg.hidden_size, cfg.conv_L_cache), conv_choice(self.dispatch, conv, cfg, rows)
        plan.add("conv", conv.launches(self.program(conv, ccfg, cshape), {
            "bcx": a["big"], "state_in": state_in, "weight": lay["taps"], "out": a["y"], "state_out": state_out},
            ccfg, cshape))

    def _mix_attention(self, plan: Plan, lay: dict[str, Any], n: int, start: int, queries: int, k_c: Buffer,
                       v_c: Buffer) -> None:
        cfg, a = self.cfg, self.act
        attn, rope = self._template("attention"), self._template("rope")
        assert isinstance(attn, attn_k.CudaAttention) and isinstance(rope, attn_k.CudaQKNormRope)
        rshape = (n, start, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        rl = rope.launches_into(self.program(rope, rope.config_of({"NT": 0}), rshape), {
            "qkv": a["big"], "q_norm": lay["q_norm"], "k_norm": lay["k_norm"], "cos": self.rope[0],
            "sin": self.rope[1], "q": a["q"]}, rshape, k_c, v_c)
        # the qkv launch writes q and the cache rows itself; its RopeOut record lives with the plan
        fused = fuse_rope(self.dev, plan.launches[-1], rl[0]) if self.fuse_rope else None
        if fused is not None:
            plan.launches[-1] = fused[0]
            plan.keep.append(fused[1])
        else:
            plan.add("attn.qknorm_rope", rl)
        ashape = (queries, *rshape[1:])  # queries of the output rows only, with their own tile
        acfg = self.attention_choice(queries)
        plan.add("attention", attn.launches_at(self.program(attn, acfg, ashape), {
            "q": a["q"], "k_cache": k_c, "v_cache": v_c, "out": a["y"]}, ashape, n - queries))

    def run_plan(self, plan: Plan, timed: bool) -> np.ndarray:
        """Run a decision and read its result row (the normed last row, then the scores): untimed, one replay of the
        plan's CUDA graph (captured on its first run); timed or with graphs off, launch by launch."""
        n_res = self.cfg.hidden_size + self.cfg.num_labels
        graph = None if timed else self._graph(plan)
        if graph is not None:
            graph.launch()  # returns once the GPU is done, so the staging arrays are free for the next decision
            self.graph_replays += 1
            return self._res_host[:n_res].copy()
        if not plan.zero_copy:  # (zero_copy: the embedding reads the staged ids where they are)
            # a pageable copy: the write is consumed before it returns, while a copy from pinned memory would still
            # be pending when the staging array is next written
            self.dev.write(self.act["ids"], self._ids_host[:plan.tokens].copy())
        if timed:  # each launch alone between its events: no PDL
            ms = self.dev.time(plan.launches, flush_l2=False)
            self.last_op_times = list(zip(plan.labels, (float(t) for t in ms)))
        else:
            self.dev.run(plan.launches, pdl=self.pdl)  # type: ignore[call-arg]
        if plan.zero_copy:
            self.dev.synchronize()  # the head's row is in the pinned array once the stream is done
            return self._res_host[:n_res].copy()
        return self.dev.download(self.act["res"], np.float32, (n_res,))

    def _graph(self, plan: Plan) -> Any:
        """The plan's graph, captured now if it has none for the current PDL setting; None where it runs launch by
        launch."""
        if plan.graph and plan.graph_pdl != self.pdl:
            plan.graph = None  # captured with the other setting
        if plan.graph is None and self.graphs and hasattr(self.dev, "capture"):
            if any(launch.program.meta.get("callable") for launch in plan.launches):
                plan.graph = False  # a library call is not captured (devices/cuda.py says why)
            else:
                # The ids are copied by the graph itself from the pinned staging array (not by an async copy before
                # the replay): one submission per decision, and the copy reads whatever the array holds at replay
                # time. Its size is fixed at capture, which fits: the token count is part of the plan's key. With
                # zero_copy the plan's kernels read and write the pinned arrays themselves.
                a, n_res = self.act, self.cfg.hidden_size + self.cfg.num_labels
                steps = list(plan.launches) if plan.zero_copy else [
                    HostCopy(self._ids_host, a["ids"], 4 * plan.tokens), *plan.launches,
                    HostCopy(self._res_host, a["res"], 4 * n_res, to_device=False)]
                try:
                    plan.graph = self.dev.capture(steps, pdl=self.pdl)  # type: ignore[call-arg]
                except LaunchError as exc:
                    if not self.pdl or isinstance(exc, DeviceLost):
                        raise
                    # a driver that refuses programmatic launches in a capture: decide without them, and say so
                    warnings.warn(f"{exc.problem}; this executor launches without programmatic dependent launch "
                                  f"from now on ({PDL_ENV}=0 does so from the start)", stacklevel=2)
                    self.pdl = False
                    plan.graph = self.dev.capture(steps, pdl=False)  # type: ignore[call-arg]
                plan.graph_pdl = self.pdl
                self.graph_captures += 1
        return plan.graph if self.graphs and plan.graph else None

    def forward(self, ids: np.ndarray, start: int, caches: GPUCaches | None, final_row_slicing: bool,
                timed: bool = False) -> tuple[np.ndarray, GPUCaches]:
        """Run new tokens after `caches` (None at the start); `caches` is not modified.

        Args:
            ids: (n,) token ids.
            start: position of the first one.
            caches: the previous state's caches.
            final_row_slicing: compute only the last row in the last block.
            timed: time every launch with CUDA events into `last_op_times` (launch by launch, no graph).

        Returns:
            ((hidden,) float32 final-normed last hidden state, new caches).
        """
        try:
            if self._lost:
                self._setup()
            plan, new = self.plan(np.asarray(ids), start, caches, final_row_slicing)
            res = self.run_plan(plan, timed)
        except DeviceLost as exc:
            self._lost = True
            raise DeviceLost(f"{exc.problem} (during a decision)",
                             "restart the process: a CUDA context is unusable after a kernel fault; states made "
                             "before must be prefilled again") from exc
        return self.split_result(res, new)
