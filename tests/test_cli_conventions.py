"""Issue 13: the command line follows the conventions users know (version, `python -m`,
documented exit codes, clean Ctrl-C, clear errors for bad options and paths), and nothing a
spec file declares is silently dropped or silently ambiguous."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import marlin_dsl as md
from marlin_dsl import cli
from marlin_dsl.cli import compile as cli_compile
from marlin_dsl.cli import main
from marlin_dsl.errors import SpecError
from marlin_dsl.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent

HEADER = (
    "from marlin_dsl import FloatEncoding, Format, FusedDequant, Gemm, GroupScale, Schedule\n"
    "E2M1 = FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1)\n"
    "fp4 = Format('fp4_g32', E2M1, GroupScale(32))\n"
    "sched = Schedule('s', tile_m=32, tile_n=32, tile_k=32, warps_m=1, warps_n=2, pipeline=FusedDequant())\n"
)


def _spec(tmp_path: Path, body: str, name: str = "spec.py") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + body)
    return path


def test_version_and_python_m() -> None:
    for argv in ([sys.executable, "-m", "marlin_dsl", "--version"],
                 [sys.executable, "-m", "marlin_dsl.cli", "--version"]):
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False)
        assert done.returncode == 0 and done.stdout.strip() == f"marlin-dsl {md.__version__}", done.stderr


def test_gemms_in_lists_dicts_and_loops_are_all_declared(tmp_path: Path) -> None:
    spec = load_spec(_spec(tmp_path, (
        "top = Gemm('top', fp4, sched)\n"
        "listed = [Gemm(f'listed_{i}', fp4, sched) for i in range(3)]\n"
        "by_name = {'a': Gemm('in_dict', fp4, sched)}\n"
        "for i in range(2):\n"
        "    last = Gemm(f'loop_{i}', fp4, sched)\n"
    )))
    assert [g.name for g in spec.gemms] == ["top", "listed_0", "listed_1", "listed_2", "in_dict",
                                            "loop_0", "loop_1"]


def test_two_different_formats_with_one_name_are_an_error(tmp_path: Path) -> None:
    path = _spec(tmp_path, "other = Format('fp4_g32', E2M1, GroupScale(64))\n")
    with pytest.raises(SpecError, match=r"spec.py:5: two different formats are named 'fp4_g32' \(the first at line 3\)"):
        load_spec(path)
    # The same format twice (equal declarations) is one format, not a clash.
    assert len(load_spec(_spec(tmp_path, "again = Format('fp4_g32', E2M1, GroupScale(32))\n", "ok.py")).formats) == 1


def test_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _spec(tmp_path, "g = Gemm('g', fp4, sched)\n")
    bad = tmp_path / "bad.py"
    bad.write_text("from marlin_dsl import Format\nf = Format('x', 1, 2)\n")
    assert main(["compile", str(bad)]) == cli.EXIT_INPUT
    assert main(["compile", str(good), "--dump-ir", "bogus"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "--dump-ir 'bogus': expected 'all' or a stage of the pipeline (lower, specialise" in err
    assert main(["compile", str(good), "--passes", "unroll,nope"]) == cli.EXIT_USAGE
    assert "unknown pass 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["compile"])  # argparse: missing argument
    assert exc.value.code == cli.EXIT_USAGE


def test_output_naming_a_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _spec(tmp_path, "g = Gemm('g', fp4, sched)\n")
    target = tmp_path / "afile"
    target.write_text("x")
    assert main(["compile", str(good), "-o", str(target), "--no-check"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "is a file; -o names a folder" in err and "Traceback" not in err


def test_two_specs_with_one_file_name_do_not_merge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = _spec(tmp_path / "a", "g = Gemm('g', fp4, sched)\n")
    two = _spec(tmp_path / "b", "h = Gemm('h', fp4, sched)\n")
    assert main(["compile", str(one), str(two), "-o", str(tmp_path / "out"), "--no-check"]) == cli.EXIT_USAGE
    assert "same file name ['spec']" in capsys.readouterr().err


def test_output_summary_and_no_check_is_not_a_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _spec(tmp_path, "g = Gemm('g', fp4, sched)\n")
    out = tmp_path / "out"
    assert main(["compile", str(good), "-o", str(out), "--no-check", "--target", "cuda"]) == cli.EXIT_OK
    captured = capsys.readouterr()
    assert "marlin-dsl: wrote 1 kernel(s), 3 files, under" in captured.err
    assert (out / "spec" / "g" / "g.cu").is_file()
    kernel_table = captured.out.split("\ngemm ")[1].split("\n\n")[0]
    row = next(line for line in kernel_table.splitlines() if line.startswith("g "))
    assert row.split()[-1] == "unchecked" and "PASS" not in kernel_table


def test_output_fits_100_columns_with_a_legend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.py"))
    assert main(["compile", *examples, "--no-check"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    for legend in ("bits/w:", "checks:", "q-excess:", "thr:", "interp:", "PASS:"):
        assert legend in out
    assert "kernel_check" not in out  # no internal names in what users read
    assert main(["formats"]) == cli.EXIT_OK
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 100


def test_a_bad_spec_does_not_hide_the_good_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _spec(tmp_path, "g = Gemm('g', fp4, sched)\n", "good.py")
    bad = tmp_path / "bad.py"
    bad.write_text("x = (\n")
    assert main(["compile", str(bad), str(good), "--no-check"]) == cli.EXIT_INPUT
    captured = capsys.readouterr()
    assert f"{bad}:1: syntax error" in captured.err and "1 of 2 spec file(s) failed" in captured.err
    assert "good.py:3" in captured.out and "\ng " in captured.out  # the good spec's tables


def test_group_size_not_dividing_4096_reports_storage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "g48.py"
    spec.write_text("from marlin_dsl import IntEncoding, Format, GroupScale\n"
                    "int4_g48 = Format('int4_g48', IntEncoding(4, offset=8), GroupScale(48))\n")
    assert main(["compile", str(spec)]) == cli.EXIT_OK
    assert "int4_g48" in capsys.readouterr().out
    assert cli.report_shape(load_spec(spec).formats[0]) == (4080, 4096)


def test_ctrl_c_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_compile, "cmd_formats", interrupted)
    assert main(["formats"]) == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().err == "marlin-dsl: interrupted\n"


def test_bits_per_weight_means_the_same_in_both_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`formats` and `compile` both report bits/w with scales (fp4, group 128: 4 + 16/128)."""
    assert main(["formats"]) == cli.EXIT_OK
    header, _, *rows = capsys.readouterr().out.splitlines()
    fp4_row = next(r for r in rows if r.startswith("fp4 "))
    start = header.index("bits/w", header.index("codes b/w") + len("codes b/w"))
    assert fp4_row[start:].split()[0] == "4.125" and "4.000" in fp4_row.split()  # with / without scales
    spec = tmp_path / "b.py"
    spec.write_text("import marlin_dsl as md\nfp4 = md.builtin_format('fp4')\n")
    assert main(["compile", str(spec)]) == cli.EXIT_OK
    line = next(r for r in capsys.readouterr().out.splitlines() if "b.py:2" in r)
    assert "4.125" in line.split()
