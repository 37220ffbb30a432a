"""What one IR op costs a thread: its instruction class, how many instructions, and the bytes
it moves (device memory read, threadgroup/shared memory read and written).

The unit is the IR op as the printers spell it, one op one instruction, before the target's
compiler (Metal's, ptxas) rewrites it: a vector op on vec<f16, 2> (CUDA's half2) is one float
instruction, a fragment load one load, an MMA one MMA. What a printed op cannot cost is free:
`const` (an immediate operand, or hoisted), `bitcast` (a reinterpretation of the same
register), `yield` (the region's end). docs/COST_MODEL.md says why and how far this is from
the machine code (the CUDA anchors there compare it with SASS counts)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompileError
from ..ir.core import Kernel, Op, SharedArray
from ..ir.types import FragmentType, ScalarType, Type, VectorType

#: The instruction classes, in the order reports print them.
CLASSES: tuple[str, ...] = ("int", "float", "cvt", "ld.dev", "ld.shared", "ld.const",
                            "st.shared", "st.dev", "shfl", "mma", "sync", "move", "other")

#: Ops that cost nothing in the printed kernel (see the module docstring).
FREE_OPS = frozenset({"const", "bitcast", "yield"})

_ARITH = frozenset({"add", "sub", "mul", "min", "max", "div", "rem", "fma", "exp2", "recip"})
_BITS = frozenset({"and", "or", "xor", "shl", "shr", "lop3"})
_COMPARE = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
_SYNC = frozenset({"barrier", "fence", "async_commit", "async_wait", "wgmma_fence",
                   "wgmma_commit", "wgmma_wait"})
_MMA = frozenset({"mma", "mma_sp", "wgmma"})
#: Register moves: a vector's lanes, a lane's fragment elements. Apart from the other classes
#: because target compilers mostly fold them into register naming (a B fragment built from two
#: halves of one vload is that vector's word): the CUDA anchors in docs/COST_MODEL.md compare
#: the count without them with SASS.
_MOVES = frozenset({"extract", "vec", "frag_build", "frag_elems", "frag_zero"})
#: Special-register reads (thread index, launch scalars; normally hoisted out of a loop,
#: counted where the IR has them) and branches.
_OTHER = frozenset({"index", "scalar", "if", "switch"})


@dataclass(frozen=True)
class OpCost:
    """One op's cost to one thread (a collective op: to each lane of its warp)."""

    cls: str | None  # one of CLASSES; None for a free op
    count: int = 1
    extra: tuple[tuple[str, int], ...] = ()  # further (class, count) of the same op
    device_read: dict[str, float] | None = None  # buffer -> bytes this thread reads
    shared_read: float = 0.0
    shared_written: float = 0.0


def _elem(t: Type) -> ScalarType:
    if isinstance(t, ScalarType):
        return t
    if isinstance(t, (VectorType, FragmentType)):
        return t.elem
    raise CompileError(f"cost model: no element type in {t}")


def value_bytes(t: Type, warp_size: int = 32) -> float:
    """Bytes of a value of type `t` held by one thread; a fragment's bytes are shared evenly by
    the lanes of its warp (a 16x16 f16 A fragment: 512 bytes, 16 per lane)."""
    if isinstance(t, ScalarType):
        return max(t.bits, 8) / 8
    if isinstance(t, VectorType):
        return t.size * t.elem.bits / 8
    if isinstance(t, FragmentType):
        return t.rows * t.cols * t.elem.bits / 8 / warp_size
    raise CompileError(f"cost model: no size for type {t}")


def _space(kernel: Kernel, name: str) -> str:
    """'shared' or 'device' for the memory an op names."""
    return "shared" if isinstance(kernel.symbol(name), SharedArray) else "device"


def _wgmma_shared_bytes(op: Op, kernel: Kernel) -> float:
    """Shared bytes one lane's share of a warpgroup MMA reads: the warp's B tile (K 16 x N)
    and, where A comes from shared memory, its 16 x 16 rows of A (`smem_a`)."""
    acc = op.operands[2].type
    assert isinstance(acc, FragmentType)
    elem_bytes = _elem(kernel.symbol(str(op.attrs["smem"])).elem).bits / 8  # type: ignore[union-attr]
    tile = 16 * acc.cols + (16 * 16 if "smem_a" in op.attrs else 0)
    return tile * elem_bytes / kernel.warp_size


def _memory_cost(op: Op, kernel: Kernel) -> OpCost:
    """Loads, stores and copies: class by the memory they touch, and their bytes."""
    name = op.name
    if name == "async_copy":  # a device read landing in shared memory: one load instruction
        nbytes = int(op.attrs["size"]) * _elem(kernel.symbol(str(op.attrs["src"])).elem).bits / 8  # type: ignore[union-attr]
        return OpCost("ld.dev", device_read={str(op.attrs["src"]): nbytes}, shared_written=nbytes)
    buffer = str(op.attrs["buffer"])
    space = _space(kernel, buffer)
    if name in ("load", "vload", "frag_load"):
        nbytes = value_bytes(op.result.type, kernel.warp_size)
        if space == "shared":
            return OpCost("ld.shared", shared_read=nbytes)
        return OpCost("ld.dev", device_read={buffer: nbytes})
    # store, vstore, frag_store, atomic_add: the stored value is the operand after the index
    # (frag_store: the fragment comes first)
    stored = op.operands[0] if name == "frag_store" else op.operands[1]
    nbytes = value_bytes(stored.type, kernel.warp_size)
    if space == "shared":
        return OpCost("st.shared", shared_written=nbytes)
    return OpCost("st.dev")  # device writes are outputs, not the weight traffic counted here


def _typed_class(t: Type) -> str:
    """int or float by the element type an arithmetic op works on."""
    elem = _elem(t)
    return "float" if elem.is_float else "int"


def op_cost(op: Op, kernel: Kernel) -> OpCost:
    """The cost of one op to one thread, by the op table's name and the types involved.
    Region ops (`for`, `if`, `switch`) cost their branch here; their bodies are walked by
    the loop counter (`cost/loop.py`)."""
    name = op.name
    if name in FREE_OPS:
        return OpCost(None, 0)
    if name in _ARITH:
        return OpCost(_typed_class(op.result.type))
    if name in _BITS:
        return OpCost("int")
    if name in _COMPARE:
        return OpCost(_typed_class(op.operands[0].type))
    if name == "select":  # a predicated move, of the type it selects
        return OpCost(_typed_class(op.result.type))
    if name == "cast":
        return OpCost("cvt")
    if name in ("load", "vload", "frag_load", "store", "vstore", "frag_store", "atomic_add", "async_copy"):
        return _memory_cost(op, kernel)
    if name == "table":
        return OpCost("ld.const")
    if name == "shfl_xor":  # a lane exchange: a real instruction (CUDA's SHFL), unlike moves
        return OpCost("shfl")
    if name in _MMA:
        shared = _wgmma_shared_bytes(op, kernel) if name == "wgmma" else 0.0
        return OpCost("mma", shared_read=shared)
    if name in _SYNC:
        return OpCost("sync")
    if name in _MOVES:
        return OpCost("move")
    if name in _OTHER:
        return OpCost("other")
    if name == "for":
        # a counted loop's own work per iteration: the counter's add and compare, the branch
        return OpCost("int", 2, extra=(("other", 1),))
    raise CompileError(f"cost model: op {name!r} has no cost class; add it to marlin_dsl/cost/classify.py")
