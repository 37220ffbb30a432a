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
