"""The reference documents stay true: every Python example in docs/SPEC.md runs as written,
and docs/CLI.md lists every command and exit code the program has."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from marlin_dsl import cli

DOCS = Path(__file__).resolve().parent.parent / "docs"
SPEC_BLOCKS = re.findall(r"```python\n(.*?)```", (DOCS / "SPEC.md").read_text(), re.S)


def test_spec_reference_has_examples() -> None:
    assert len(SPEC_BLOCKS) >= 8


@pytest.mark.parametrize("index", range(len(SPEC_BLOCKS)))
def test_spec_reference_examples_run(index: int) -> None:
    exec(compile(SPEC_BLOCKS[index], f"docs/SPEC.md block {index}", "exec"), {"__name__": "spec_doc"})


def test_cli_reference_lists_commands_and_exit_codes() -> None:
    text = (DOCS / "CLI.md").read_text()
    commands = cli.build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001
    for command in commands:
        assert f"`{command}" in text, command
    for code in (cli.EXIT_OK, cli.EXIT_CHECK_FAILED, cli.EXIT_USAGE, cli.EXIT_INPUT,
                 cli.EXIT_ENVIRONMENT, cli.EXIT_INTERRUPTED):
        assert f"| {code} |" in text, code


def test_architecture_names_only_what_exists() -> None:
    """Every path and registry docs/ARCHITECTURE.md names is in the tree."""
    root = DOCS.parent
    text = (DOCS / "ARCHITECTURE.md").read_text()
    paths = set(re.findall(r"`?((?:marlin_dsl|examples|bench|tests|docs)/[\w./*-]+\.(?:py|md))`?", text))
    assert len(paths) > 10
    for path in paths:
        assert list(root.glob(path)), path
    short = set(re.findall(r"`((?:formats|lowering|ir|passes|machine|targets|layers|models)/[\w/.-]+)`", text))
    for path in short:
        assert (root / "marlin_dsl" / path).exists(), path
    from marlin_dsl.formats import STORAGE_TYPES  # noqa: F401  (the registries it names exist)
    from marlin_dsl.formats.builtin import BUILTIN_FORMATS  # noqa: F401
    from marlin_dsl.ir.interpret import HANDLERS  # noqa: F401
    from marlin_dsl.ir.ops import OPS  # noqa: F401
    from marlin_dsl.layers.dispatch import _DISPATCH  # noqa: F401
    from marlin_dsl.lowering.pipelines import LOWERINGS  # noqa: F401
    from marlin_dsl.machine import TARGETS  # noqa: F401
    from marlin_dsl.passes.manager import PASSES  # noqa: F401
    from marlin_dsl.pipelines import PIPELINES  # noqa: F401
    from marlin_dsl.targets.runtimes import RUNTIMES  # noqa: F401


def _section(title: str) -> str:
    text = (DOCS / "ARCHITECTURE.md").read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


@pytest.mark.parametrize("title, protocol, names", [
    ("How to add a pipeline", "marlin_dsl.pipelines.base:Pipeline", ("validate", "warps", "check", "kind")),
    ("How to add a scale scheme", "marlin_dsl.formats.scaling.scheme:Scaling",
     ("arrays", "choose", "affine", "emit_load", "emit_apply", "text_kind", "text_attrs", "emit_group")),
    ("How to add a target", "marlin_dsl.targets.base:TargetRuntime",
     ("ship", "native_check", "layer_layout", "layer_kernel", "kernel_launcher", "tuned_schedule", "timed_kernel")),
])
def test_architecture_walkthroughs_name_the_real_interface(title: str, protocol: str, names: tuple[str, ...]) -> None:
    """Each "how to add" walk-through names the methods of the interface it walks through, and
    the interface has them (a renamed method fails here, not in a reader's hands)."""
    import importlib

    module, cls = protocol.split(":")
    interface = getattr(importlib.import_module(module), cls)
    section = _section(title)
    for name in names:
        assert re.search(rf"`[^`]*\b{name}\b[^`]*`", section), (title, name)
        assert hasattr(interface, name) or name in getattr(interface, "__annotations__", {}), (protocol, name)


def test_architecture_examples_compile() -> None:
    """The example specs the walk-throughs name load, and every Gemm in them lowers, passes the
    pass pipeline and prints for every target that takes its pipeline."""
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.errors import ScheduleError
    from marlin_dsl.machine import TARGETS
    from marlin_dsl.spec import load_spec
    from marlin_dsl.targets import emit

    text = (DOCS / "ARCHITECTURE.md").read_text()
    examples = sorted(set(re.findall(r"examples/\w+\.py", text)))
    assert len(examples) >= 3, examples
    for example in examples:
        spec = load_spec(DOCS.parent / example)
        assert spec.gemms, example
        for gemm in spec.gemms:
            printed = 0
            for target in TARGETS.values():
                try:
                    compiled = compile_gemm(gemm, target)
                except ScheduleError:
                    continue
                assert emit(compiled.kernel, target).full_source(), (example, gemm.name, target.name)
                printed += 1
            assert printed, (example, gemm.name)
