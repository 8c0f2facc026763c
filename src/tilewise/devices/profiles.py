"""Named device-limit profiles for `--dry-run --target PROFILE`: legality without a device.

`webgpu-default` is the WebGPU spec's default limits (what any conforming adapter grants without asking);
the others are adapters measured here. Add a profile by adding one entry to `PROFILES`.
"""

from __future__ import annotations

from tilewise.devices.base import Limits, SubgroupMatrixConfig
from tilewise.errors import ConfigError

PROFILES: dict[str, Limits] = {
    # WebGPU spec defaults (maxComputeWorkgroupStorageSize 16384, maxComputeInvocationsPerWorkgroup 256, ...)
    "webgpu-default": Limits(max_workgroup_storage_bytes=16384, max_invocations_per_workgroup=256,
                             max_workgroup_size=(256, 256, 64), max_workgroups_per_dimension=65535,
                             max_buffer_bytes=268435456, max_storage_binding_bytes=134217728),
    # Mesa lavapipe (CPU Vulkan, CI)
    "lavapipe": Limits(max_workgroup_storage_bytes=32768, max_invocations_per_workgroup=1024,
                       max_workgroup_size=(1024, 1024, 1024), max_workgroups_per_dimension=65535,
                       max_buffer_bytes=2147483647, max_storage_binding_bytes=134217728,
                       subgroup_size_min=4, subgroup_size_max=128),
    # NVIDIA H200 through wgpu/Vulkan
    "h200-vulkan": Limits(max_workgroup_storage_bytes=49152, max_invocations_per_workgroup=1024,
                          max_workgroup_size=(1024, 1024, 64), max_workgroups_per_dimension=65535,
                          max_buffer_bytes=4292870144, max_storage_binding_bytes=2147483644,
                          subgroup_size_min=4, subgroup_size_max=128),
    # NVIDIA H200 through Dawn/Vulkan (driver 580): its f16 subgroup-matrix fragments (M x N x K; the i8/u8 ones
    # are left out), subgroups of 32; the workgroup and buffer limits are wgpu's for the same GPU
    "h200-dawn": Limits(max_workgroup_storage_bytes=49152, max_invocations_per_workgroup=1024,
                        max_workgroup_size=(1024, 1024, 64), max_workgroups_per_dimension=65535,
                        max_buffer_bytes=4292870144, max_storage_binding_bytes=2147483644,
                        subgroup_size_min=4, subgroup_size_max=128,  # as Dawn reports them on an H200
                        subgroup_matrix_configs=tuple(
                            SubgroupMatrixConfig(a, r, m, n, k, 32, 32)
                            for a, r in (("f16", "f16"), ("f16", "f32"))
                            for m, n, k in ((16, 16, 16), (16, 8, 16), (16, 8, 8)))),
    # Mesa 26 lavapipe through Dawn (cooperative matrices: 8x8x8 f16 fragments in subgroups of 8; Dawn reports
    # subgroup sizes 4..128): what `bash scripts/run test-sgmat` runs the subgroup-matrix numerics on
    "lavapipe-dawn-coopmat": Limits(max_workgroup_storage_bytes=32768, max_invocations_per_workgroup=1024,
                                    max_workgroup_size=(1024, 1024, 1024), max_workgroups_per_dimension=65535,
                                    max_buffer_bytes=4294967295, max_storage_binding_bytes=134217728,
                                    subgroup_size_min=4, subgroup_size_max=128,
                                    subgroup_matrix_configs=tuple(SubgroupMatrixConfig("f16", r, 8, 8, 8, 8, 8)
                                                                  for r in ("f16", "f32"))),
    # CUDA sm_90 (H100/H200): 48 KiB static shared memory per block, 227 KiB with the opt-in
    "sm_90": Limits(max_workgroup_storage_bytes=49152, max_invocations_per_workgroup=1024,
                    max_workgroup_size=(1024, 1024, 64), max_workgroups_per_dimension=2147483647,
                    max_buffer_bytes=2**40, max_storage_binding_bytes=2**40, subgroup_size_min=32,
                    subgroup_size_max=32, warp_size=32, shared_bytes_per_block_optin=232448,
                    shared_bytes_per_multiprocessor=233472, registers_per_block=65536,
                    registers_per_multiprocessor=65536, max_threads_per_multiprocessor=2048, multiprocessors=132,
                    compute_capability="9.0"),
}

#: the profile a `--dry-run` uses per backend when no `--target` is given
DEFAULT_FOR_BACKEND = {"webgpu": "webgpu-default", "cuda": "sm_90"}


def get_profile(name: str) -> Limits:
    """The limits called `name`; unknown names list the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown target profile {name!r}", f"use one of: {', '.join(PROFILES)}") from None
