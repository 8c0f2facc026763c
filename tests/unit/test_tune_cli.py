"""The tune/sweep/store/report command line without a device: dry runs, sources, and every bad input."""

import json
import re

import pytest

from tilewise.cli import main
from tilewise.tune.store import Result, Store


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_dry_run_lists_legal_and_illegal_with_reasons(capsys):
    code, out, _ = run(capsys, "tune", "gemm", "--shape", "64,64,64", "--dry-run", "--target", "lavapipe")
    assert code == 0
    assert out.count("legal    ") == 14
    assert "skipped  128x64x16 W64x32 WN2 T4x4 256t wg vec4  (illegal: threads: threads = " \
           "(BM/WM)*(BN/WN)*32 = (128/64)*(64/32)*32 = 128 != NT 256)" in out
    assert "14 legal, 2 illegal of 16" in out


def test_dry_run_uses_the_target_limits(capsys):
    # the WebGPU spec defaults allow 256 invocations and 16 KiB: the 256-thread seed point becomes illegal
    code, out, _ = run(capsys, "tune", "gemm", "--shape", "64,64,64", "--dry-run", "--target", "webgpu-default")
    assert code == 0
    assert "invocations" not in out  # 256 threads is exactly the default limit
    code, out, _ = run(capsys, "tune", "gemm", "--shape", "64,64,64", "--dry-run")
    assert "limits webgpu-default" in out


def test_dry_run_shape_problems_are_listed(capsys):
    code, out, _ = run(capsys, "tune", "gemm", "--shape", "64,63,64", "--dry-run", "--target", "lavapipe")
    assert code == 0
    assert "vec4_shape: vec4 rows need K % 4 == 0 and N % 4 == 0, got K=64, N=63" in out
    assert "1 legal" in out  # only the vec1 point handles N = 63


def test_full_space_dry_run_summarizes(capsys):
    code, out, _ = run(capsys, "tune", "gemm", "--shape", "128,128,128", "--space", "large", "--dry-run",
                       "--target", "h200-vulkan")
    assert code == 0 and "legal of" in out and "first broken rule" in out


def test_show_source_prints_wgsl_of_one_config(capsys):
    code, out, _ = run(capsys, "tune", "gemm", "--show-source", "TM=8,TN=8,WNITER=1,SA=private")
    assert code == 0
    assert out.startswith("// tilewise gemm: 128x64x16 W64x32 WN1 T8x8 128t A:priv B:wg vec4")
    assert "@compute @workgroup_size(128)" in out and "acc_0_7_0_1" in out
    assert "array<f32, " not in out  # accumulators are named scalars/vectors, never an indexed local array


@pytest.mark.parametrize("argv,needle", [
    (["tune", "gemm", "--shape", "64,64", "--dry-run"], "malformed shape"),
    (["tune", "gemm", "--shape", "64,x,64", "--dry-run"], "malformed shape"),
    (["tune", "gemm", "--shape", "0,64,64", "--dry-run"], "malformed shape"),
    (["tune", "conv9", "--shape", "64,64,64", "--dry-run"], "unknown family 'conv9'"),
    (["tune", "gemm", "--shape", "64,64,64", "--space", "huge", "--dry-run"], "unknown space 'huge'"),
    (["tune", "gemm", "--shape", "64,64,64", "--strategy", "annealing", "--dry-run"], "unknown --strategy 'annealing'"),
    (["tune", "gemm", "--shape", "64,64,64", "--budget", "0", "--dry-run"], "expected a whole number of at least 1"),
    (["tune", "gemm", "--shape", "64,64,64", "--dry-run", "--target", "sm_999"], "unknown --target 'sm_999'"),
    (["tune", "gemm", "--dry-run"], "--shape is required"),
    (["tune", "gemm", "--show-source", "BM=128,XX=3"], "unknown parameters"),
    (["tune", "gemm", "--show-source", "BM"], "cannot parse"),
    (["tune", "gemm", "--device", "tpu", "--shape", "64,64,64", "--dry-run"], "unknown device"),
    (["sweep", "gemm", "--m", "5..1", "--n", "64", "--k", "64"], "bad M range"),
    (["tune", "model", "--climb", "0"], "--climb: expected a whole number of at least 1"),
    (["tune", "gemm", "--shape", "64,64,64", "--strategy", "climbing", "--dry-run"], "unknown --strategy 'climbing'"),
])
def test_bad_input_is_one_clear_error(capsys, argv, needle):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert needle in err and "fix:" in err
    assert "Traceback" not in err


def test_an_unknown_model_names_every_kind_of_model_tune_takes(capsys):
    code, _, err = run(capsys, "tune", "model", "--device", "cpu", "--preset", "nosuch")
    assert code == 2 and "fix: use default (the bundled model), one of lfm2-350m" in err and "model folder" in err


def test_every_config_illegal_is_a_clear_message(capsys):
    # a target with 32 invocations and 1 KiB of workgroup storage rejects every seed point
    from tilewise.devices import profiles
    from tilewise.devices.base import Limits

    profiles.PROFILES["tiny"] = Limits(1024, 32, (32, 1, 1), 65535, 2**20, 2**20)
    try:
        code, _, err = run(capsys, "tune", "gemm", "--shape", "64,64,64", "--dry-run", "--target", "tiny")
    finally:
        del profiles.PROFILES["tiny"]
    assert code == 2
    assert "every config of gemm space 'seed' is illegal under tiny" in err
    assert "invocations" in err and "fix:" in err


def test_a_rule_every_config_breaks_gives_its_own_fix(capsys):
    # wgpu-native's H200 profile has no subgroup matrices: every gemm-f16 config breaks fragment_offered, whose
    # reason names the device that has them; a rule only some configs break leaves the generic fix
    code, _, err = run(capsys, "tune", "gemm-f16", "--shape", "64,64,64", "--dry-run", "--target", "h200-vulkan")
    assert code == 2 and "fix: every config breaks fragment_offered: this device has no subgroup matrices" in err
    assert "use --device dawn" in err
    from tilewise.devices import profiles
    from tilewise.devices.base import Limits

    profiles.PROFILES["tiny"] = Limits(1024, 32, (32, 1, 1), 65535, 2**20, 2**20)
    try:
        code, _, err = run(capsys, "tune", "gemm", "--shape", "64,64,64", "--dry-run", "--target", "tiny")
    finally:
        del profiles.PROFILES["tiny"]
    assert code == 2 and "fix: every config breaks invocations: NT = " in err
    from tilewise.kernels.registry import get_template
    from tilewise.tune.tuner import no_legal_config_error

    tpl = get_template("gemm", "webgpu")
    space = tpl.space("seed")
    c1, c2 = list(space)[:2]
    split = no_legal_config_error(tpl, space, (64, 64, 64), [(c1, ["a: one"]), (c2, ["b: two"])], "here")
    assert split.fix.startswith("try --space full")  # no rule broken by both: the generic fix
    both = no_legal_config_error(tpl, space, (64, 64, 64), [(c1, ["b: two", "a: x"]), (c2, ["a: y"])], "here")
    assert both.fix == "every config breaks a: x"


def test_store_export_import_and_report(capsys, tmp_path):
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    with Store(a) as st:
        st.put(Result("webgpu:x", "gemm", "h", "64x64x64", "BM=64", "ok", "", median_ms=0.5))
        st.put(Result("webgpu:x", "gemm", "h", "64x64x64", "BM=32", "wrong", "rel_err 1e-1"))
    code, out, _ = run(capsys, "store", "export", str(tmp_path / "r.json"), "--store", str(a))
    assert code == 0 and "exported 2" in out
    code, out, _ = run(capsys, "store", "import", str(tmp_path / "r.json"), "--store", str(b))
    assert code == 0 and "imported 2" in out
    code, out, _ = run(capsys, "store", "import", str(tmp_path / "r.json"), "--store", str(b))
    assert "imported 0" in out and "kept 2" in out
    code, out, _ = run(capsys, "report", "--store", str(b))
    assert code == 0 and "gemm" in out and "ok 1" in out and "wrong 1" in out
    assert re.search(r"median_ms +BM\n +0\.5000 +64\n", out)  # names once, over the values
    assert json.loads((tmp_path / "r.json").read_text())["results"][0]["kernel"] == "gemm"


def test_corrupt_store_via_cli(capsys, tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"garbage" * 200)
    code, _, err = run(capsys, "report", "--store", str(bad))
    assert code == 2 and "unreadable" in err and "--store PATH" in err


def test_registry_names_cuda_template_and_lists_kernels():
    from tilewise.kernels import registry

    assert registry.TEMPLATES[("gemm", "webgpu")] == "tilewise.kernels.gemm.webgpu:WgslGemm"
    assert registry.TEMPLATES[("gemm", "cuda")] == "tilewise.kernels.gemm.cuda:CudaGemm"
    assert "gemm" in registry.kernels()


def test_registry_missing_module_is_clear(monkeypatch):
    from tilewise.errors import DeviceUnavailable
    from tilewise.kernels import registry

    monkeypatch.setitem(registry.TEMPLATES, ("gemm", "metal"), "tilewise.kernels.no_such_module:X")
    with pytest.raises(DeviceUnavailable, match="not part of this build"):
        registry.get_template("gemm", "metal")
