"""Nothing outside the CUDA packages (marlin_dsl/machine/cuda/, its description; marlin_dsl/
targets/cuda/, its printer and runtime) names CUDA specifics, and nothing outside
marlin_dsl/machine/ and marlin_dsl/targets/ branches on a target's name (issues 14, 31): code
reads a `Target` description (`machine/target.py`) or looks a user's backend name up in a
registry (`TARGETS`, `targets.runtimes.RUNTIMES`). Checked on the syntax tree, so prose
(docstrings, comments) may still explain what CUDA does."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "marlin_dsl"
#: The packages where CUDA may be named: its description and its printer, launcher, runtime.
CUDA_PACKAGES = ("marlin_dsl.machine.cuda", "marlin_dsl.targets.cuda")
#: The packages that may branch on a target's name: the descriptions and what runs them.
TARGET_PACKAGES = ("marlin_dsl.machine", "marlin_dsl.targets")
#: The faces that re-export the CUDA description by name.
DESCRIPTION_FACES = ("marlin_dsl.machine",)

#: Target names: comparing a value with one of them is a branch on the target's name.
TARGET_NAMES = {"cuda", "metal"}
#: CUDA spellings that must only occur in the CUDA packages (string
#: constants anywhere else, docstrings excepted): PTX instructions, CUDA C++ types and
#: builtins, the sparse activation layout's name.
CUDA_TOKENS = re.compile(r"mma\.sp|mma\.sync|cp\.async|ldmatrix|__half|__nv_bfloat16|__syncthreads|"
                         r"__shared__|threadIdx|blockIdx|cuda_mma_sp|\bptx\b")
#: Integer constants of CUDA's hardware: the all-valid ordered sparse metadata word.
CUDA_INTS = {0x44444444}

#: Files allowed to break a rule, each with its reason.
ALLOWED: dict[str, str] = {
    "marlin_dsl/__init__.py": "the public API re-exports the CUDA description (md.CUDA) and its "
                              "tuned schedules (md.tuned_schedule, md.multistage_schedule; README, docs/SPEC.md)",
    "marlin_dsl/machine/__init__.py": "the descriptions' face imports every description (that fills TARGETS)",
    "marlin_dsl/targets/__init__.py": "the printers' face imports every target package (that registers its printer)",
    "marlin_dsl/targets/runtimes.py": "the runtime registry imports every target's runtime",
}


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, node: ast.ImportFrom | ast.Import) -> list[tuple[str, str]]:
    """(module, name) of every name an import brings in, relative imports resolved."""
    if isinstance(node, ast.Import):
        return [(a.name, "") for a in node.names]
    package = _module_of(path) if path.name == "__init__.py" else _module_of(path).rpartition(".")[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    module = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
    return [(module, a.name) for a in node.names]


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _is_target_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in TARGET_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_target_name(e) for e in node.elts)
    return False


def _inside(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def violations(path: Path, text: str | None = None) -> list[str]:
    """The rule breaks of the module at `path` (its text, or `text` as if it were there)."""
    rel = path.relative_to(ROOT).as_posix()
    module = _module_of(path)
    inside_cuda = _inside(module, CUDA_PACKAGES)
    inside_targets = _inside(module, TARGET_PACKAGES)
    tree = ast.parse(path.read_text() if text is None else text)
    docs = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        line = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not inside_cuda:
            for mod, name in _imported(path, node):
                full = f"{mod}.{name}" if name else mod
                if _inside(full, CUDA_PACKAGES) or any(mod.startswith(p + ".") for p in CUDA_PACKAGES):
                    out.append(f"{line}: imports {full}")
                elif mod in DESCRIPTION_FACES and name == "CUDA":
                    out.append(f"{line}: imports the CUDA description by name")
        elif isinstance(node, ast.Compare) and not inside_targets:
            if any(_is_target_name(n) for n in [node.left, *node.comparators]):
                out.append(f"{line}: branches on a target name ({ast.unparse(node)})")
        elif isinstance(node, ast.Constant) and not inside_cuda and id(node) not in docs:
            if isinstance(node.value, str) and CUDA_TOKENS.search(node.value):
                out.append(f"{line}: CUDA spelling {CUDA_TOKENS.search(node.value).group()!r}")
            elif type(node.value) is int and node.value in CUDA_INTS:
                out.append(f"{line}: CUDA constant {node.value:#x}")
    return out


def test_nothing_outside_the_cuda_packages_names_cuda() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(ROOT).as_posix() not in ALLOWED:
            found += violations(path)
    assert not found, "CUDA specifics or target-name branches outside machine/ and targets/:\n" + "\n".join(found)


def test_the_allow_list_is_needed() -> None:
    """Every allowed file exists and still needs its entry (else the entry goes)."""
    for rel in ALLOWED:
        path = ROOT / rel
        assert path.exists(), rel
        assert violations(path), f"{rel} no longer needs its allow-list entry"


def test_the_check_sees_violations() -> None:
    """The scanner finds each kind of violation it exists for (in a module that is not there)."""
    fake = PACKAGE / "lowering" / "_boundary_probe.py"
    source = ('from ..targets.cuda.printer import print_cuda\n'
              'from ..machine.cuda.sparse_layout import metadata_fields\n'
              'from ..machine import CUDA\n'
              'def f(target):\n'
              '    """mma.sp in a docstring is prose."""\n'
              '    if target.name == "metal":\n'
              '        return "cp.async.cg.shared.global"\n'
              '    return 0x44444444\n')
    found = violations(fake, source)
    kinds = [v.split(": ", 1)[1] for v in found]
    assert len(found) == 6, found
    assert any("imports marlin_dsl.targets.cuda.printer" in k for k in kinds)
    assert any("imports marlin_dsl.machine.cuda.sparse_layout" in k for k in kinds)
    assert any("CUDA description" in k for k in kinds)
    assert any("branches on a target name" in k for k in kinds)
    assert any("cp.async" in k for k in kinds)
    assert any("0x44444444" in k for k in kinds)
