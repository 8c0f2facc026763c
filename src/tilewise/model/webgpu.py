"""The WebGPU executor of the LFM2 classifier: the same `forward` contract as the CPU executor, on WGSL kernels.

What a decision costs on the GPU side:
- weights are uploaded once (nf4 / f16 / f32, the checkpoint's format; norms, conv taps and head in f32);
  q/k/v rows and nothing else are concatenated (one projection launch per attention block);
- activation buffers are allocated for a row capacity (a power of two) and reused; pipelines and the small
  uniform `dims` buffers are cached by their contents, so a decision writes only its token ids;
- one compute pass per command buffer and no waiting between them: the decision's launches go to the GPU in
  growing submissions (16 launches, then 32, 64, ...: the GPU starts while Python encodes the rest; the
  device's `submit_first_launches`), the read-back included: the copy of the result row (the normed last row
  and the 8 scores share a buffer) into a kept mappable buffer is encoded after the last pass
  (`Device.run_and_download`), then mapped once; decision plans are reused per shape (see `plan`);
- each block's two RMSNorms are fused into the matmuls that read them (in_proj / qkv, gate/up): the weights
  are scaled by the norm weight as they are decoded and the row's rsqrt(mean(x^2)) multiplies the epilogue;
- matmuls pick a kernel per row count from the dispatch table (`tilewise tune model`), or the defaults:
  the short-row kernel below 96 rows, the tiled kernel from 96 (seed 001's measured cutoff); every tuned op
  (and the embedding, short conv and head) launches through its kernel object, the one the tuner measured;
- final-row slicing (`runtime.block_rows`): after the last attention block only the rows the last row reaches back
  to go through the mixers' output projections and the FFNs (the last block one row; a conv block runs its in_proj
  on its output rows and the conv_L_cache - 1 rows before them), their residual rows copied to buffers of their own;
  an attention block still writes every row's K/V, since later tokens need them;
- prefix cache: `forward` never writes its input caches. A new state gets its own cache buffers (from a
  pool): the K/V rows of the prefix are copied on the GPU by a copy kernel in the same pass, the conv kernel
  reads the old conv state and writes the new one to another buffer.

Device loss mid-decision raises `DeviceLost`; the next `forward` rebuilds the device, weights and pipelines
(states made before the loss cannot be continued: they name the lost generation and say so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tilewise.devices.base import Buffer, Device, Launch, Program
from tilewise.errors import ConfigError, DeviceLost
from tilewise.kernels.attention import sgmat as attn_sg
from tilewise.kernels.attention import webgpu as attn_k
from tilewise.kernels.attention.problem import rope_table
from tilewise.kernels.base import KernelTemplate
from tilewise.kernels.matmul import webgpu as mm
from tilewise.kernels.rowops import webgpu as rowops
from tilewise.kernels.shortconv import webgpu as conv_k
from tilewise.kernels.space import Config
from tilewise.model import gpu_state
from tilewise.model.checkpoint import Checkpoint
from tilewise.model.dispatch import (
    attention_key,
    checked_table,
    conv_choice,
    default_matmul,
    load_model_table,
    matmul_key,
    matmul_name,
)
from tilewise.model.gpu_state import GPUCaches, GPUResult, Plan, begin_decision, cache_capacity, keep_plan
from tilewise.quant.nf4 import weight_arrays
from tilewise.tune.dispatch import DispatchTable

ROW_WG = 128  # rmsnorm / embed threads per workgroup
HEAD_WG = 64
MIN_ROW_CAPACITY = 64


class WebGPUExecutor(GPUResult):
    """Runs the classifier's forward pass on a WebGPU device (see the module docstring)."""

    device_name = "webgpu"

    def __init__(self, checkpoint: Checkpoint, device: Device | str | None = None,
                 dispatch: DispatchTable | None = None, quiet: bool = False) -> None:
        self.checkpoint = checkpoint
        self.cfg = checkpoint.config
        self.fmt = checkpoint.weights
        if self.fmt not in mm.FORMATS:
            raise ConfigError(f"the WebGPU executor runs nf4, f16 or f32 weights, not {self.fmt!r}",
                              "load with weights='nf4' (or f16 / f32)")
        self._given_device = device if not isinstance(device, str) and device is not None else None
        # a lost device is rebuilt by name: the same adapter index as the one given
        self._device_name = (device if isinstance(device, str) or device is None
                             else f"webgpu:{device.info.index}")
        self._given_dispatch = dispatch
        self.quiet = quiet
        self.generation = 0
        self._lost = False
        self.last_op_times: list[tuple[str, float]] = []
        self._setup()

    # -- setup ---------------------------------------------------------------------------------------------------
    def _setup(self) -> None:
        from tilewise.devices import get_device

        if self._given_device is not None and not getattr(self._given_device, "_lost", False):
            dev = self._given_device
        else:
            dev = get_device(self._device_name or "webgpu")
            if dev.info.backend != "webgpu":
                raise ConfigError(f"device {dev.info.name} is not a WebGPU device", "pass device='webgpu'")
        self.dev = dev
        self.generation += 1
        # configs from a table pass their kernels' rules before any is compiled (see model/dispatch.py)
        check = (dev.info.limits, dev.enabled_features, self.cfg.norm_eps)
        self.dispatch = (checked_table(self._given_dispatch, *check) if self._given_dispatch is not None
                         else load_model_table(dev.info.fingerprint, None, self.quiet, *check))
        self._programs: dict[Any, Program] = {}
        self._templates: dict[str, KernelTemplate] = {}
        self._dims_cache: dict[tuple[int, ...], Buffer] = {}
        self._keep: list[Any] = []  # buffers replaced by larger ones stay referenced (bind groups key on ids)
        self._pool: dict[int, list[tuple[Any, Any]]] = {}  # capacity -> free (kv, conv) buffers
        self._rows = 0
        self._rope_positions = 0
        self._scratch_buf: Buffer | None = None
        # decision plans by everything their launches depend on besides the token ids (which live in a buffer):
        # a repeated decision shape (same length, same cached base, same pooled caches) reuses its launch list,
        # and with it the device's per-launch bind groups, instead of rebuilding ~120 launches in Python
        self._plans: dict[tuple[Any, ...], Plan] = {}
        self._upload_weights()
        self._lost = False

    def _check_fits(self, name: str, nbytes: int) -> None:
        lim = self.dev.info.limits
        cap = min(lim.max_storage_binding_bytes, lim.max_buffer_bytes)
        if nbytes > cap:
            which = ("max_storage_binding_bytes" if lim.max_storage_binding_bytes <= lim.max_buffer_bytes
                     else "max_buffer_bytes")
            raise ConfigError(f"tensor {name} needs {nbytes} bytes in one buffer binding, more than this adapter's "
                              f"{which} {cap}", "use weights='nf4' (smaller), a smaller model, or an adapter with "
                              "larger limits")

    def _upload(self, name: str, arr: np.ndarray) -> Buffer:
        self._check_fits(name, arr.nbytes)
        return self.dev.upload(np.ascontiguousarray(arr))

    def _matrix(self, names: Sequence[str]) -> list[Buffer]:
        """Upload one matrix (rows of several stored matrices stacked) as [w] or [w, absmax]."""
        packs = [weight_arrays(self.checkpoint.get(n), self.fmt) for n in names]
        label = "+".join(names)
        out = [self._upload(label, np.concatenate([p["w"].reshape(-1) for p in packs]))]
        if self.fmt == "nf4":
            out.append(self._upload(label + ".absmax", np.concatenate([p["absmax"] for p in packs])))
        return out

    def _upload_weights(self) -> None:
        cfg = self.cfg
        H = cfg.hidden_size
        for dim, what in ((H, "hidden_size"), (cfg.ffn_dim, "ffn size"), (cfg.num_attention_heads * cfg.head_dim,
                                                                         "heads * head_dim")):
            if dim % 64:
                raise ConfigError(f"{what} {dim} is not a multiple of 64, which the WebGPU matmuls need (NF4 blocks "
                                  "of 64 along each row)", "use the CPU executor for this model")
        # q/k norm + RoPE reads vec4s of both halves of a head (`attn_k.rope_threads`)
        if cfg.head_dim % 8 or cfg.head_dim > self.dev.info.limits.max_invocations_per_workgroup:
            raise ConfigError(f"head_dim {cfg.head_dim} must be a multiple of 8 and at most "
                              f"{self.dev.info.limits.max_invocations_per_workgroup}", "use the CPU executor")
        gpu_state.upload_model(self, self._upload, lambda names, is_matmul: self._matrix(names))
        for lay in self.layers:  # gate/up is one launch binding w1's buffers, then w3's
            lay["w13"] = [*lay.pop("w1"), *lay.pop("w3")]

    # -- buffers ---------------------------------------------------------------------------------------------------
    def _dims(self, *values: int) -> Buffer:
        key = tuple(int(v) for v in values) + (0,) * (4 - len(values))
        buf = self._dims_cache.get(key)
        if buf is None:
            buf = self.dev.upload(np.array(key, np.uint32), uniform=True)
            self._dims_cache[key] = buf
        return buf

    def _ensure_rows(self, n: int) -> None:
        if n <= self._rows:
            return
        cfg = self.cfg
        H, F = cfg.hidden_size, cfg.ffn_dim
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        rows = max(MIN_ROW_CAPACITY, 1 << (n - 1).bit_length())
        wide = max(3 * H, (hq + 2 * hkv) * d, F)
        alloc = self.dev.allocate
        for name, nbytes in (("x", rows * H), ("big", rows * wide), ("y", rows * max(H, hq * d)),
                             ("q", rows * hq * d), ("ids", rows)):
            self._check_fits(f"activation {name}", 4 * nbytes)
        if self._rows:
            self._keep.append(self.act)
        self.act = {"x": alloc(4 * rows * H), "big": alloc(4 * rows * wide),
                    "y": alloc(4 * rows * max(H, hq * d)), "q": alloc(4 * rows * hq * d), "ids": alloc(4 * rows),
                    **gpu_state.tail_buffers(cfg, alloc), "res": alloc(4 * (H + cfg.num_labels))}
        self._rows = rows

    def _ensure_rope(self, positions: int) -> None:
        if positions <= self._rope_positions:
            return
        cap = cache_capacity(positions, self.cfg.max_position_embeddings)
        cos, sin = rope_table(cap, self.cfg.head_dim, self.cfg.rope_theta)
        if self._rope_positions:
            self._keep.append(self.rope)
        self.rope = (self._upload("rope cos table", cos), self._upload("rope sin table", sin))
        self._rope_positions = cap

    # -- programs ----------------------------------------------------------------------------------------------------
    def _program(self, key: tuple[Any, ...], make_source: Any, name: str) -> Program:
        """A program of an op without a kernel template (data movement, q/k norm + RoPE)."""
        prog = self._programs.get(key)
        if prog is None:
            prog = self.dev.compile(make_source(), "main", name=name)
            self._programs[key] = prog
        return prog

    def _template(self, name: str) -> KernelTemplate:
        """The kernel object a dispatch choice names: the same class the tuner measured, built for this device."""
        tpl = self._templates.get(name)
        if tpl is None:
            if name == "attention":
                tpl = attn_k.AttentionTemplate()
            elif name == "attention.sgmat":
                tpl = attn_sg.SgmatAttention(self.dev.enabled_features)
            elif name == "shortconv":
                tpl = conv_k.ConvTemplate()
            elif name == "head":
                tpl = rowops.HeadTemplate(self.cfg.norm_eps)
            elif name.startswith("embed."):
                tpl = rowops.EmbedTemplate(name.split(".", 1)[1])
            else:
                tpl = mm.MatmulTemplate.from_name(name, self.dev.enabled_features, self.cfg.norm_eps)
            self._templates[name] = tpl
        return tpl

    def launches(self, tpl: KernelTemplate, config: Config, shape: tuple[int, ...], bufs: dict[str, Buffer],
                 ) -> list[Launch]:
        """One op's launches through its kernel object (compiled once per program key): the path the tuner's
        measurements went through, so a tuned config runs exactly as it was measured."""
        key = ("tpl", tpl.name, tpl.program_key(config, shape))
        prog = self._programs.get(key)
        if prog is None:
            prog = tpl.compile(self.dev, config, shape)
            self._programs[key] = prog
        return tpl.launches(prog, bufs, config, shape)

    def matmul_choice(self, epilogue: str, n: int, k: int, rows: int, norm: bool) -> tuple[KernelTemplate, Config]:
        """The matmul kernel and config for `rows` rows: the dispatch table's, else the defaults."""
        picked = self.dispatch.pick(matmul_key(self.fmt, epilogue, n, k, norm), rows)
        if picked is not None:  # checked at load (model/dispatch.py `range_choice`) for exactly this N, K
            tpl = self._template(picked[0])
            return tpl, tpl.config_of(picked[1])
        kind, values = default_matmul(rows)
        tpl = self._template(matmul_name(kind, self.fmt, epilogue, norm))
        return tpl, tpl.config_of(values)

    def _matmul(self, plan: Plan, label: str, epilogue: str, x: Buffer, x_row0: int, rows: int,
                weights: list[Buffer], out: Buffer, n: int, k: int, norm: Buffer | None = None) -> None:
        """One matmul (two launches for split-K); `norm` fuses the RMSNorm of x with these weights into it."""
        tpl, cfg = self.matmul_choice(epilogue, n, k, rows, norm is not None)
        assert isinstance(tpl, mm.MatmulTemplate)
        names = [b for b in tpl.binding_names() if b not in ("dims", "x", "norm_w", "out")]
        bufs = {"dims": self._dims(rows, x_row0), "x": x, "out": out, **dict(zip(names, weights))}
        if norm is not None:
            bufs["norm_w"] = norm
        scratch = tpl.scratch_bytes(cfg, rows, n)
        if scratch:  # split-K: partial sums into a scratch buffer, then one launch adds them with the epilogue
            bufs["part"] = self._scratch(scratch)
        for launch in self.launches(tpl, cfg, (rows, n, k), bufs):
            plan.add(label, launch)

    def _scratch(self, nbytes: int) -> Buffer:
        """One partial-sum buffer shared by every split-K launch (they run one after another)."""
        if self._scratch_buf is None or self._scratch_buf.nbytes < nbytes:
            self._check_fits("split-K scratch", nbytes)
            if self._scratch_buf is not None:
                self._keep.append(self._scratch_buf)
            self._scratch_buf = self.dev.allocate(max(nbytes, 1 << 20))
        return self._scratch_buf

    def _copy(self, plan: Plan, label: str, src: Buffer, src_word: int, dst: Buffer, dst_word: int,
              words: int) -> None:
        prog = self._program(("copy",), rowops.copy_source, "copy")
        plan.add(label, Launch(prog, rowops.copy_grid(words), [self._dims(words, src_word, dst_word), src, dst]))

    # -- forward -------------------------------------------------------------------------------------------------------
    def plan(self, ids: np.ndarray, start: int, caches: GPUCaches | None,
             final_row_slicing: bool) -> tuple[Plan, GPUCaches]:
        """Write the token ids and build (or reuse) the launches of one decision (nothing runs yet)."""
        n = int(ids.size)
        new = begin_decision(self, n, start, caches, "WebGPU", self._check_fits)
        a = self.act
        self.dev.write(a["ids"], ids.astype(np.uint32))
        # pooled caches come back with the same buffer dicts, so their ids identify the buffers the launches bind
        key = (n, start, final_row_slicing, None if caches is None else (id(caches.kv), id(caches.conv)),
               id(new.kv), id(new.conv), self._rows, self._rope_positions)
        cached = self._plans.get(key)
        if cached is not None:
            return cached, new
        programs = dict(self._programs)
        try:  # the plan's new pipelines build together (on Dawn's threads) and are all ready when the block ends
            with self.dev.compile_together() as batch:
                plan = self._build_plan(n, start, caches, new, final_row_slicing)
            if batch is not None and batch.errors:
                raise next(iter(batch.errors.values()))
        except BaseException:
            self._programs = programs  # none of a failed plan's programs is kept (one may have no pipeline)
            raise
        return keep_plan(self._plans, key, plan), new

    def _build_plan(self, n: int, start: int, caches: GPUCaches | None, new: GPUCaches,
                    final_row_slicing: bool) -> Plan:
        """The launches of one decision of `n` new tokens after `caches`, writing `new` (see `plan`)."""
        cfg = self.cfg
        H, hkv, d = cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim
        a = self.act
        plan = Plan()
        if caches is not None and start > 0:
            words = start * hkv * d
            prog = self._program(("copy2",), rowops.copy2_source, "copy2")
            for i, (k_old, v_old) in caches.kv.items():
                k_new, v_new = new.kv[i]
                plan.add("copy.kv_prefix", Launch(prog, rowops.copy_grid(words),
                                                  [self._dims(words, 0, 0), k_old, v_old, k_new, v_new]))
        embed = self._template(f"embed.{self.fmt}")
        table = dict(zip(("w", "absmax"), self.embed))
        for launch in self.launches(embed, embed.config_of({"WG": ROW_WG}), (n, H, cfg.vocab_size),
                                    {"dims": self._dims(n), "ids": a["ids"], **table, "out": a["x"]}):
            plan.add("embed", launch)
        res, res_rows = gpu_state.plan_blocks(self, plan, n, start, caches, new, final_row_slicing)
        head = self._template("head")
        for launch in self.launches(head, head.config_of({"WG": HEAD_WG}), (res_rows, H, cfg.num_labels), {
                "dims": self._dims(1, res_rows - 1), "x": res, "norm_weight": self.final_norm,
                "head_weight": self.head, "out": a["res"]}):
            plan.add("head", launch)
        return plan

    def _mix_conv(self, plan: Plan, lay: dict[str, Any], rows: int, state_in: Buffer, state_out: Buffer) -> None:
        conv, a, cfg = self._template("shortconv"), self.act, self.cfg
        shape = (rows, cfg.hidden_size, cfg.conv_L_cache)
        for launch in self.launches(conv, conv_choice(self.dispatch, conv, cfg, rows), shape, {
                "dims": self._dims(rows), "bcx": a["big"], "state_in": state_in, "weight": lay["taps"],
                "out": a["y"], "state_out": state_out}):
            plan.add("conv", launch)

    def _mix_attention(self, plan: Plan, lay: dict[str, Any], n: int, start: int, queries: int, k_c: Buffer,
                       v_c: Buffer) -> None:
        cfg, a = self.cfg, self.act
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        prog = self._program(("rope", hq, hkv, d), lambda: attn_k.qknorm_rope_source(hq, hkv, d, cfg.norm_eps),
                             "qknorm_rope")
        plan.add("attn.qknorm_rope", Launch(prog, attn_k.qknorm_rope_grid(n, hq, hkv, d), [
            self._dims(n, start), a["big"], lay["q_norm"], lay["k_norm"], self.rope[0], self.rope[1], a["q"],
            k_c, v_c]))
        picked = self.dispatch.pick(attention_key(hq, hkv, d), queries)  # the output rows' queries, their own tile
        attn = self._template(picked[0] if picked is not None else "attention")
        attn_cfg = attn.config_of(picked[1] if picked is not None else attn_k.DEFAULT_ATTN)
        for launch in self.launches(attn, attn_cfg, (queries, start, hq, hkv, d), {
                "dims": self._dims(queries, start, n - queries), "q": a["q"], "k_cache": k_c, "v_cache": v_c,
                "out": a["y"]}):
            plan.add("attention", launch)

    def forward(self, ids: np.ndarray, start: int, caches: GPUCaches | None, final_row_slicing: bool,
                timed: bool = False) -> tuple[np.ndarray, GPUCaches]:
        """Run new tokens after `caches` (None at the start), one wait for the result; `caches` is not modified.

        Args:
            ids: (n,) token ids.
            start: position of the first one.
            caches: the previous state's caches.
            final_row_slicing: compute only the last row in the last block.
            timed: time every launch with GPU timestamps (one pass per launch) into `last_op_times`.

        Returns:
            ((hidden,) float32 final-normed last hidden state, new caches).
        """
        if self._lost:
            self._setup()
        try:
            plan, new = self.plan(np.asarray(ids), start, caches, final_row_slicing)
            res_shape = (self.cfg.hidden_size + self.cfg.num_labels,)
            if timed:
                ms = self.dev.time(plan.launches)
                self.last_op_times = list(zip(plan.labels, (float(t) for t in ms)))
                res = self.dev.download(self.act["res"], np.float32, res_shape)
            else:  # the decision's launches and the copy of its result row, one map at the end
                res = self.dev.run_and_download(plan.launches, self.act["res"], np.float32, res_shape, reuse=plan)
        except DeviceLost as exc:
            self._lost = True
            raise DeviceLost(f"{exc.problem} (during a decision)",
                             "retry the decision: the next call rebuilds the device, weights and pipelines; states "
                             "made before must be prefilled again") from exc
        return self.split_result(res, new)
