"""Type rules of the tensor-core and asynchronous ops (fragments, MMAs, asynchronous copies,
the warpgroup MMA): each takes (op, kernel) and returns an error message or None. The op table
(`ops.py`) names them; rules that need a target's tables look it up by the kernel's `target`
attribute."""
from __future__ import annotations

from ..machine.target import TARGETS, Target
from .core import BufferParam, Kernel, Op, SharedArray
from .types import BF16, BOOL, F16, F32, U32, FragmentType, ScalarType, VectorType


def _target(kernel: Kernel) -> Target | None:
    """The registered target the kernel is for (its `target` attribute), or None."""
    return TARGETS.get(str(kernel.attrs.get("target")))


def _lane_layout(op: Op, kernel: Kernel, t: FragmentType):
    """(rows, cols) of a fragment's lane table on the kernel's target, or an error message."""
    target = _target(kernel)
    layout = target.lane_elements(t.role, t.rows, t.cols) if target else None
    if layout is None:
        return (f"{op.name} needs the lane layout of {t} on the kernel's target "
                f"{kernel.attrs.get('target')!r}, which declares none")
    return layout


def _frag_build(op: Op, kernel: Kernel) -> str | None:
    t = op.result.type
    if not isinstance(t, FragmentType):
        return "frag_build gives a fragment"
    layout = _lane_layout(op, kernel, t)
    if isinstance(layout, str):
        return layout
    count = 0
    for v in op.operands:
        vt = v.type
        if vt == t.elem:
            count += 1
        elif isinstance(vt, VectorType) and vt.elem == t.elem:
            count += vt.size
        else:
            return f"frag_build of {t} takes {t.elem} scalars or vectors, got {vt}"
    per_lane = layout[0].shape[1]
    return None if count == per_lane else f"a lane holds {per_lane} elements of {t}, got {count}"


def _frag_load(op: Op, kernel: Kernel) -> str | None:
    err = _memory_name(op, kernel)
    t = op.result.type
    if err or not isinstance(t, FragmentType) or t.role not in ("a", "b"):
        return err or "frag_load gives an a or b fragment"
    if kernel.symbol(str(op.attrs["buffer"])).elem != t.elem:  # type: ignore[union-attr]
        return f"frag_load of {t} from a buffer of another element type"
    return None if op.operands[0].type == U32 else "fragment offset must be u32"


def _frag_store(op: Op, kernel: Kernel) -> str | None:
    err = _memory_name(op, kernel)
    t = op.operands[0].type
    if err or not isinstance(t, FragmentType) or t.role != "c":
        return err or "frag_store takes a c fragment"
    decl = kernel.symbol(str(op.attrs["buffer"]))
    if isinstance(decl, BufferParam) and decl.access == "read":
        return f"frag_store to read-only buffer @{decl.name}"
    return None if op.operands[1].type == U32 else "fragment offset must be u32"


def _async_copy(op: Op, kernel: Kernel) -> str | None:
    try:
        dst, src = kernel.symbol(str(op.attrs["dst"])), kernel.symbol(str(op.attrs["src"]))
    except KeyError as e:
        return f"unknown memory @{e.args[0]}"
    if not isinstance(dst, SharedArray):
        return f"async_copy writes a shared array, @{dst.name} is not one"
    if not isinstance(src, BufferParam):
        return f"async_copy reads a device buffer, @{src.name} is not one"
    if dst.elem != src.elem:
        return f"async_copy from @{src.name} ({src.elem}) to @{dst.name} ({dst.elem}): element types differ"
    size = op.attrs["size"]
    if isinstance(size, bool) or not isinstance(size, int) or size * dst.elem.bits not in (32, 64, 128):
        return f"async_copy moves 4, 8 or 16 bytes: size {size!r} of {dst.elem} is not"
    if any(v.type != U32 for v in op.operands[:2]):
        return "async_copy indices (shared, device) must be u32"
    if len(op.operands) > 2 and op.operands[2].type != BOOL:
        return "predicate must be bool"
    return None


def _async_wait(op: Op, _: Kernel) -> str | None:
    n = op.attrs["pending"]
    return None if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 7 else \
        f"async_wait pending must be an integer 0..7, got {n!r}"


def _frag_elems(op: Op, kernel: Kernel) -> str | None:
    t = op.operands[0].type
    if not isinstance(t, FragmentType):
        return "frag_elems takes a fragment"
    layout = _lane_layout(op, kernel, t)
    if isinstance(layout, str):
        return layout
    want = VectorType(t.elem, int(layout[0].shape[1]))
    return None if op.result.type == want else f"frag_elems of {t} gives {want}, not {op.result.type}"


def _shfl_xor(op: Op, kernel: Kernel) -> str | None:
    """A 32-bit value (one register: u32, i32, f32 or a pair of 16-bit floats) and a lane
    mask the warp's lanes are xor-ed with."""
    t = op.operands[0].type
    word = (isinstance(t, ScalarType) and t.bits == 32) or (
        isinstance(t, VectorType) and t.size == 2 and t.elem.name in ("f16", "bf16"))
    if not word:
        return f"shfl_xor moves 32-bit values (u32, i32, f32, vec<f16|bf16, 2>), got {t}"
    if op.result.type != t:
        return f"result type {op.result.type} must be the operand's {t}"
    mask = op.attrs.get("mask")
    if not isinstance(mask, int) or isinstance(mask, bool) or not 0 < mask < 32:
        return f"shfl_xor mask must be an integer in 1..31 (lanes of a 32-lane warp), got {mask!r}"
    return None


def _memory_name(op: Op, kernel: Kernel) -> str | None:
    try:
        decl = kernel.symbol(str(op.attrs["buffer"]))
    except KeyError:
        return f"unknown buffer @{op.attrs['buffer']}"
    return None if isinstance(decl, (BufferParam, SharedArray)) else f"@{decl.name} is not memory"


def _frag_zero(op: Op, _: Kernel) -> str | None:
    t = op.result.type
    return None if isinstance(t, FragmentType) and t.role == "c" else "frag_zero gives a c fragment"


def _mma(op: Op, _: Kernel) -> str | None:
    a, b, c = (v.type for v in op.operands)
    if not (isinstance(a, FragmentType) and isinstance(b, FragmentType) and isinstance(c, FragmentType)):
        return "mma takes fragments"
    if (a.role, b.role, c.role) != ("a", "b", "c"):
        return "mma operands are (a, b, c) fragments"
    if a.cols != b.rows or a.rows != c.rows or b.cols != c.cols or a.elem != b.elem:
        return f"mma shapes do not chain: {a} x {b} + {c}"
    return None if op.result.type == c else "mma result must have the accumulator's type"


def _mma_sp(op: Op, kernel: Kernel) -> str | None:
    a, b, c, meta = (v.type for v in op.operands)
    if not (isinstance(a, FragmentType) and isinstance(b, FragmentType) and isinstance(c, FragmentType)):
        return "mma_sp takes (a, b, c) fragments and a u32 metadata word"
    if (a.role, b.role, c.role) != ("a", "b", "c"):
        return "mma_sp operands are (a, b, c) fragments and a u32 metadata word"
    if meta != U32:
        return f"mma_sp metadata must be u32 (each lane's own word), got {meta}"
    if b.rows != 2 * a.cols or a.rows != c.rows or b.cols != c.cols:
        return f"mma_sp shapes do not chain: compressed {a} (k = 2 x {a.cols}) x {b} + {c}"
    if a.elem != b.elem:
        return f"mma_sp a and b must share one element type, got {a} and {b}"
    if a.elem not in (F16, BF16) or c.elem != F32:
        return f"mma_sp takes f16 or bf16 a and b with an f32 accumulator, got {a}, {b}, {c}"
    selector = op.attrs.get("selector")
    if isinstance(selector, bool) or selector not in (0, 1):
        return f"mma_sp selector must be 0 or 1, got {selector!r}"
    target = _target(kernel)
    shape = (a.rows, b.cols, b.rows)
    if target is None or target.sparse_mma != shape:
        have = target.sparse_mma if target is not None else None
        return (f"mma_sp of shape m{shape[0]}n{shape[1]}k{shape[2]} needs a target with that sparse "
                f"MMA; the kernel's target {kernel.attrs.get('target')!r} has {have}")
    return None if op.result.type == c else "mma_sp result must have the accumulator's type"


# ----- the warpgroup MMA (wgmma) ----------------------------------------------------------------

def _swizzled_array(op: Op, kernel: Kernel, attr: str, elem, target) -> str | None:
    """A shared array the warpgroup MMA reads in swizzled rows: of `elem`, aligned enough."""
    try:
        decl = kernel.symbol(str(op.attrs[attr]))
    except KeyError:
        return f"unknown shared array @{op.attrs[attr]}"
    if not isinstance(decl, SharedArray) or decl.elem != elem:
        return f"wgmma reads {attr} from a shared array of {elem}; @{decl.name} is not one"
    align = target.warpgroup_b_layout.align
    if decl.align < align:
        return f"wgmma reads @{decl.name} in swizzled rows: it must be aligned to {align} bytes, not {decl.align}"
    return None


def _wgmma(op: Op, kernel: Kernel) -> str | None:
    a, off, c = (v.type for v in op.operands[:3])
    target = _target(kernel)
    wg = target.warpgroup_mma if target is not None else None
    if wg is None or target is None or target.warpgroup_b_layout is None:
        return (f"wgmma needs a target with a warpgroup MMA; the kernel's target "
                f"{kernel.attrs.get('target')!r} has none")
    _, max_n, k = wg
    sparse = len(op.operands) == 4
    if sparse != ("selector" in op.attrs):
        return "a sparse wgmma takes both a metadata operand (4th) and a selector; a dense one neither"
    if sparse:
        if target.warpgroup_sparse_k is None or target.sparse_metadata(0) is None:
            return f"sparse wgmma needs a target with the sparse warpgroup MMA; {target.name} has none"
        if op.operands[3].type != U32:
            return f"sparse wgmma metadata must be u32 (each lane's own word), got {op.operands[3].type}"
        selector = op.attrs["selector"]
        if isinstance(selector, bool) or selector not in (0, 1):
            return f"sparse wgmma selector must be 0 or 1, got {selector!r}"
        k = target.warpgroup_sparse_k // 2  # A's compressed columns
    if not (isinstance(c, FragmentType) and c.role == "c" and c.elem == F32 and c.rows == target.mma_m
            and 8 <= c.cols <= max_n and c.cols % 8 == 0):
        return f"wgmma c is this warp's frag<c, f32, {target.mma_m}xN>, N a multiple of 8 up to {max_n}, got {c}"
    if off != U32:
        return f"wgmma b offset (elements of @{op.attrs.get('smem')}) must be u32, got {off}"
    b_elem = kernel.symbol(str(op.attrs["smem"])).elem if str(op.attrs["smem"]) in {
        s.name for s in kernel.shared} else None
    if "smem_a" in op.attrs:  # A from shared memory: operand 0 is the tile's element offset
        if a != U32:
            return f"wgmma with smem_a takes the a tile's element offset (u32), got {a}"
        if b_elem not in (F16, BF16):
            return f"wgmma reads f16 or bf16 operands; @{op.attrs['smem']} holds {b_elem}"
        err = _swizzled_array(op, kernel, "smem_a", b_elem, target)
        if err:
            return err
    elif not (isinstance(a, FragmentType) and a.role == "a" and (a.rows, a.cols) == (target.mma_m, k)
              and a.elem in (F16, BF16)):
        return (f"wgmma a is this warp's frag<a, f16|bf16, {target.mma_m}x{k}> (or smem_a's offset)"
                f"{' (compressed: 2:4)' if sparse else ''}, got {a}")
    else:
        b_elem = a.elem
    err = _swizzled_array(op, kernel, "smem", b_elem, target)
    if err:
        return err
    group = target.warpgroup_warps * kernel.warp_size
    if kernel.threads % group:
        return f"wgmma is issued by warpgroups of {group} threads; the kernel has {kernel.threads}"
    return None if op.result.type == c else "wgmma result must have the accumulator's type"


def _vstore(op: Op, kernel: Kernel) -> str | None:
    try:
        decl = kernel.symbol(str(op.attrs["buffer"]))
    except KeyError:
        return f"unknown buffer @{op.attrs['buffer']}"
    if not isinstance(decl, SharedArray) and getattr(decl, "access", "read") == "read":
        return f"vstore writes shared arrays and device buffers the kernel writes; @{decl.name} is read-only"
    idx, val = op.operands[0].type, op.operands[1].type
    size = op.attrs["size"]
    if idx != U32:
        return "memory index must be u32"
    if val != VectorType(decl.elem, size if isinstance(size, int) else 0) or isinstance(size, bool):
        return f"vstore to @{decl.name} takes vec<{decl.elem}, size={size!r}>, got {val}"
    if size * decl.elem.bits not in (32, 64, 128):
        return f"vstore writes 4, 8 or 16 bytes; size {size} of {decl.elem} is not"
    if len(op.operands) > 2 and op.operands[2].type != BOOL:
        return "predicate must be bool"
    return None


def _wgmma_fence(op: Op, _: Kernel) -> str | None:
    bad = [str(v.type) for v in op.operands if not isinstance(v.type, FragmentType)]
    return f"wgmma_fence fences fragments (registers a wgmma reads), got {bad}" if bad else None


def _wgmma_wait(op: Op, _: Kernel) -> str | None:
    n = op.attrs["pending"]
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 7:
        return f"wgmma_wait pending must be an integer 0..7, got {n!r}"
    bad = [str(v.type) for v in op.operands if not isinstance(v.type, FragmentType) and v.type != U32]
    if bad:
        return (f"wgmma_wait takes fragments (an accumulator, a operands it keeps alive) and u32 "
                f"metadata words it keeps alive, got {bad}")
    if not op.results:
        return None  # retires groups only
    if n != 0:
        return "a wgmma_wait that returns an accumulator waits for every group (pending 0)"
    c = op.operands[0].type if op.operands else None
    if not (isinstance(c, FragmentType) and c.role == "c"):
        return f"wgmma_wait's first operand is the accumulator it makes readable, got {c}"
    return None if op.result.type == c else "wgmma_wait result must have the accumulator's type"


def _in_flight(ops: list[Op]) -> set[int]:
    """Values that may hold a wgmma result still in flight: wgmma results, and the loop
    arguments and results they reach through `for` inits and yields (a fixpoint)."""
    pending: set[int] = {id(o.result) for o in ops if o.name == "wgmma"}
    loops = [o for o in ops if o.name == "for"]
    changed = True
    while changed:
        changed = False
        for loop in loops:
            body = loop.regions[0]
            inits = loop.operands[3:]
            yields = body.ops[-1].operands if body.ops and body.ops[-1].name == "yield" else ()
            for i, arg in enumerate(body.args[1:]):
                hot = id(inits[i]) in pending or (i < len(yields) and id(yields[i]) in pending)
                for v in (arg, loop.results[i]):
                    if hot and id(v) not in pending:
                        pending.add(id(v))
                        changed = True
    return pending


def _sparse_retired_in_block(ops: list[Op]) -> str | None:
    """A sparse wgmma reads its metadata register when it executes, which may be after later
    instructions of its warp ran (seen on the H100: a warp that rewrote the register for the
    next loop step while its wgmmas were queued got its rows wrong). SSA values never change,
    but a loop carries them in the same registers every step, so the rule is structural: in
    the block holding a sparse wgmma, a wgmma_wait with pending 0 follows it."""
    for o in ops:
        for region in o.regions:
            block = region.ops
            for i, op in enumerate(block):
                if op.name != "wgmma" or len(op.operands) != 4:
                    continue
                waits = [(j, w) for j, w in enumerate(block[i + 1:], i + 1) if w.name == "wgmma_wait"]
                retiring = next((j for j, w in waits if w.attrs.get("pending") == 0), None)
                if retiring is None:
                    return (f"sparse wgmma -> %{op.result.name} is not retired (wgmma_wait pending 0) "
                            "in its block: the hardware reads its metadata register when it executes, "
                            "and the next loop step rewrites that register")
                # left in flight by an earlier wait: its metadata word must live (in its
                # register) until the wait that retires it
                early = any(j < retiring for j, _ in waits)
                if early and all(v is not op.operands[3] for v in block[retiring].operands):
                    return (f"sparse wgmma -> %{op.result.name} is left in flight past a wait, but the "
                            f"wait that retires it does not keep its metadata word %{op.operands[3].name} "
                            "alive")
    return None


def warpgroup_chains(ops: list[Op]) -> str | None:
    """The rules that make a wgmma's asynchrony explicit in SSA form, over all ops of a kernel:
    a value that may hold a wgmma's result still in flight (`_in_flight`) is taken only as the
    accumulator of a wgmma or of a wgmma_wait, by a wgmma_fence, or carried by a loop (its
    registers are undefined until a wait retires it); and a wait returning an accumulator keeps
    every register a operand and sparse metadata word of the chain of wgmmas it ends alive
    (the hardware may read them until it completes)."""
    producer = {id(r): o for o in ops for r in o.results}
    message = _sparse_retired_in_block(ops)
    if message:
        return message
    pending = _in_flight(ops)
    for o in ops:
        for i, v in enumerate(o.operands):
            if id(v) not in pending:
                continue
            ok = ((o.name == "wgmma" and i == 2) or (o.name == "wgmma_wait" and i == 0)
                  or o.name in ("wgmma_fence", "yield") or (o.name == "for" and i >= 3))
            if not ok:
                return (f"%{v.name}, the accumulator of a wgmma, is read by {o.name} (operand {i}) "
                        "before a wgmma_wait: its registers are undefined until then")
        if o.name != "wgmma_wait" or not o.results:
            continue
        kept = {id(v) for v in o.operands[1:]}
        src = producer.get(id(o.operands[0]))
        while src is not None and src.name == "wgmma":
            regs = [v for v in (src.operands[0] if "smem_a" not in src.attrs else None,
                                src.operands[3] if len(src.operands) == 4 else None) if v is not None]
            for v in regs:
                if id(v) not in kept:
                    return (f"wgmma_wait -> %{o.result.name} does not keep %{v.name} alive, "
                            f"the register operand of the wgmma giving %{src.result.name}")
            src = producer.get(id(src.operands[2]))
    return None
