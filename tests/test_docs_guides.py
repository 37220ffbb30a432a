"""The user guides docs/MLX.md, docs/TARGETS.md and docs/ACTIVATION.md stay true.

Every ```python block of the three runs as written, each in a fresh namespace and a fresh
working directory that holds what the guides assume a user has: `SRC`, an mlx-lm model
directory (a tiny llama with a tiny tokenizer, tests/tiny_models.py: nothing is downloaded),
and `examples/` (a link to the repository's). No block needs a GPU: they run on MLX's
default device, the CPU here, and kernels printed for a GPU run on the CPU harnesses. The IR
excerpt in docs/TARGETS.md is a run of lines of the real output of the command it shows. The
guides hold no performance numbers (those live in bench/README.md) and no history, link only
to files that exist, and are listed in the README's documentation.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GUIDES = ("MLX.md", "TARGETS.md", "ACTIVATION.md")
TEXT = {name: (DOCS / name).read_text() for name in GUIDES}
BLOCKS = [(name, index, code) for name in GUIDES
          for index, code in enumerate(re.findall(r"```python\n(.*?)```", TEXT[name], re.S))]


@pytest.fixture(scope="module")
def source_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_models import write_source

    return write_source(tmp_path_factory.mktemp("guides") / "SRC")


@pytest.mark.parametrize("name, index, code", BLOCKS, ids=[f"{n}-{i}" for n, i, _ in BLOCKS])
def test_guide_example_runs(name: str, index: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            request: pytest.FixtureRequest) -> None:
    if "SRC" in code:  # only the blocks that read a model directory pay for writing one
        (tmp_path / "SRC").symlink_to(request.getfixturevalue("source_model"), target_is_directory=True)
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"docs/{name} python block {index}", "exec"), {"__name__": "docs_guide"})


@pytest.mark.parametrize("name, least", [("MLX.md", 7), ("TARGETS.md", 5), ("ACTIVATION.md", 3)])
def test_guides_have_examples(name: str, least: int) -> None:
    assert sum(1 for n, _, _ in BLOCKS if n == name) >= least


@pytest.mark.parametrize("name", GUIDES)
def test_guides_are_reference_text(name: str) -> None:
    """Short, without history (issue, round or seed numbers) and without timings or speed-ups."""
    text = TEXT[name]
    assert len(text.splitlines()) <= 250
    assert not re.search(r"\b(issue|round|seed) \d+", text, re.I), name
    timing = re.search(r"\d\s*(us|µs|ms|tokens/s|GB/s|TB/s|TFLOP/s)\b|\d(\.\d+)?x (faster|slower|fp16)\b"
                       r"|\d%\s+(of|faster|slower|more|less)\b", text)
    assert timing is None, (name, timing and timing.group(0))


@pytest.mark.parametrize("name", GUIDES)
def test_guides_name_only_what_exists(name: str) -> None:
    text = re.sub(r"```.*?```", "", TEXT[name], flags=re.S)  # links and paths of the prose
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        assert (DOCS / link).exists(), (name, link)
    for path in re.findall(r"`((?:marlin_dsl|codegen|examples|bench|tests|docs)/[\w./-]+)`", text):
        assert (ROOT / path).exists(), (name, path)


def test_readme_lists_the_guides() -> None:
    documentation = (ROOT / "README.md").read_text().split("## Documentation", 1)[1].split("\n## ", 1)[0]
    for name in GUIDES:
        assert f"(docs/{name})" in documentation, name


def test_ir_excerpt_is_real_output(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The excerpt under `$ marlin-dsl compile ... --dump-ir lower` is what that command prints
    now: its lines appear, one after another, in the command's output."""
    import shlex

    from marlin_dsl.cli import main

    block = re.search(r"```text\n\$ (marlin-dsl [^\n]*)\n(.*?)```", TEXT["TARGETS.md"], re.S)
    assert block is not None
    command, excerpt = block.group(1), block.group(2).rstrip("\n").splitlines()
    assert len(excerpt) >= 10
    monkeypatch.chdir(ROOT)
    assert main(shlex.split(command)[1:]) == 0
    output = capsys.readouterr().out.splitlines()
    starts = [i for i, line in enumerate(output) if line == excerpt[0]]
    assert any(output[i:i + len(excerpt)] == excerpt for i in starts), "the excerpt is not in the output"
