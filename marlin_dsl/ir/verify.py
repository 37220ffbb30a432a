"""The IR verifier, run after every pass: SSA scoping, op arity, attributes and types; and
the check that a kernel uses only a target's legal ops, run before printing."""
from __future__ import annotations

from collections.abc import Collection, Iterator

from ..errors import CompileError, MarlinDSLError
from .core import Block, Kernel, Op, Value
from .ops import OPS
from .tensor_rules import warpgroup_chains
from .types import FragmentType


class VerifyError(MarlinDSLError):
    """The IR is malformed; the message names the kernel, the op and what is wrong."""


def verify(kernel: Kernel) -> None:
    """Raise VerifyError at the first problem found."""
    names: set[str] = set()
    _check_decls(kernel)
    _verify_block(kernel, kernel.body, visible=set(), names=names, top=True)
    if any(op.name == "wgmma" for op in kernel.walk()):
        message = warpgroup_chains(list(kernel.walk()))
        if message:
            raise VerifyError(f"kernel {kernel.name}: {message}")


def _check_decls(kernel: Kernel) -> None:
    seen: set[str] = set()
    for decl in (*kernel.buffers, *kernel.scalars, *kernel.shared, *kernel.tables):
        if decl.name in seen:
            raise VerifyError(f"kernel {kernel.name}: symbol @{decl.name} declared twice")
        seen.add(decl.name)
    if not 1 <= kernel.threads <= 1024 or kernel.threads % kernel.warp_size:
        raise VerifyError(f"kernel {kernel.name}: threads {kernel.threads} must be a multiple "
                          f"of the warp size {kernel.warp_size} in 1..1024")
    for arr in kernel.shared:
        if arr.align < 16 or arr.align & (arr.align - 1):
            raise VerifyError(f"kernel {kernel.name}: shared @{arr.name} align {arr.align} must be a "
                              "power of two of at least 16 bytes")
    for decl in kernel.buffers:
        if decl.access not in ("read", "write", "readwrite"):
            raise VerifyError(f"kernel {kernel.name}: buffer @{decl.name} access must be read, "
                              f"write or readwrite, got {decl.access!r}")
    scalars = {s.name for s in kernel.scalars}
    for dim in kernel.grid:
        if dim.symbol is not None and dim.symbol not in scalars:
            raise VerifyError(f"kernel {kernel.name}: grid uses undeclared scalar {dim.symbol!r}")


def _verify_block(kernel: Kernel, block: Block, visible: set[int], names: set[str], top: bool) -> None:
    scope = set(visible)
    for arg in block.args:
        _define(kernel, arg, names, None)
        scope.add(id(arg))
    for i, op in enumerate(block.ops):
        where = f"kernel {kernel.name}: op {i} ({op.name}"
        where += f" -> %{op.results[0].name})" if op.results else ")"
        definition = OPS.get(op.name)
        if definition is None:
            raise VerifyError(f"{where}: unknown op {op.name!r}")
        for v in op.operands:
            if id(v) not in scope:
                raise VerifyError(f"{where}: operand %{v.name} is not defined before its use")
        lo, hi = definition.operands
        if len(op.operands) < lo or (hi is not None and len(op.operands) > hi):
            raise VerifyError(f"{where}: takes {lo}..{hi if hi is not None else 'n'} operands, "
                              f"got {len(op.operands)}")
        rlo, rhi = definition.results
        if len(op.results) < rlo or (rhi is not None and len(op.results) > rhi):
            raise VerifyError(f"{where}: gives {rlo}..{rhi if rhi is not None else 'n'} results, "
                              f"got {len(op.results)}")
        missing = [a for a in definition.attrs if a not in op.attrs]
        unknown = [a for a in op.attrs if a not in definition.attrs + definition.optional_attrs]
        if missing or unknown:
            raise VerifyError(f"{where}: missing attributes {missing}, unknown {unknown}")
        if op.name not in ("switch", "warp_roles") and len(op.regions) != definition.regions:
            raise VerifyError(f"{where}: needs {definition.regions} regions, has {len(op.regions)}")
        if definition.terminator and i != len(block.ops) - 1:
            raise VerifyError(f"{where}: yield must end its block")
        if top and definition.terminator:
            raise VerifyError(f"{where}: the kernel body has no yield")
        if definition.rule is not None:
            message = definition.rule(op, kernel)
            if message:
                raise VerifyError(f"{where}: {message}")
        if op.name in ("frag_zero", "frag_load", "mma") and not isinstance(op.result.type, FragmentType):
            raise VerifyError(f"{where}: must give a fragment")
        for region in op.regions:
            _verify_block(kernel, region, scope, names, top=False)
        for r in op.results:
            _define(kernel, r, names, where)
            scope.add(id(r))


def _define(kernel: Kernel, v: Value, names: set[str], where: str | None) -> None:
    if v.name in names:
        raise VerifyError(f"kernel {kernel.name}: value %{v.name} defined twice"
                          + (f" ({where})" if where else ""))
    names.add(v.name)


def verify_legal(kernel: Kernel, legal_ops: Collection[str], target_name: str) -> None:
    """Raise CompileError naming the first op of `kernel` that `target_name` cannot print (one
    not in `legal_ops`, the keys of the target's printer table) and where it is, so a kernel
    is refused before printing starts rather than half-way through."""
    for path, op in _walk(kernel.body, ""):
        if op.name not in legal_ops:
            result = f" -> %{op.results[0].name}" if op.results else ""
            raise CompileError(f"{target_name}: kernel {kernel.name}: {path} ({op.name}{result}): "
                               f"op {op.name} is not legal on {target_name} (its printer has no entry for it)")


def _walk(block: Block, prefix: str) -> Iterator[tuple[str, Op]]:
    """(position, op) for every op, preorder; a position reads `op 3, region 0, op 1`."""
    for i, op in enumerate(block.ops):
        here = f"{prefix}op {i}"
        yield here, op
        for r, region in enumerate(op.regions):
            yield from _walk(region, f"{here}, region {r}, ")
