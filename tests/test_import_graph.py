"""The import graph of the package has no cycles and no upward imports between stages (issues
14 and 31): data flows one way, spec -> lowering -> IR -> passes -> printer -> launcher, and
inside a stage modules import downwards. The stages are data (STAGES, STAGE_RULES by module
pattern, ALLOWED_UPWARD with a reason per edge), so a move changes a table, not the test.

An import is read as Python runs it: importing `a.b.c` executes `a/__init__.py` and
`a/b/__init__.py` before `a/b/c.py`, so it is an edge to each of those package faces as well as
to `a.b.c` (issue 31: `targets.base` was read as a low module, while importing it ran
`targets/__init__.py`, which imports every printer). The faces of the importer's own packages
are left out: they ran before the importer itself. Function-local imports and imports under
TYPE_CHECKING count too (they hide cycles, they do not remove them)."""
from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent / "marlin_dsl"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files() -> dict[Path, str]:
    return {p: _module_name(p) for p in ROOT.rglob("*.py")}


def _graph() -> nx.DiGraph:
    """Every module and package face, an edge per import it executes (see `_all_edges`)."""
    graph = nx.DiGraph()
    graph.add_edges_from((a, b) for a, b, _ in _all_edges())
    return graph


def test_the_graph_is_read() -> None:
    graph = _graph()
    assert graph.number_of_edges() > 100
    assert graph.has_edge("marlin_dsl.lowering.pipelines", "marlin_dsl.lowering.weight_stream")
    # an import of a package's module runs the package's face ...
    assert graph.has_edge("marlin_dsl.lowering.parts.context", "marlin_dsl.machine")
    assert graph.has_edge("marlin_dsl.lowering.parts.context", "marlin_dsl.machine.target")
    # ... but not the faces of the importer's own packages, which ran before it
    assert not graph.has_edge("marlin_dsl.ir.interpret.fragments", "marlin_dsl.ir.interpret")
    assert not graph.has_edge("marlin_dsl.ir.interpret.fragments", "marlin_dsl.ir")
    # nothing in the package names its face, which imports every stage (the version is data
    # of its own, `marlin_dsl._version`)
    assert not any(b == "marlin_dsl" for _, b in graph.edges)


def test_an_import_executes_the_faces_of_its_packages() -> None:
    """The rule the edges follow, and why it matters: before issue 31 the IR's interpreter
    imported `targets.base`, which ran the targets' face and with it every printer."""
    packages = {"marlin_dsl", "marlin_dsl.targets", "marlin_dsl.ir", "marlin_dsl.ir.interpret"}
    assert _executed("marlin_dsl.ir.interpret.fragments", "marlin_dsl.targets.base", packages) == [
        "marlin_dsl.targets", "marlin_dsl.targets.base"]
    assert _executed("marlin_dsl.ir.interpret.fragments", "marlin_dsl.ir.core", packages) == ["marlin_dsl.ir.core"]
    assert _executed("marlin_dsl.targets", "marlin_dsl.targets.base", packages) == ["marlin_dsl.targets.base"]
    rank = {stage: i for i, stage in enumerate(STAGES)}
    assert rank[stage_of("marlin_dsl.targets")] > rank[stage_of("marlin_dsl.ir.interpret.fragments")]


def test_no_import_cycles() -> None:
    cycles = list(nx.simple_cycles(_graph()))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c + [c[0]]) for c in cycles[:10])


# ----- layering: no module imports from a later stage -------------------------------------------

#: The stages, lowest first. Data flows one way (docs/ARCHITECTURE.md): spec -> lowering -> IR
#: -> passes -> printer -> launcher, and the layers users call sit on top. Target descriptions
#: (`marlin_dsl/machine/`) sit below the IR (the verifier and the interpreter read their lane
#: tables), and the IR below the formats (a scale scheme emits its own load and application as IR).
STAGES: list[str] = [
    "base",       # errors, source locations, the build cache, grammars, codegen resources, attribute text
    "machine",    # target descriptions: MMA shapes, lane tables, sparse metadata layout, limits; output names
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
#: stage (fnmatch: `*` also crosses dots). A package's face is a module too (`marlin_dsl.targets`
#: is targets/__init__.py): its stage is that of the highest module it imports.
STAGE_RULES: list[tuple[str, str]] = [
    ("marlin_dsl.errors", "base"),
    ("marlin_dsl.source", "base"),
    ("marlin_dsl.lark_errors", "base"),
    ("marlin_dsl.attr_text", "base"),
    ("marlin_dsl.cache", "base"),
    ("marlin_dsl._source_layout", "base"),
    ("marlin_dsl.grammar*", "base"),
    ("marlin_dsl.codegen*", "base"),
    ("marlin_dsl._version", "base"),  # the version, read below the package face
    # what a target is, as data, and the registry of descriptions (its face fills it)
    ("marlin_dsl.machine*", "machine"),
    # formats/ also holds the sparsify declaration and its numpy semantics (activation_spec,
    # activation_reference): the activation's twin of a format and its reference, which the
    # sparse activation layout and the sparsify lowering read
    ("marlin_dsl.formats*", "formats"),
    ("marlin_dsl.checks.format_check", "formats"),  # a format's self-checks on random data
    ("marlin_dsl.checks", "formats"),  # the face imports nothing (its checks sit at two stages)
    ("marlin_dsl.layouts*", "layouts"),
    # targets/: what makes a target run, above the compiler. Launchers, runtimes, tuned tables
    # and shipping by module name; the rest (the faces, which register the printers, the
    # printer registry `base`, the printers and what they hand back) prints
    ("marlin_dsl.targets.*launch*", "launchers"),
    ("marlin_dsl.targets.*nvcc*", "launchers"),
    ("marlin_dsl.targets.*nvrtc*", "launchers"),  # compiling printed text for a precompiled launch
    ("marlin_dsl.targets.*harness*", "launchers"),
    ("marlin_dsl.targets.*runtime*", "runtime"),
    ("marlin_dsl.targets.*tuning*", "schedule"),  # tuned schedules per (format, M, K, N)
    ("marlin_dsl.targets.*ship*", "emit"),  # the files `compile -o` writes for a target
    ("marlin_dsl.targets*", "printers"),
    ("marlin_dsl.ir*", "ir"),
    ("marlin_dsl.schedule*", "schedule"),
    ("marlin_dsl.pipelines*", "schedule"),  # pipeline declarations: fields, checks, warps
    ("marlin_dsl.spec", "schedule"),
    ("marlin_dsl.epilogue", "schedule"),  # a Gemm's epilogue declaration and its float64 reference
    ("marlin_dsl.lowering*", "lowering"),
    ("marlin_dsl.passes*", "passes"),
    # the static cost model: an analysis of the IR after the passes (reads the IR, the format
    # and the schedule; rewrites nothing), below the printers and the command line
    ("marlin_dsl.cost*", "passes"),
    ("marlin_dsl.kernel_args", "launchers"),  # the host side of a kernel, shared by every executor
    ("marlin_dsl.compiler", "compiler"),
    ("marlin_dsl.emit", "emit"),
    ("marlin_dsl.checks.kernel_check", "emit"),
    ("marlin_dsl.checks.error_model", "emit"),  # the tolerances of kernel checks (reads compute_type)
    ("marlin_dsl.checks.gpu_output", "emit"),  # the error model for outputs the bench scripts get
    ("marlin_dsl.checks.epilogue_check", "emit"),  # the error model carried through an epilogue
    ("marlin_dsl.layers*", "layers"),
    ("marlin_dsl.nn", "layers"),
    ("marlin_dsl.activation*", "layers"),
    ("marlin_dsl.models*", "layers"),
    ("marlin_dsl.cli*", "tools"),
    ("marlin_dsl.benchmarks*", "tools"),
    ("marlin_dsl.__main__", "tools"),
    ("marlin_dsl", "tools"),  # the package face re-exports every stage
]

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


def _executed(importer: str, target: str, packages: set[str]) -> list[str]:
    """The modules that importing `target` from `importer` executes, outermost first: the face
    of every package on `target`'s path that is not one of the importer's own (those ran before
    the importer), then `target` itself (named, even the importer's own face is an edge: a
    module that imports the face that imports it is a cycle)."""
    parts = target.split(".")
    ran = []
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        own = importer == prefix or importer.startswith(prefix + ".")
        if prefix == target or (prefix in packages and not own):
            ran.append(prefix)
    return ran


def _all_edges() -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import of a marlin_dsl module, relative or
    absolute, at module level, under TYPE_CHECKING or inside a function. The imported ends are
    the most specific module or package the statement names and every package face that
    importing it executes (`_executed`)."""
    files = _files()
    # grammar/ and codegen/ are installed as marlin_dsl.grammar and marlin_dsl.codegen
    modules = set(files.values()) | {"marlin_dsl.grammar", "marlin_dsl.codegen"}
    packages = {name for path, name in files.items() if path.name == "__init__.py"}
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
                targets = [f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target
                           for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                while target and target not in modules:  # `import a.b.c`
                    target = target.rpartition(".")[0]
                for ran in _executed(name, target, packages) if target else ():
                    if ran != name:
                        edges.append((name, ran, node.lineno))
    return sorted(set(edges))


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


def test_the_machine_imports_nothing_above_it() -> None:
    """The descriptions are the bottom of the stack: reading one never loads a printer."""
    rank = {stage: i for i, stage in enumerate(STAGES)}
    above = [(a, b) for a, b, _ in _all_edges()
             if a.startswith("marlin_dsl.machine") and rank[stage_of(b)] > rank["machine"]]
    assert not above, above


def test_the_stage_rules_read_both_layouts() -> None:
    """The modules in their places before and after issue 31's move land in the stages they
    should: the descriptions (now `machine/`) at the bottom, what stays in `targets/` above the
    compiler's inputs, so an import of `targets/` from below is upward whatever module it names."""
    expected = {
        "marlin_dsl.machine": "machine",
        "marlin_dsl.machine.target": "machine",
        "marlin_dsl.machine.outputs": "machine",
        "marlin_dsl.machine.cuda": "machine",
        "marlin_dsl.machine.cuda.description": "machine",
        "marlin_dsl.machine.cuda.sparse_layout": "machine",
        "marlin_dsl.machine.cuda.wgmma_layout": "machine",
        "marlin_dsl.machine.metal": "machine",
        "marlin_dsl.targets": "printers",
        "marlin_dsl.targets.base": "printers",  # the printer registry and the runtime protocols
        "marlin_dsl.targets.cuda": "printers",
        "marlin_dsl.targets.metal": "printers",
        "marlin_dsl.targets.cuda.description": "printers",  # before issue 31: its face ran the printers
        "marlin_dsl.targets.cuda.tuning": "schedule",
        "marlin_dsl.targets.cuda.printer": "printers",
        "marlin_dsl.targets.cuda.source": "printers",
        "marlin_dsl.targets.cuda.compact": "printers",
        "marlin_dsl.targets.metal.printer": "printers",
        "marlin_dsl.targets.c_printer": "printers",
        "marlin_dsl.targets.cuda.launch": "launchers",
        "marlin_dsl.targets.cuda.nvcc": "launchers",
        "marlin_dsl.targets.cuda.nvrtc": "launchers",
        "marlin_dsl.targets.cuda.launch_precompiled": "launchers",
        "marlin_dsl.targets.cuda.runtime": "runtime",
        "marlin_dsl.targets.runtimes": "runtime",
        "marlin_dsl.targets.metal.launch": "launchers",
        "marlin_dsl.targets.metal.cpu_harness": "launchers",
        "marlin_dsl.targets.metal.ship": "emit",
        "marlin_dsl.pipelines.weight_stream": "schedule",
        "marlin_dsl.layouts.weight_stream": "layouts",
        "marlin_dsl.layouts.sparse_activation": "layouts",
        "marlin_dsl.activation": "layers",
        "marlin_dsl.formats.activation_spec": "formats",
        "marlin_dsl.activation.kernels": "layers",
        "marlin_dsl.checks.format_check": "formats",
        "marlin_dsl.checks.kernel_check": "emit",
        "marlin_dsl.kernel_args": "launchers",
        "marlin_dsl.lowering.parts.shell": "lowering",
        "marlin_dsl.schedule": "schedule",
        "marlin_dsl._version": "base",
        "marlin_dsl.ir.interpret.machine": "ir",
        "marlin_dsl.benchmarks.runner": "tools",
    }
    assert {m: stage_of(m) for m in expected} == expected
    rank = {stage: i for i, stage in enumerate(STAGES)}
    assert rank[stage_of("marlin_dsl.passes.fold")] > rank[stage_of("marlin_dsl.ir.ops")]  # ir -> passes is upward
    assert rank[stage_of("marlin_dsl.machine.target")] < rank[stage_of("marlin_dsl.ir.verify")]
    assert _all_edges(), "no edges read"
    assert ("marlin_dsl.cli.bench", "marlin_dsl.benchmarks", ) in {(a, b) for a, b, _ in _all_edges()}
