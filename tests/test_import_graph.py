"""The import graph of the package has no cycles (issue 14): data flows one way, spec ->
lowering -> IR -> passes -> printer -> launcher, and inside a stage modules import downwards.
Function-local imports count too (they hide cycles, they do not remove them). Imports of a
package's face (its __init__, a re-export hub) are not edges: the edge is to the module that
defines the name, which the face imports."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent / "marlin_dsl"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> nx.DiGraph:
    files = {p: _module_name(p) for p in ROOT.rglob("*.py")}
    modules = set(files.values())
    packages = {_module_name(p) for p in files if p.name == "__init__.py"}
    graph = nx.DiGraph()
    for path, name in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                dest = sub if sub in modules else target
                if dest in packages or dest == name or dest not in modules:
                    continue
                graph.add_edge(name, dest)
    return graph


def test_the_graph_is_read() -> None:
    graph = _graph()
    assert graph.number_of_edges() > 100
    assert graph.has_edge("marlin_dsl.lowering.pipelines", "marlin_dsl.lowering.weight_stream")


def test_no_import_cycles() -> None:
    cycles = list(nx.simple_cycles(_graph()))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c + [c[0]]) for c in cycles[:10])
