"""gemm.cu under nvcc (no GPU needed): legal seed configs compile for sm_90, illegal ones fail a static_assert
naming the rule, and the C++ `cfg_valid` / `cfg_first_failure` agree with the Python rules on random tuples."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from tilewise.devices.profiles import get_profile
from tilewise.kernels.gemm.cuda import PARAMS, SEED_RULES, CudaGemm

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not found")

TEMPLATE = CudaGemm()
SIGNATURE = "(int, int, int, float, const float *, const float *, float, float *)"


def gemm_cu() -> str:
    return str(resources.files("tilewise.kernels.gemm").joinpath("gemm.cu"))


def instantiate(values) -> str:
    return f"template __global__ void sgemm_warptile<{', '.join(map(str, values))}>{SIGNATURE};\n"


def nvcc(tmp_path: Path, name: str, body: str, *args: str) -> subprocess.CompletedProcess:
    src = tmp_path / f"{name}.cu"
    src.write_text(f'#include "{gemm_cu()}"\n{body}')
    return subprocess.run([NVCC, "-std=c++17", "-arch=sm_90", *args, str(src)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)


def test_every_legal_seed_config_compiles_for_sm_90(tmp_path):
    legal, illegal = TEMPLATE.space("seed").split(get_profile("sm_90"))
    assert len(legal) == 14 and len(illegal) == 2
    body = "".join(instantiate(c.values()) for c in legal)
    res = nvcc(tmp_path, "legal", body, "-cubin", "-Xptxas", "-v", "-o", "legal.cubin")
    assert res.returncode == 0, res.stderr[-3000:]
    entries = re.findall(r"Compiling entry function '(\w+)'", res.stderr)
    assert len(entries) == 14
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", res.stderr)]
    assert len(regs) == 14 and max(regs) <= 255


def test_illegal_instantiations_fail_a_static_assert_naming_the_rule(tmp_path):
    _, illegal = TEMPLATE.space("seed").split(get_profile("sm_90"))
    smem = (256, 256, 32, 64, 64, 4, 8, 4, 512)  # 64 KiB of static shared memory
    cases = [(tuple(c.values()), why[0].split(":")[0]) for c, why in illegal] + [(smem, "static_smem_48k")]
    for i, (values, rule) in enumerate(cases):
        res = nvcc(tmp_path, f"illegal{i}", instantiate(values), "-cubin", "-o", f"illegal{i}.cubin")
        assert res.returncode != 0, values
        asserts = re.findall(r'static assertion failed with "(\w+):', res.stderr)
        assert asserts == [rule], (values, res.stderr[-2000:])


def test_cpp_rules_agree_with_python_rules(tmp_path):
    """cfg_valid (the seed's text) and cfg_first_failure (rule numbers) in C++ vs the Python Space."""
    rng = random.Random(3)
    full = TEMPLATE.space("full")
    grid = list(full)
    sample = rng.sample(grid, 1500) + [full.config(dict(zip(PARAMS, (
        rng.choice([4, 8, 12, 16, 32, 64, 96, 128, 256]) for _ in PARAMS)))) for _ in range(1500)]
    rows = ",\n".join("{" + ", ".join(str(v) for v in c.values()) + "}" for c in sample)
    body = (f"#include <cstdio>\nstatic const int T[][9] = {{\n{rows}\n}};\n"
            "int main() { for (const auto &t : T) printf(\"%d %d\\n\", (int)cfg_valid(t[0], t[1], t[2], t[3], t[4], "
            "t[5], t[6], t[7], t[8]), cfg_first_failure(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8])); }\n")
    res = nvcc(tmp_path, "host", body, "-o", "host")
    assert res.returncode == 0, res.stderr[-3000:]
    out = subprocess.run([str(tmp_path / "host")], capture_output=True, text=True, check=True).stdout.split("\n")
    names = [r.name for r in SEED_RULES]
    legal_seen = 0
    for c, line in zip(sample, out):
        valid, fail = (int(x) for x in line.split())
        why = full.why_illegal(c)  # no limits: the seed's rules only
        assert bool(valid) == (not why), c
        assert (fail == 0) == (not why), c
        if why:
            assert names[fail - 1] == why[0].split(":")[0], (c, why)
        legal_seen += not why
    assert legal_seen > 20
