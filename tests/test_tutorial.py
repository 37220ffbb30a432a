"""docs/TUTORIAL.md is real: its spec file compiles and passes on both targets, the error it
shows is the one a user gets, its Python runs, and its convert commands convert a model."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from marlin_dsl.cli import EXIT_INPUT, EXIT_OK, main

TUTORIAL = (Path(__file__).resolve().parent.parent / "docs" / "TUTORIAL.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", TUTORIAL, re.S)


def _blocks(language: str) -> list[str]:
    return [code for lang, code in BLOCKS if lang == language]


@pytest.fixture
def spec_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "my_formats.py").write_text(_blocks("python")[0])
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("target", ["metal", "cuda"])
def test_the_spec_compiles_and_passes(spec_dir: Path, target: str, capsys: pytest.CaptureFixture) -> None:
    command = next(line for line in _blocks("bash")[0].splitlines() if ("--target cuda" in line) == (target == "cuda"))
    assert main(shlex.split(command.split("#")[0])[1:]) == EXIT_OK
    out = capsys.readouterr().out
    assert re.search(r"int5_g32\s+my_formats.py:\d+\s+5\.500\s", out)  # the bits/w the text states
    assert re.search(r"int5_2of4\s+my_formats.py:\d+\s+3\.750\s", out)
    assert len(re.findall(r" PASS$", out, re.M)) == 4 and "FAIL" not in out  # two formats, two kernels


def test_the_error_shown_is_the_one_a_user_gets(spec_dir: Path, capsys: pytest.CaptureFixture) -> None:
    spec = spec_dir / "my_formats.py"
    spec.write_text(spec.read_text().replace("GroupScale(32)", "GroupScale(30)", 1))
    assert main(["compile", "my_formats.py", "--no-check"]) == EXIT_INPUT
    shown = re.search(r"```text\n(marlin-dsl: error: .*?)\n```", TUTORIAL, re.S).group(1)
    assert shown in capsys.readouterr().err


def test_the_python_runs(spec_dir: Path) -> None:
    namespace: dict = {}
    for code in _blocks("python")[1:]:
        exec(compile(code, "docs/TUTORIAL.md", "exec"), namespace)
    assert namespace["err"] < 0.1 and tuple(namespace["y"].shape) == (3, 96)
    assert namespace["metal_stream"].targets == ("metal",)


def test_the_convert_commands_convert(spec_dir: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install -e '.[test]')")
    from tiny_models import write_source

    write_source(spec_dir / "SRC")
    for line in _blocks("bash")[1].splitlines():
        args = shlex.split(line.split("#")[0])
        if args[1] == "generate":
            args += ["--max-tokens", "3"]
        assert main(args[1:]) == EXIT_OK, (line, capsys.readouterr())
    assert (spec_dir / "DST" / "config.json").is_file() and (spec_dir / "DST2" / "config.json").is_file()
