"""The README's commands and code are real: the two commands CI runs, the spec quick start
(compiled for both targets), the model quick start run as written against a tiny model
directory (convert, `marlin-dsl generate`, `mlx_lm.generate`, the Python three-liner), and the
layer and numpy examples."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from marlin_dsl.cli import EXIT_OK, main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _block(after: str, language: str) -> str:
    """The first ```language block after the heading or line `after`."""
    start = README.index(after)
    return re.search(rf"```{language}\n(.*?)```", README[start:], re.S).group(1)


def test_readme_starts_with_the_two_commands_and_ci_runs_the_test_command() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1).splitlines()
    install_main, install_test = (line.split("#")[0].strip() for line in first_block[:2])
    assert install_main == "pip install -e . && marlin-dsl compile examples/*.py"
    assert install_test == 'pip install -e ".[test]" && python -m pytest -q'
    ci = (ROOT / ".ci" / "run").read_text()
    assert install_test in ci and install_main in ci


def test_first_screen_is_what_install_and_quick_starts() -> None:
    """What it is, install, then the quick starts; no history (issue or round numbers)."""
    headings = re.findall(r"^## (.*)$", README, re.M)
    assert headings[:3] == ["Quick start: compile a format", "Quick start: convert a model and generate text",
                            "Quick start: a layer in your own MLX model"]
    assert not re.search(r"\b(issue|round|seed) \d+", README, re.I)
    assert len(README.splitlines()) < 200


@pytest.mark.parametrize("target", ["metal", "cuda"])
def test_spec_quick_start_compiles_and_passes(target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture) -> None:
    spec = _block("## Quick start: compile a format", "python")
    assert spec.startswith("# my_formats.py\n")
    (tmp_path / "my_formats.py").write_text(spec)
    monkeypatch.chdir(tmp_path)
    for line in _block("# my_formats.py", "bash").splitlines():  # the commands as written
        args = shlex.split(line.split("#")[0])
        assert args[0] == "marlin-dsl"
        if ("--target" in args) != (target == "cuda"):
            continue
        assert main(args[1:]) == EXIT_OK, capsys.readouterr()
    out = capsys.readouterr().out
    assert "int5_g32_fused" in out and "FAIL" not in out


@pytest.fixture(scope="module")
def source_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install -e '.[test]')")
    pytest.importorskip("transformers", reason="mlx-lm's tokenizers need transformers")
    from tiny_models import write_source

    return write_source(tmp_path_factory.mktemp("readme") / "SRC")


def _as_module(args: list[str]) -> list[str]:
    """A README command line as this interpreter runs it (console scripts as modules)."""
    scripts = {"marlin-dsl": ["marlin_dsl"], "mlx_lm.generate": ["mlx_lm.generate"]}
    return [sys.executable, "-m", *scripts[args[0]], *args[1:]]


def test_model_quick_start_runs_as_written(source_model: Path) -> None:
    """The quick start's commands, SRC and DST replaced by a tiny model directory and a new one;
    each generates words of the tiny tokenizer's vocabulary. Then the Python three-liner."""
    from tiny_models import WORDS

    dst = source_model.parent / "DST"
    commands = [line.split("#")[0].strip() for line in
                _block("## Quick start: convert a model and generate text", "bash").splitlines()]
    assert commands[0] == 'pip install -e ".[mlx-lm]"'
    outputs = []
    for line in commands[1:]:
        line = line.replace("SRC", str(source_model)).replace("DST", str(dst))
        line = re.sub(r'--prompt "[^"]*"', '--prompt "w1 w7 w42" --max-tokens 4', line)
        done = subprocess.run(_as_module(shlex.split(line)), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        outputs.append(done.stdout)
    assert (dst / "config.json").is_file()
    for out in outputs[1:]:  # the two generate commands print the model's words
        assert any(w in WORDS[3:] for w in out.split()), out
    code = _block("## Quick start: convert a model and generate text", "python")
    code = code.replace('"DST"', repr(str(dst))).replace('prompt="Write a haiku about GPUs"', 'prompt="w1 w7 w42"')
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert type(namespace["model"]).__module__.startswith("mlx_lm.models.llama")


def test_layer_example_runs() -> None:
    code = _block("## Quick start: a layer in your own MLX model", "python")
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    y = namespace["y"]
    assert y.shape == (8, 4096) and str(y.dtype) == "mlx.core.float16"


def test_numpy_example_runs() -> None:
    code = _block("From numpy, without MLX kernels:", "python")
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    packed = namespace["packed"]
    assert packed["qweight"].shape == (256, 4096) and packed["meta"].shape == (128, 4096)
    assert namespace["y_ref"].shape == (8, 4096)
