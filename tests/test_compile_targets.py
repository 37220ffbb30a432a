"""Issue 31 (items 3, 6, 8): a schedule that only some targets run says so (`targets=`), and
`compile --target X` compiles what X runs, lists what it skipped and exits 0; `compile DIR`
says DIR is a folder; one Gemm that does not compile is one error line, and the formats and
the other Gemms of its spec are still reported."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl.checks.kernel_check import check_kernel, check_shapes
from marlin_dsl.cli import EXIT_INPUT, EXIT_OK, main
from marlin_dsl.compiler import compile_gemm
from marlin_dsl.errors import ScheduleError
from marlin_dsl.schedule import known_target_names
from marlin_dsl.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

# Line numbers matter: the tests look for `spec.py:LINE` in what compile prints.
HEADER = (
    "from marlin_dsl import FloatEncoding, Format, FusedDequant, Gemm, GroupScale, IntEncoding, Schedule, WeightStream\n"
    "E2M1 = FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1)\n"
    "fp4 = Format('fp4_g32', E2M1, GroupScale(32))\n"                                               # line 3
    "fused = Schedule('fused', tile_m=32, tile_n=32, tile_k=32, warps_m=1, warps_n=2, pipeline=FusedDequant())\n"
)


def _spec(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "spec.py"
    path.write_text(HEADER + body)
    return path


def _kernel_names(out: str) -> list[str]:
    """The first column of the kernel table's rows."""
    table = out.split("\ngemm ", 1)[1].split("\n\n")[0]
    return [line.split()[0] for line in table.splitlines()[2:] if line and not line.startswith(" ")]


# ----- the declaration ---------------------------------------------------------------------


def test_targets_default_to_every_target_and_are_checked_at_the_schedule_line(tmp_path: Path) -> None:
    assert set(known_target_names()) == {md.METAL.name, md.CUDA.name}
    neutral = md.Schedule("n")
    assert neutral.targets is None and neutral.runs_on(md.METAL) and neutral.runs_on(md.CUDA)
    only = md.Schedule("m", targets=[md.METAL.name])  # a list is taken as the tuple
    assert only.targets == (md.METAL.name,) and only.runs_on(md.METAL) and not only.runs_on(md.CUDA)
    assert only != md.Schedule("m") and only == md.Schedule("m", targets=(md.METAL.name,))
    spec = _spec(tmp_path, "bad = Schedule('b',\n                targets=('rocm',))\n")  # line 5
    with pytest.raises(ScheduleError, match=rf"spec\.py:5: schedule 'b': unknown target 'rocm' in targets; "
                                            rf"the targets are 'cuda', 'metal'"):
        load_spec(spec)
    for bad, message in (("metal", r"non-empty tuple of target names such as targets=\('metal',\)"),
                         ((), "non-empty tuple"), (("metal", "metal"), "names a target twice"),
                         ((1,), "unknown target 1")):
        with pytest.raises(ScheduleError, match=message):
            md.Schedule("b", targets=bad)


def test_compile_gemm_refuses_a_target_the_schedule_does_not_declare() -> None:
    rng = np.random.default_rng()
    fmt = md.builtin_format("fp4")
    schedule, line = md.Schedule("metal_only", pipeline=md.FusedDequant(), targets=("metal",)), _line()
    gemm = md.Gemm("g", fmt, schedule)
    with pytest.raises(ScheduleError) as err:
        compile_gemm(gemm, md.CUDA)
    assert err.value.location.line == line and "gemm 'g': schedule 'metal_only' declares " \
        "targets=('metal',), so it is not compiled for cuda" in str(err.value)
    with pytest.raises(ScheduleError, match="not compiled for cuda"):  # the lowering's own check too
        schedule.check(fmt, md.CUDA)
    # the target it declares compiles it, and the kernel computes x @ W on fresh random data
    kernel = compile_gemm(gemm, md.METAL).kernel
    results = [check_kernel(gemm, kernel, shape, rng) for shape in check_shapes(gemm)[:2]]
    assert all(r.ok and r.rel_error > 0 for r in results), [r.summary() for r in results]


def test_the_layers_runtime_refuses_it_too() -> None:
    """The CUDA layers compile a user's schedule through compile_gemm: refused before any
    kernel is built (no GPU needed to see it)."""
    from marlin_dsl.targets.cuda.runtime import cuda_gemm

    with pytest.raises(ScheduleError, match="declares targets=\\('metal',\\), so it is not compiled for cuda"):
        cuda_gemm(md.builtin_format("fp4"), "f16", md.Schedule("mo", pipeline=md.FusedDequant(), targets=("metal",)))


def _line() -> int:
    import sys

    return sys._getframe(1).f_lineno


# ----- compile --target ----------------------------------------------------------------------


def test_compile_skips_and_lists_what_the_target_does_not_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path, (
        "metal_only = Schedule('metal_fused', tile_m=32, tile_n=32, tile_k=32, warps_m=1, warps_n=2,\n"
        "                      pipeline=FusedDequant(), targets=('metal',))\n"           # line 5-6
        "g = Gemm('g', fp4, fused)\n"
        "m = Gemm('m', fp4, metal_only)\n"
    ))
    out_dir = tmp_path / "out"
    assert main(["compile", str(spec), "--target", "cuda", "-o", str(out_dir)]) == EXIT_OK
    captured = capsys.readouterr()
    assert _kernel_names(captured.out) == ["g"] and "PASS" in captured.out
    skipped = captured.out.split("not compiled for cuda: their schedules declare other targets")[1]
    row = next(line for line in skipped.splitlines() if line.startswith("m "))
    assert row.split() == ["m", "metal_fused", "spec.py:5", "declares", "targets=('metal',)"]
    assert "wrote 1 kernel(s)" in captured.err and not (out_dir / "spec" / "m").exists()
    manifest = json.loads((out_dir / "spec" / "g" / "manifest.json").read_text())
    assert manifest["schedule"] == {"name": "fused", "targets": None}
    # Metal runs both: nothing skipped, and the manifest records the restriction
    assert main(["compile", str(spec), "--no-check", "-o", str(out_dir)]) == EXIT_OK
    captured = capsys.readouterr()
    assert _kernel_names(captured.out) == ["g", "m"] and "not compiled for" not in captured.out
    manifest = json.loads((out_dir / "spec" / "m" / "manifest.json").read_text())
    assert manifest["schedule"]["name"] == "metal_fused" and manifest["schedule"]["targets"] == ["metal"]


def test_a_schedule_claiming_a_target_it_cannot_run_is_an_error_with_a_hint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Metal's stream step of 128 positions is two loads on CUDA, which int4 groups of 64 do
    not cover: an error at the schedule's line that names the Gemm and says `targets=` exists;
    the spec's format and its other Gemm are still reported."""
    spec = _spec(tmp_path, (
        "int4_g64 = Format('int4_g64', IntEncoding(4, offset=8), GroupScale(64))\n"         # line 5
        "stream = Schedule('stream', tile_m=8, tile_n=128, tile_k=128, warps_m=1, warps_n=8,\n"
        "                  pipeline=WeightStream(k_warps=2))\n"                          # line 6-7
        "g = Gemm('g', fp4, fused)\n"
        "s = Gemm('s', int4_g64, stream)\n"
    ))
    assert main(["compile", str(spec), "--target", "cuda", "--no-check"]) == EXIT_INPUT
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("marlin-dsl: error:")]
    assert len(errors) == 1, captured.err
    assert errors[0].startswith(f"marlin-dsl: error: {spec}:6: gemm 's': schedule 'stream': weight_stream")
    assert errors[0].endswith("(schedule 'stream' fits metal: if it is meant only for that target, "
                              "declare it: Schedule(..., targets=('metal',)))")
    assert "1 of 1 spec file(s) failed to load or compile" in captured.err
    assert "spec.py:3" in captured.out and "spec.py:5" in captured.out  # both formats' rows
    assert _kernel_names(captured.out) == ["g"]
    # Metal runs it: the same spec passes there
    assert main(["compile", str(spec), "--no-check"]) == EXIT_OK
    assert _kernel_names(capsys.readouterr().out) == ["g", "s"]


def test_one_bad_gemm_does_not_hide_the_rest_of_its_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path, (
        "from marlin_dsl import builtin_format\n"
        "sparse = builtin_format('fp4_2of4')\n"                                              # line 6
        "k16 = Schedule('k16', tile_k=16)\n"                                                 # line 7
        "before = Gemm('before', fp4, fused)\n"
        "bad = Gemm('bad', sparse, k16)\n"
        "after = Gemm('after', sparse, fused)\n"
    ))
    assert main(["compile", str(spec)]) == EXIT_INPUT
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("marlin-dsl: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"marlin-dsl: error: {spec}:7: gemm 'bad': schedule "
                                                     "'k16': tile_k=16"), captured.err
    assert "targets=" not in errors[0]  # no target fits it: no hint
    assert "1 of 1 spec file(s) failed to load or compile" in captured.err
    format_rows = [line for line in captured.out.splitlines() if "spec.py:" in line]
    assert [r.split()[0] for r in format_rows] == ["fp4_g32", "fp4_2of4"]
    assert all(r.rstrip().endswith("PASS") for r in format_rows)
    assert _kernel_names(captured.out) == ["before", "after"]
    kernel_rows = captured.out.split("\ngemm ", 1)[1].split("\n\n")[0].splitlines()[2:]
    assert len(kernel_rows) == 2 and all(r.rstrip().endswith("PASS") for r in kernel_rows)


def test_compile_of_a_folder_says_it_is_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.py").write_text(HEADER)
    assert main(["compile", str(tmp_path)]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert f"spec file {str(tmp_path)!r} is a directory; pass the spec files in it: {tmp_path}/*.py" in err
    assert "does not exist" not in err


# ----- the examples --------------------------------------------------------------------------


@pytest.mark.parametrize("target", [md.METAL, md.CUDA], ids=lambda t: t.name)
def test_every_example_compiles_for_each_target(target, capsys: pytest.CaptureFixture[str]) -> None:
    """`compile examples/*.py --target X` exits 0 on both targets, skipping exactly the Gemms
    whose schedules declare other targets (each example declares what is true of it)."""
    assert main(["compile", *map(str, EXAMPLES), "--no-check", "--target", target.name]) == EXIT_OK
    out = capsys.readouterr().out
    gemms = [g for p in EXAMPLES for g in load_spec(p).gemms]
    skipped = [g.name for g in gemms if not g.schedule.runs_on(target)]
    assert skipped, "each target skips at least one example Gemm (the other's tuned stream)"
    assert _kernel_names(out) == [g.name for g in gemms if g.schedule.runs_on(target)]
    listed = out.split(f"not compiled for {target.name}:")[1].split("\n\n")[0].splitlines()[3:]
    assert [line.split()[0] for line in listed] == skipped
    assert max(len(line) for line in out.splitlines()) <= 100
