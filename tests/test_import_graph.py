"""The import graph of the package has no cycles and no upward imports between stages (issue
14): data flows one way, spec -> lowering -> IR -> passes -> printer -> launcher, and inside a
stage modules import downwards. The stages are data (STAGES, STAGE_RULES by module pattern,
ALLOWED_UPWARD with a reason per edge), so a move changes a table, not the test.
Function-local imports count too (they hide cycles, they do not remove them). Imports of a
package's face (its __init__, a re-export hub) are not edges: the edge is to the module that
defines the name, which the face imports."""
from __future__ import annotations

import ast
import fnmatch
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


# ----- layering: no module imports from a later stage -------------------------------------------

#: The stages, lowest first. Data flows one way (docs/ARCHITECTURE.md): spec -> lowering -> IR
#: -> passes -> printer -> launcher, and the layers users call sit on top. Target descriptions
#: sit below the IR (the verifier and the interpreter read their lane tables), and the IR below
#: the formats (a scale scheme emits its own load and application as IR).
STAGES: list[str] = [
    "base",       # errors, source locations, the build cache, grammars, codegen resources, attribute text
    "targets",    # target descriptions: MMA shapes, lane tables, sparse metadata layout, limits
    "ir",         # types, ops, verifier, builder, text, graph; the interpreter (the IR's oracle)
    "formats",    # the format DSL and everything derived from a format (packing; a scale scheme's IR)
    "layouts",    # physical layouts from a description and a target's lane tables (weight stream, sparse activation)
    "schedule",   # what the lowering is asked for: schedules and pipelines, spec files
    "lowering",   # spec -> IR
    "passes",     # IR -> IR
    "printers",   # IR -> Metal / CUDA source
    "launchers",  # running a printed kernel: host buffers, MLX launches, nvcc, the Metal CPU harness
    "compiler",   # the driver: lowering + passes (+ printers, per target)
    "emit",       # what `compile -o` writes; checks of compiled kernels
    "runtime",    # kernels compiled on first use and cached for the layers
    "layers",     # the MLX API (MarlinLinear, dispatch), activation sparsity, whole models
    "tools",      # the command line, the benchmark runner, the package face
]

#: (module pattern, stage): the first pattern that matches a module's dotted name decides its
#: stage (fnmatch: `*` also crosses dots).
STAGE_RULES: list[tuple[str, str]] = [
    ("marlin_dsl.errors", "base"),
    ("marlin_dsl.source", "base"),
    ("marlin_dsl.lark_errors", "base"),
    ("marlin_dsl.attr_text", "base"),
    ("marlin_dsl.cache", "base"),
    ("marlin_dsl._source_layout", "base"),
    ("marlin_dsl.grammar*", "base"),
    ("marlin_dsl.codegen*", "base"),
    ("marlin_dsl.__version__", "base"),  # `from .. import __version__`: data, not the package face
    ("marlin_dsl.formats*", "formats"),
    ("marlin_dsl.checks.format_check", "formats"),  # a format's self-checks on random data
    ("marlin_dsl.checks", "formats"),  # the face imports nothing (its checks sit at two stages)
    # the sparsify declaration and its numpy semantics: the activation's twin of a format and
    # its reference (the sparse activation layout and the sparsify lowering read them)
    ("marlin_dsl.activation.spec", "formats"),
    ("marlin_dsl.activation.reference", "formats"),
    ("marlin_dsl.layouts*", "layouts"),
    # targets/ after h1's move: printers, launchers and runtimes by module name; the rest
    # (the package face, the Target protocol, each target's description and tables) describes
    ("marlin_dsl.targets.*print*", "printers"),
    ("marlin_dsl.targets.*emit*", "printers"),
    ("marlin_dsl.targets.*launch*", "launchers"),
    ("marlin_dsl.targets.*nvcc*", "launchers"),
    ("marlin_dsl.targets.*nvrtc*", "launchers"),  # compiling printed text for a precompiled launch
    ("marlin_dsl.targets.*harness*", "launchers"),
    ("marlin_dsl.targets.*metal_cpu*", "launchers"),
    ("marlin_dsl.targets.*runtime*", "runtime"),
    ("marlin_dsl.targets.*tuning*", "schedule"),  # tuned schedules per (format, M, K, N)
    ("marlin_dsl.targets.*source*", "printers"),  # what a printer hands back (CudaSource)
    ("marlin_dsl.targets.*ship*", "emit"),  # the files `compile -o` writes for a target
    # the package faces import the printers to register them with their descriptions
    ("marlin_dsl.targets", "printers"),
    ("marlin_dsl.targets.metal", "printers"),
    ("marlin_dsl.targets.cuda", "printers"),
    ("marlin_dsl.targets*", "targets"),
    ("marlin_dsl.ir*", "ir"),
    ("marlin_dsl.schedule*", "schedule"),
    ("marlin_dsl.pipelines*", "schedule"),  # pipeline declarations: fields, checks, warps
    ("marlin_dsl.spec", "schedule"),
    ("marlin_dsl.lowering*", "lowering"),
    ("marlin_dsl.passes*", "passes"),
    # the static cost model: an analysis of the IR after the passes (reads the IR, the format
    # and the schedule; rewrites nothing), below the printers and the command line
    ("marlin_dsl.cost*", "passes"),
    ("marlin_dsl.kernel_args", "launchers"),  # the host side of a kernel, shared by every executor
    ("marlin_dsl.compiler", "compiler"),
    ("marlin_dsl.emit", "emit"),
    ("marlin_dsl.checks.kernel_check", "emit"),
    ("marlin_dsl.checks.error_model", "emit"),
    ("marlin_dsl.checks.gpu_output", "emit"),  # the error model for outputs the bench scripts get  # the tolerances of kernel checks (reads compute_type)
    ("marlin_dsl.layers*", "layers"),
    ("marlin_dsl.nn", "layers"),
    ("marlin_dsl.activation*", "layers"),
    ("marlin_dsl.models*", "layers"),
    ("marlin_dsl.cli*", "tools"),
    ("marlin_dsl.benchmarks*", "tools"),
    ("marlin_dsl.__main__", "tools"),
    ("marlin_dsl", "tools"),  # the package face re-exports every stage
]

#: Names imported from a package face that are data of a lower stage (an edge to
#: `package.name`, classified by STAGE_RULES, instead of to the face).
FACE_DATA = {"marlin_dsl": {"__version__"}}

#: (importer, imported, why): the upward edges that are allowed, each with its reason. Keep it
#: short; an entry that no longer matches an edge fails the test, so the list cannot go stale.
ALLOWED_UPWARD: list[tuple[str, str, str]] = [
]


def stage_of(module: str) -> str:
    """The stage of a dotted module name under STAGE_RULES (KeyError: no rule matches)."""
    for pattern, stage in STAGE_RULES:
        if fnmatch.fnmatchcase(module, pattern):
            return stage
    raise KeyError(module)


def _all_edges() -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import of a marlin_dsl module, relative or
    absolute, at module level or inside a function; the imported end is the most specific
    module or package the statement names (a package's face counts: it is what is imported)."""
    files = {p: _module_name(p) for p in ROOT.rglob("*.py")}
    # grammar/ and codegen/ are installed as marlin_dsl.grammar and marlin_dsl.codegen
    modules = set(files.values()) | {"marlin_dsl.grammar", "marlin_dsl.codegen"}
    edges = []
    for path, name in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                targets = [f"{target}.{alias.name}"
                           if f"{target}.{alias.name}" in modules or alias.name in FACE_DATA.get(target, ())
                           else target for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                while target and target not in modules and not _face_data(target):  # `import a.b.c`
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.append((name, target, node.lineno))
    return sorted(set(edges))


def _face_data(name: str) -> bool:
    package, _, attr = name.rpartition(".")
    return attr in FACE_DATA.get(package, ())


def _upward_edges() -> list[tuple[str, str, int]]:
    rank = {stage: i for i, stage in enumerate(STAGES)}
    return [(a, b, line) for a, b, line in _all_edges() if rank[stage_of(b)] > rank[stage_of(a)]]


def test_every_module_has_a_stage() -> None:
    unclassified = []
    for path in ROOT.rglob("*.py"):
        try:
            stage = stage_of(_module_name(path))
        except KeyError:
            unclassified.append(_module_name(path))
            continue
        assert stage in STAGES, (path, stage)
    assert not unclassified, f"modules no STAGE_RULES pattern matches: {sorted(unclassified)}"


def test_no_upward_imports() -> None:
    allowed = {(a, b) for a, b, _ in ALLOWED_UPWARD}
    bad = [(a, b, line) for a, b, line in _upward_edges() if (a, b) not in allowed]
    assert not bad, "imports from a later stage (importer:line [stage] -> imported [stage]):\n" + "\n".join(
        f"  {a}:{line} [{stage_of(a)}] -> {b} [{stage_of(b)}]" for a, b, line in bad)


def test_every_allowed_upward_import_exists() -> None:
    upward = {(a, b) for a, b, _ in _upward_edges()}
    stale = [(a, b) for a, b, _ in ALLOWED_UPWARD if (a, b) not in upward]
    assert not stale, f"ALLOWED_UPWARD entries that are no longer upward imports: {stale}"
    assert all(reason.strip() for _, _, reason in ALLOWED_UPWARD)


def test_the_stage_rules_read_both_layouts() -> None:
    """Today's modules and the ones issue 14 moves them to land in the same stages."""
    expected = {
        "marlin_dsl.targets": "printers",
        "marlin_dsl.targets.cuda": "printers",
        "marlin_dsl.targets.base": "targets",
        "marlin_dsl.targets.cuda.description": "targets",
        "marlin_dsl.targets.cuda.sparse_layout": "targets",
        "marlin_dsl.targets.cuda.tuning": "schedule",
        "marlin_dsl.targets.cuda.printer": "printers",
        "marlin_dsl.targets.cuda.source": "printers",
        "marlin_dsl.targets.metal.printer": "printers",
        "marlin_dsl.targets.c_printer": "printers",
        "marlin_dsl.targets.cuda.launch": "launchers",
        "marlin_dsl.targets.cuda.nvcc": "launchers",
        "marlin_dsl.targets.cuda.nvrtc": "launchers",
        "marlin_dsl.targets.cuda.launch_precompiled": "launchers",
        "marlin_dsl.targets.cuda.runtime": "runtime",
        "marlin_dsl.targets.metal.launch": "launchers",
        "marlin_dsl.targets.metal.cpu_harness": "launchers",
        "marlin_dsl.targets.metal.ship": "emit",
        "marlin_dsl.pipelines.weight_stream": "schedule",
        "marlin_dsl.layouts.weight_stream": "layouts",
        "marlin_dsl.layouts.sparse_activation": "layouts",
        "marlin_dsl.activation.spec": "formats",
        "marlin_dsl.activation.kernels": "layers",
        "marlin_dsl.checks.format_check": "formats",
        "marlin_dsl.checks.kernel_check": "emit",
        "marlin_dsl.kernel_args": "launchers",
        "marlin_dsl.lowering.parts.shell": "lowering",
        "marlin_dsl.schedule": "schedule",
        "marlin_dsl.__version__": "base",
        "marlin_dsl.ir.interpret.machine": "ir",
        "marlin_dsl.benchmarks.runner": "tools",
    }
    assert {m: stage_of(m) for m in expected} == expected
    rank = {stage: i for i, stage in enumerate(STAGES)}
    assert rank[stage_of("marlin_dsl.passes.fold")] > rank[stage_of("marlin_dsl.ir.ops")]  # ir -> passes is upward
    assert _all_edges(), "no edges read"
    assert ("marlin_dsl.cli.bench", "marlin_dsl.benchmarks", ) in {(a, b) for a, b, _ in _all_edges()}
