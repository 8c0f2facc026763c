"""Dawn devices for the tests: Dawn's Null backend (compiles, runs nothing) and a real adapter with subgroup
matrices (numerics), each skipping cleanly where it is missing."""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable
from typing import Any

import pytest

from tilewise.devices import dawn
from tilewise.devices.base import Limits, SubgroupMatrixConfig
from tilewise.kernels.space import Config, Space


def need_dawn() -> None:
    if not dawn.available():
        pytest.skip("wgpudawn is not installed (pip install 'tilewise[dawn]')")


def null_device(disable_robustness: bool = False) -> dawn.DawnDevice:
    """A Dawn device on the Null backend (forced through WGPU_BACKEND_TYPE, which Dawn reads when it picks an
    adapter; the variable is restored afterwards so that other devices are not affected)."""
    need_dawn()
    old = os.environ.get("WGPU_BACKEND_TYPE")
    os.environ["WGPU_BACKEND_TYPE"] = "Null"
    try:
        infos = dawn.list_adapters()
        nulls = [i.index for i in infos if i.api == "Null"]
        if not nulls:
            pytest.skip("this wgpudawn build has no Null backend")
        return dawn.DawnDevice(nulls[0], disable_robustness=disable_robustness)
    finally:
        if old is None:
            os.environ.pop("WGPU_BACKEND_TYPE", None)
        else:
            os.environ["WGPU_BACKEND_TYPE"] = old


def with_every_fragment(limits: Limits, frags: list[str]) -> Limits:
    """`limits` with every fragment shape of `frags` offered (f16 -> f32) for the device's subgroup sizes: what the
    Null backend, which offers none, needs for pipelines of every fragment to be built."""
    lo, hi = limits.subgroup_size_min or 1, limits.subgroup_size_max or 128
    configs = tuple(SubgroupMatrixConfig("f16", "f32", *(int(x) for x in f.split("x")), lo, hi) for f in frags)
    return dataclasses.replace(limits, subgroup_matrix_configs=configs)


def real_dawn_device() -> dawn.DawnDevice:
    """The best real Dawn adapter offering f16 -> f32 subgroup matrices, else skip."""
    need_dawn()
    from tilewise.devices import get_device
    from tilewise.errors import DeviceUnavailable

    real = [i for i in dawn.list_adapters() if i.api != "Null"]
    if not real:
        pytest.skip("no real Dawn adapter here (Dawn refuses this Vulkan driver or there is no GPU)")
    try:
        dev = get_device("dawn")
    except DeviceUnavailable as exc:
        pytest.skip(f"Dawn cannot open a device here: {exc}")
    configs = dev.info.limits.subgroup_matrix_configs or ()
    if not any((c.component_type, c.result_component_type) == ("f16", "f32") for c in configs):
        pytest.skip(f"{dev.info.name} on Dawn offers no f16 -> f32 subgroup matrices")
    return dev


def every_code_path(space: Space, limits: Limits, paths: dict[str, list[Any]], legal: Callable[[Config], bool],
                    per_path: int = 1) -> tuple[list[Config], list[dict[str, Any]]]:
    """Configs that cover every code path a template's space can generate under `limits`.

    `paths` names the parameters whose values choose generated code (and the values to cover); for every
    combination of them, the rest of the space is walked in the grid's order and `per_path` of its legal configs
    (the smallest and largest tiles first, by the order of the grid) are picked. Returns (picked configs, the
    combinations with no legal config at all: proven empty by the enumeration, so no shader exists to check).

    For `per_path` 1 and 2 the rest is walked from each end only up to the first legal config (the smallest and the
    largest tile are all that is picked), so only an empty combination is enumerated whole: the same picks as a
    whole enumeration, in a fraction of the time (most of the grid of a combination is never looked at)."""
    rest = {k: v for k, v in space.params.items() if k not in paths}
    picked: list[Config] = []
    empty: list[dict[str, Any]] = []

    def legal_ones(fixed: dict[str, Any], backwards: bool = False):
        values = [v[::-1] if backwards else v for v in rest.values()]  # reversed lists: the grid's order reversed
        return (c for c in (space.config({**fixed, **dict(zip(rest, vals))}) for vals in itertools.product(*values))
                if space.is_legal(c, limits) and legal(c))

    for combo in itertools.product(*paths.values()):
        fixed = dict(zip(paths, combo))
        if per_path in (1, 2):
            first = next(legal_ones(fixed), None)
            if first is None:
                empty.append(fixed)
                continue
            last = [next(legal_ones(fixed, backwards=True))] if per_path == 2 else []
            picked += list(dict.fromkeys([first, *last]))  # one config where the combination has just one
            continue
        ok = list(legal_ones(fixed))
        if not ok:
            empty.append(fixed)
            continue
        picked += list(dict.fromkeys([ok[0], ok[-1], *ok[1:-1]]))[:per_path]
    return picked, empty
