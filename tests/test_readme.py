"""The README's commands and Python example are real."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_starts_with_the_two_commands_and_ci_runs_the_test_command() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1).splitlines()
    install_main, install_test = (line.split("#")[0].strip() for line in first_block[:2])
    assert install_main == "pip install -e . && marlin-dsl compile examples/*.py"
    assert install_test == 'pip install -e ".[test]" && python -m pytest -q'
    ci = (ROOT / ".ci" / "run").read_text()
    assert install_test in ci and install_main in ci


def test_python_example_runs() -> None:
    code = re.search(r"From Python:\n\n```python\n(.*?)```", README, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    packed = namespace["packed"]
    assert packed["qweight"].shape == (256, 4096) and packed["meta"].shape == (128, 4096)
    assert namespace["y_ref"].shape == (8, 4096)


def test_mlx_example_runs() -> None:
    code = re.search(r"## In an MLX model\n\n```python\n(.*?)```", README, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    y = namespace["y"]
    assert y.shape == (8, 4096) and str(y.dtype) == "mlx.core.float16"
