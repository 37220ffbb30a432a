"""The numpy IR interpreter: threadgroup semantics, exact arithmetic and the errors it checks."""
from __future__ import annotations

import time

import numpy as np
import pytest

from marlin_dsl.ir.verify import VerifyError

from marlin_dsl.errors import MarlinDSLError
from marlin_dsl.ir import (BF16, F16, F32, I32, U8, U16, U32, Builder, BufferParam, GridDim, Kernel,
                           ScalarParam, SharedArray, Value)
from marlin_dsl.ir.interpret import InterpreterError, launch_size, round_bf16, run_kernel
from marlin_dsl.ir.types import FragmentType, ScalarType


# ----- helpers ------------------------------------------------------------------------------

def _kernel(b: Builder, threads: int, grid=(1, 1, 1), buffers=(), shared=(), scalars=(),
            name: str = "k") -> Kernel:
    dims = tuple(d if isinstance(d, GridDim) else GridDim(None, 1, d) for d in grid)
    return Kernel(name, threads, dims, b.block, buffers=list(buffers),
                  scalars=[ScalarParam(s) for s in scalars], shared=list(shared))


def _for(b: Builder, lb: Value, ub: Value, step: Value, inits: list[Value], body) -> list[Value]:
    """Emit a for loop; body(i, *carried) appends the loop body and returns the next carried."""
    i = b.fresh("i", U32)
    args = [b.fresh("arg", v.type) for v in inits]
    with b.region([i, *args]) as block:
        nxt = body(i, *args)
        b.yield_(*nxt)
    return b.op("for", [lb, ub, step, *inits], [v.type for v in inits], regions=[block]).results


def _if(b: Builder, cond: Value, then, else_, types=()) -> list[Value]:
    regions = []
    for fn in (then, else_):
        with b.region() as block:
            b.yield_(*fn())
        regions.append(block)
    return b.op("if", [cond], list(types), regions=regions).results


def _gid(b: Builder, threads: int) -> Value:
    return b.binary("add", b.binary("mul", b.index("group_x"), threads), b.index("tid"))


# ----- elementwise, tails, predication ------------------------------------------------------

def _axpb_kernel(predicate_load: bool = True) -> Kernel:
    b = Builder()
    n = b.scalar("N")
    gid = _gid(b, 128)
    inside = b.binary("lt", gid, n)
    x = b.load("x", gid, F32, pred=inside if predicate_load else None)
    y = b.value("fma", [x, b.const(2.0, F32), b.const(1.0, F32)], F32)
    b.store("y", gid, y, pred=inside)
    return _kernel(b, 128, (GridDim("N", 128), 1, 1),
                   [BufferParam("x", F32, "read"), BufferParam("y", F32, "write")], scalars=["N"])


def test_elementwise_tail_and_poison():
    k = _axpb_kernel()
    assert launch_size(k, {"N": 300}) == ((3, 1, 1), 128)
    x = np.arange(300, dtype=np.float32) / 7
    y = np.full(384, np.nan, np.float32)
    out = run_kernel(k, {"x": x, "y": y}, {"N": 300})["y"]
    np.testing.assert_array_equal(out[:300], (x * 2 + 1).astype(np.float32))
    assert np.isnan(out[300:]).all(), "elements past N must stay poisoned"
    assert np.isnan(y).all(), "the caller's array is not written"


def test_unpredicated_tail_load_is_out_of_bounds():
    k = _axpb_kernel(predicate_load=False)
    with pytest.raises(InterpreterError) as e:
        run_kernel(k, {"x": np.zeros(300, np.float32), "y": np.zeros(384, np.float32)}, {"N": 300})
    err = e.value
    assert err.kind == "bounds" and err.group == (2, 0, 0) and err.thread == 300 - 256 and err.index == 300
    assert "@x" in str(err) and "%ld0" in str(err) and isinstance(err, MarlinDSLError)


# ----- threadgroup reduction with barriers ------------------------------------------------------

def _reduction_kernel(barriers: bool = True, off_by_one: bool = False,
                      divergent_barrier: bool = False) -> Kernel:
    T = 128
    b = Builder()
    tid = b.index("tid")
    g = b.index("group_x")
    v = b.load("x", b.binary("add", b.binary("mul", g, T), tid), U32)
    b.store("red", b.binary("add", tid, 1) if off_by_one else tid, v)
    if barriers:
        b.barrier()
    stride = T // 2
    while stride >= 1:
        def then(stride=stride):
            lo = b.load("red", tid, U32)
            hi = b.load("red", b.binary("add", tid, stride), U32)
            b.store("red", tid, b.binary("add", lo, hi))
            if divergent_barrier and stride == 4:
                b.barrier()
            return []
        _if(b, b.binary("lt", tid, stride), then, lambda: [])
        if barriers:
            b.barrier()
        stride //= 2

    def write():
        b.store("out", g, b.load("red", b.const(0), U32))
        return []
    _if(b, b.binary("eq", tid, 0), write, lambda: [])
    return _kernel(b, T, (5, 1, 1), [BufferParam("x", U32, "read"), BufferParam("out", U32, "write")],
                   [SharedArray("red", U32, T)])


def test_shared_reduction():
    x = np.random.default_rng(0).integers(0, 2**32, 5 * 128, dtype=np.uint32)
    out = run_kernel(_reduction_kernel(), {"x": x, "out": np.zeros(5, np.uint32)}, {})["out"]
    expect = (x.reshape(5, 128).astype(np.uint64).sum(1) % 2**32).astype(np.uint32)
    np.testing.assert_array_equal(out, expect)


def test_reduction_without_barriers_races():
    x = np.ones(5 * 128, np.uint32)
    with pytest.raises(InterpreterError) as e:
        run_kernel(_reduction_kernel(barriers=False), {"x": x, "out": np.zeros(5, np.uint32)}, {})
    err = e.value
    assert err.kind == "race" and "@red[64]" in str(err)
    # thread 0 reads red[64], written by thread 64 (another warp) with no barrier between
    assert err.thread == 0 and "thread 64" in str(err) and "store[buffer=@red]" in str(err)


def test_reduction_off_by_one_is_out_of_bounds():
    with pytest.raises(InterpreterError) as e:
        run_kernel(_reduction_kernel(off_by_one=True),
                   {"x": np.ones(640, np.uint32), "out": np.zeros(5, np.uint32)}, {})
    assert e.value.kind == "bounds" and e.value.thread == 127 and e.value.index == 128
    assert "@red" in str(e.value)


def test_divergent_barrier():
    with pytest.raises(InterpreterError) as e:
        run_kernel(_reduction_kernel(divergent_barrier=True),
                   {"x": np.ones(640, np.uint32), "out": np.zeros(5, np.uint32)}, {})
    assert e.value.kind == "divergent_barrier" and e.value.thread == 4 and e.value.group == (0, 0, 0)


def test_uninitialised_shared_read():
    b = Builder()
    tid = b.index("tid")
    even = b.binary("eq", b.binary("and", tid, 1), 0)
    b.store("s", tid, tid, pred=even)
    b.barrier()
    b.store("out", tid, b.load("s", tid, U32))
    k = _kernel(b, 64, buffers=[BufferParam("out", U32, "write")], shared=[SharedArray("s", U32, 64)])
    with pytest.raises(InterpreterError) as e:
        run_kernel(k, {"out": np.zeros(64, np.uint32)}, {})
    assert e.value.kind == "uninitialised" and e.value.thread == 1 and e.value.index == 1


def _exchange_kernel(partner_xor: int, scope: str) -> Kernel:
    b = Builder()
    tid = b.index("tid")
    b.store("s", tid, tid)
    b.barrier(scope)
    b.store("out", tid, b.load("s", b.binary("xor", tid, partner_xor), U32))
    return _kernel(b, 64, (2, 1, 1), [BufferParam("out", U32, "write")], [SharedArray("s", U32, 64)])


def test_simdgroup_barrier_orders_only_its_warp():
    out = run_kernel(_exchange_kernel(1, "simdgroup"), {"out": np.zeros(64, np.uint32)}, {})["out"]
    np.testing.assert_array_equal(out, np.arange(64) ^ 1)
    with pytest.raises(InterpreterError) as e:  # partner in the other warp
        run_kernel(_exchange_kernel(32, "simdgroup"), {"out": np.zeros(64, np.uint32)}, {})
    assert e.value.kind == "race" and e.value.thread == 0 and "thread 32" in str(e.value)
    out = run_kernel(_exchange_kernel(32, "threadgroup"), {"out": np.zeros(64, np.uint32)}, {})["out"]
    np.testing.assert_array_equal(out, np.arange(64) ^ 32)


def test_write_after_read_race():
    b = Builder()
    tid = b.index("tid")
    b.store("s", tid, tid)
    b.barrier()
    v = b.load("s", b.binary("xor", tid, 32), U32)
    b.store("s", tid, b.binary("add", v, 1))  # thread 32 overwrites what thread 0 just read
    k = _kernel(b, 64, shared=[SharedArray("s", U32, 64)])
    with pytest.raises(InterpreterError) as e:
        run_kernel(k, {}, {})
    assert e.value.kind == "race" and "after a read by thread" in str(e.value)


# ----- integer and float semantics -----------------------------------------------------------

def test_integer_semantics():
    T = 32
    b = Builder()
    tid = b.index("tid")
    a = b.load("a", tid, U32)
    outs = {
        "add": b.binary("add", a, 0xFFFFFFF0),
        "sub": b.binary("sub", b.const(3), a),
        "mul": b.binary("mul", a, 0x9E3779B9),
        "shl": b.binary("shl", a, 28),
        "shr": b.binary("shr", a, 3),
        "div": b.binary("div", a, 7),
        "rem": b.binary("rem", a, 7),
        "nib": b.binary("and", b.binary("shr", a, b.binary("mul", b.binary("and", tid, 7), 4)), 0xF),
        "u8": b.cast(b.binary("add", b.cast(a, U8), b.const(200, U8)), U32),
        "u16": b.cast(b.binary("mul", b.cast(a, U16), b.const(0x1234, U16)), U32),
        "asr": b.bitcast(b.binary("shr", b.bitcast(a, I32), b.const(4, I32)), U32),
    }
    for i, (name, v) in enumerate(outs.items()):
        b.store("out", b.binary("add", b.binary("mul", tid, len(outs)), i), v)
    # the fp16 magic-number trick: bitcast(0x6400 | n) - 1024 == n for a nibble n
    n16 = b.cast(outs["nib"], U16)
    h = b.binary("sub", b.bitcast(b.binary("or", n16, b.const(0x6400, U16)), F16), b.const(1024.0, F16))
    b.store("h", tid, h)
    k = _kernel(b, T, buffers=[BufferParam("a", U32, "read"), BufferParam("out", U32, "write"),
                               BufferParam("h", F16, "write")])
    a = np.random.default_rng(1).integers(0, 2**32, T, dtype=np.uint32)
    a[:3] = (0, 0xFFFFFFFF, 0x80000000)
    res = run_kernel(k, {"a": a, "out": np.zeros(T * len(outs), np.uint32),
                         "h": np.zeros(T, np.float16)}, {})
    got = res["out"].reshape(T, len(outs))
    a64 = a.astype(np.int64)
    nib = (a64 >> (4 * (np.arange(T) % 8))) & 0xF
    expect = {
        "add": (a64 + 0xFFFFFFF0) % 2**32, "sub": (3 - a64) % 2**32,
        "mul": (a64 * 0x9E3779B9) % 2**32, "shl": (a64 << 28) % 2**32, "shr": a64 >> 3,
        "div": a64 // 7, "rem": a64 % 7, "nib": nib, "u8": ((a64 % 256) + 200) % 256,
        "u16": ((a64 % 65536) * 0x1234) % 65536,
        "asr": (a.view(np.int32).astype(np.int64) >> 4) % 2**32,
    }
    for i, name in enumerate(outs):
        np.testing.assert_array_equal(got[:, i], expect[name], err_msg=name)
    np.testing.assert_array_equal(res["h"], nib.astype(np.float16))


@pytest.mark.parametrize("op,amount,kind", [("shl", 32, "shift"), ("shr", 40, "shift"),
                                            ("div", 0, "division"), ("rem", 0, "division")])
def test_integer_errors(op, amount, kind):
    b = Builder()
    tid = b.index("tid")
    # only thread 5 uses the bad amount: inactive/other lanes must not trigger the error
    amt = b.select(b.binary("eq", tid, 5), b.const(amount), b.const(1))
    b.store("out", tid, b.binary(op, b.binary("add", tid, 1), amt))
    k = _kernel(b, 32, buffers=[BufferParam("out", U32, "write")])
    with pytest.raises(InterpreterError) as e:
        run_kernel(k, {"out": np.zeros(32, np.uint32)}, {})
    assert e.value.kind == kind and e.value.thread == 5 and e.value.result is not None


def test_float_to_int_cast_range():
    def build(to: ScalarType) -> Kernel:
        b = Builder()
        tid = b.index("tid")
        b.store("out", tid, b.cast(b.cast(b.load("x", tid, F32), to), F32))
        return _kernel(b, 32, buffers=[BufferParam("x", F32, "read"), BufferParam("out", F32, "write")])
    x = np.linspace(-3.7, 3.7, 32).astype(np.float32)
    out = run_kernel(build(I32), {"x": x, "out": np.zeros(32, np.float32)}, {})["out"]
    np.testing.assert_array_equal(out, np.trunc(x))  # toward zero
    with pytest.raises(InterpreterError) as e:  # negative to u32
        run_kernel(build(U32), {"x": x, "out": np.zeros(32, np.float32)}, {})
    assert e.value.kind == "cast" and e.value.thread == 0
    x2 = np.zeros(32, np.float32)
    x2[9] = np.nan
    with pytest.raises(InterpreterError) as e:
        run_kernel(build(I32), {"x": x2, "out": np.zeros(32, np.float32)}, {})
    assert e.value.kind == "cast" and e.value.thread == 9


def test_bf16_rounding():
    b = Builder()
    tid = b.index("tid")
    x, y = b.load("x", tid, BF16), b.load("y", tid, BF16)
    b.store("sum", tid, b.binary("add", x, y))
    b.store("prod", tid, b.binary("mul", x, y))
    b.store("conv", tid, b.cast(b.load("f", tid, F32), BF16))
    b.store("fma", tid, b.value("fma", [x, y, x], BF16))
    k = _kernel(b, 32, buffers=[BufferParam(n, BF16 if n not in ("f",) else F32,
                                            "read" if n in "xyf" else "write")
                                for n in ("x", "y", "f", "sum", "prod", "conv", "fma")])
    rng = np.random.default_rng(2)
    x = round_bf16(rng.normal(size=32).astype(np.float32))
    y = round_bf16(rng.normal(size=32).astype(np.float32))
    # ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> even (1); 1 + 3*2^-8 -> 1 + 2^-6
    x[:3], y[:3] = (1.0, 1.0 + 2**-7, 1.0), (2**-8, 2**-8, 2**-8 + 2**-15)
    f = rng.normal(size=32).astype(np.float32)
    f[:4] = (1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -(1 + 2**-8))
    zeros = {n: np.zeros(32, np.float32) for n in ("sum", "prod", "conv", "fma")}
    res = run_kernel(k, {"x": x, "y": y, "f": f, **zeros}, {})

    def rne(v: np.ndarray) -> np.ndarray:  # independent reference: round the f64 value
        v = v.astype(np.float64)
        e = np.floor(np.log2(np.abs(v)))
        q = 2.0 ** (e - 7)
        return (np.round(v / q) * q).astype(np.float32)  # np.round is half-to-even
    np.testing.assert_array_equal(res["sum"], rne(x.astype(np.float32) + y))
    np.testing.assert_array_equal(res["prod"], rne(x.astype(np.float32) * y))
    np.testing.assert_array_equal(res["conv"], rne(f))
    np.testing.assert_array_equal(res["sum"][:3], [1.0, 1 + 2**-6, 1 + 2**-7])
    np.testing.assert_array_equal(res["conv"][:4], [1.0, 1 + 2**-6, 1 + 2**-7, -1.0])
    exact = x.astype(np.float64) * y + x  # exact in float64 for bf16 inputs
    np.testing.assert_array_equal(res["fma"], rne(exact))
    assert (res["fma"].view(np.uint32) & 0xFFFF == 0).all()


def test_fma_rounds_once():
    """a*b + c just below an f32 tie: a float64 sum would round onto the tie and then to even."""
    b = Builder()
    tid = b.index("tid")
    v = b.value("fma", [b.load("a", tid, F32), b.load("b", tid, F32), b.load("c", tid, F32)], F32)
    b.store("out", tid, v)
    k = _kernel(b, 32, buffers=[BufferParam(n, F32, "read") for n in "abc"]
                + [BufferParam("out", F32, "write")])
    a = np.full(32, 2.0**-24 * (1 - 2.0**-23), np.float32)
    bb = np.full(32, 1 + 2.0**-23, np.float32)
    c = np.full(32, 1 + 2.0**-23, np.float32)
    out = run_kernel(k, {"a": a, "b": bb, "c": c, "out": np.zeros(32, np.float32)}, {})["out"]
    naive = np.float32(a[0].astype(np.float64) * bb[0] + c[0])
    assert naive == np.float32(1 + 2.0**-22)  # the double-rounded answer
    np.testing.assert_array_equal(out, np.float32(1 + 2.0**-23))


# ----- fragments ------------------------------------------------------------------------------

def _matmul_kernel(trailing_barrier: bool = True) -> Kernel:
    """C[M,N] (f32) = A[M,K] (f16) @ B[K,N] (f16); a threadgroup of 2 warps computes an 8x16
    tile, each warp an 8x8 block. A's 8x8 block is staged through shared memory each step."""
    b = Builder()
    tid, warp = b.index("tid"), b.index("warp")
    gx, gy = b.index("group_x"), b.index("group_y")
    K, N = b.scalar("K"), b.scalar("N")
    row0 = b.binary("mul", gy, 8)
    col0 = b.binary("add", b.binary("mul", gx, 16), b.binary("mul", warp, 8))
    r, c = b.binary("shr", tid, 3), b.binary("and", tid, 7)
    acc0 = b.value("frag_zero", [], FragmentType("c", F32, 8, 8), hint="acc")

    def body(k, acc):
        src = b.binary("add", b.binary("mul", b.binary("add", row0, r), K), b.binary("add", k, c))
        b.store("a_s", tid, b.load("A", src, F16))
        b.barrier()
        fa = b.value("frag_load", [b.const(0)], FragmentType("a", F16, 8, 8), {"buffer": "a_s", "ld": 8})
        off_b = b.binary("add", b.binary("mul", k, N), col0)
        fb = b.value("frag_load", [off_b], FragmentType("b", F16, 8, 8), {"buffer": "B", "ld": 0})
        if trailing_barrier:
            b.barrier()
        return [b.value("mma", [fa, fb, acc], acc.type)]
    (acc,) = _for(b, b.const(0), K, b.const(8), [acc0], body)
    b.op("frag_store", [acc, b.binary("add", b.binary("mul", row0, N), col0)], attrs={"buffer": "C", "ld": 0})
    return _kernel(b, 64, (GridDim("N", 16), GridDim("M", 8), 1),
                   [BufferParam("A", F16, "read"), BufferParam("B", F16, "read"), BufferParam("C", F32, "write")],
                   [SharedArray("a_s", F16, 64)], scalars=["M", "N", "K"])


def _set_ld(kernel: Kernel, n: int) -> Kernel:
    for op in kernel.walk():
        if op.name in ("frag_load", "frag_store") and op.attrs["buffer"] in ("B", "C"):
            op.attrs["ld"] = n
    return kernel


def test_tiled_matmul_fragments():
    M, N, K = 16, 32, 64
    rng = np.random.default_rng(3)
    A = rng.normal(size=(M, K)).astype(np.float16)
    B = rng.normal(size=(K, N)).astype(np.float16)
    k = _set_ld(_matmul_kernel(), N)
    C = np.full(M * N, np.nan, np.float32)
    out = run_kernel(k, {"A": A.ravel(), "B": B.ravel(), "C": C}, {"M": M, "N": N, "K": K})["C"]
    ref = A.astype(np.float64) @ B.astype(np.float64)
    err = np.abs(out.reshape(M, N) - ref).max() / np.abs(ref).max()
    assert err < 1e-3, err


def test_matmul_without_trailing_barrier_races():
    """The next step's shared store overwrites a tile another warp collectively read."""
    M, N, K = 8, 16, 16
    k = _set_ld(_matmul_kernel(trailing_barrier=False), N)
    with pytest.raises(InterpreterError) as e:
        run_kernel(k, {"A": np.zeros(M * K, np.float16), "B": np.zeros(K * N, np.float16),
                       "C": np.zeros(M * N, np.float32)}, {"M": M, "N": N, "K": K})
    assert e.value.kind == "race" and "frag_load" in str(e.value) and "collective" in str(e.value)


def test_collective_needs_whole_uniform_warp():
    def build(divergent_offset: bool) -> Kernel:
        b = Builder()
        tid = b.index("tid")
        off = b.binary("and", tid, 1) if divergent_offset else b.const(0)

        def then():
            f = b.value("frag_load", [off], FragmentType("a", F16, 8, 8), {"buffer": "A", "ld": 8})
            z = b.value("frag_zero", [], FragmentType("c", F32, 8, 8))
            bf = b.value("frag_load", [b.const(0)], FragmentType("b", F16, 8, 8), {"buffer": "A", "ld": 8})
            b.op("frag_store", [b.value("mma", [f, bf, z], z.type), b.const(0)],
                 attrs={"buffer": "C", "ld": 8})
            return []
        limit = 64 if divergent_offset else 40
        _if(b, b.binary("lt", tid, limit), then, lambda: [])
        return _kernel(b, 64, buffers=[BufferParam("A", F16, "read"), BufferParam("C", F32, "write")])
    bufs = {"A": np.ones(80, np.float16), "C": np.zeros(64, np.float32)}
    with pytest.raises(InterpreterError) as e:
        run_kernel(build(False), bufs, {})  # warp 1 is partially active (lanes 0..7)
    assert e.value.kind == "collective" and e.value.thread == 40 and e.value.warp == 1
    with pytest.raises(InterpreterError) as e:
        run_kernel(build(True), bufs, {})
    assert e.value.kind == "collective" and "offset differs" in str(e.value) and e.value.thread == 1


# ----- control flow --------------------------------------------------------------------------

def test_for_loops_with_dynamic_trip_counts():
    """Per-group trip count from a buffer, a per-thread inner trip count, two carried values."""
    b = Builder()
    tid, g = b.index("tid"), b.index("group_x")
    n = b.load("count", g, U32)

    def outer(i, s, p):
        (inner,) = _for(b, b.const(0), b.binary("rem", tid, 5), b.const(1), [b.const(0)],
                        lambda j, t: [b.binary("add", t, b.binary("add", j, i))])
        return [b.binary("add", s, inner), b.binary("xor", b.binary("mul", p, 31), i)]
    s, p = _for(b, b.const(2), n, b.const(3), [b.const(0), b.const(1)], outer)
    slot = b.binary("add", b.binary("mul", g, 64), tid)
    b.store("s", slot, s)
    b.store("p", slot, p)
    k = _kernel(b, 64, (4, 1, 1), [BufferParam("count", U32, "read"), BufferParam("s", U32, "write"),
                                   BufferParam("p", U32, "write")])
    counts = np.array([0, 2, 9, 40], np.uint32)  # 0 and 2: the loop body never runs
    res = run_kernel(k, {"count": counts, "s": np.zeros(256, np.uint32), "p": np.zeros(256, np.uint32)}, {})
    for grp, cnt in enumerate(counts):
        for t in range(64):
            s_ref, p_ref = 0, 1
            for i in range(2, int(cnt), 3):
                s_ref += sum(j + i for j in range(t % 5))
                p_ref = ((p_ref * 31) % 2**32) ^ i
            assert res["s"][grp * 64 + t] == s_ref and res["p"][grp * 64 + t] == p_ref, (grp, t)


def test_if_and_switch_divergent():
    b = Builder()
    tid = b.index("tid")
    (v,) = _if(b, b.binary("eq", b.binary("rem", tid, 3), 0),
               lambda: [b.binary("mul", tid, 2)], lambda: [b.binary("add", tid, 100)], [U32])
    regions = []
    for case in (0, 2, None):
        with b.region() as block:
            if case == 0:
                b.store("side", tid, b.const(7))  # a store in only one region: predicated
                b.yield_(b.binary("add", v, 1000))
            elif case == 2:
                b.yield_(b.binary("sub", v, 1))
            else:
                b.yield_(b.const(5))
        regions.append(block)
    (w,) = b.op("switch", [b.binary("rem", tid, 4)], [U32], {"cases": (0, 2)}, regions).results
    b.store("out", tid, w)
    k = _kernel(b, 64, (2, 1, 1), [BufferParam("out", U32, "write"), BufferParam("side", U32, "write")])
    res = run_kernel(k, {"out": np.zeros(64, np.uint32), "side": np.full(64, 99, np.uint32)}, {})
    t = np.arange(64)
    v_ref = np.where(t % 3 == 0, t * 2, t + 100)
    w_ref = np.select([t % 4 == 0, t % 4 == 2], [v_ref + 1000, v_ref - 1], 5)
    np.testing.assert_array_equal(res["out"], w_ref)
    np.testing.assert_array_equal(res["side"], np.where(t % 4 == 0, 7, 99))


def test_atomic_add_counter():
    b = Builder()
    tid, g = b.index("tid"), b.index("group_x")
    old = b.value("atomic_add", [b.const(0), b.const(1)], U32, {"buffer": "counter"})
    b.store("order", b.binary("add", b.binary("mul", g, 64), tid), old)
    b.value("atomic_add", [b.binary("rem", tid, 3), tid], U32, {"buffer": "sums"})
    k = _kernel(b, 64, (3, 1, 1), [BufferParam("counter", U32, "readwrite"),
                                   BufferParam("order", U32, "write"), BufferParam("sums", U32, "readwrite")])
    res = run_kernel(k, {"counter": np.array([10], np.uint32), "order": np.zeros(192, np.uint32),
                         "sums": np.array([0, 0, 0xFFFFFFFF], np.uint32)}, {})
    assert res["counter"][0] == 10 + 192
    np.testing.assert_array_equal(res["order"], 10 + np.arange(192))  # (group, thread) order
    t = np.arange(64)
    expect = np.array([3 * t[t % 3 == r].sum() for r in range(3)], np.int64)
    expect[2] += 0xFFFFFFFF
    np.testing.assert_array_equal(res["sums"], expect % 2**32)


def test_store_to_read_only_buffer():
    b = Builder()
    b.store("x", b.index("tid"), b.const(1))
    k = _kernel(b, 32, buffers=[BufferParam("x", U32, "read")])
    # The verifier, which run_kernel runs first, already rejects the store.
    with pytest.raises(VerifyError, match="read-only buffer @x"):
        run_kernel(k, {"x": np.zeros(32, np.uint32)}, {})


# ----- speed ----------------------------------------------------------------------------------

def _dequant_gemm_kernel(k_steps: int) -> Kernel:
    """A Marlin-shaped kernel: a K loop that loads packed int4 weights, dequantises them with the
    0x6400 trick and scales, stages A and B tiles through shared memory and runs 8x8 MMAs. Four
    warps; each warp computes an 8x8 block of the 32-column tile."""
    T = 128
    b = Builder()
    tid, warp = b.index("tid"), b.index("warp")
    gx = b.index("group_x")
    N = b.scalar("N")
    col0 = b.binary("mul", gx, 32)
    acc0 = b.value("frag_zero", [], FragmentType("c", F32, 8, 8), hint="acc")

    def body(k, acc):
        # A tile 8x8 (one f16 per thread for the first 64 threads)
        first = b.binary("lt", tid, 64)
        a_src = b.binary("add", b.binary("mul", b.binary("shr", tid, 3), b.const(8 * k_steps)),
                         b.binary("add", k, b.binary("and", tid, 7)))
        a_val = b.load("A", a_src, F16, pred=first)
        b.store("a_s", b.binary("and", tid, 63), a_val, pred=first)
        # B tile 8 x 32 from packed int4: thread -> (row, 2 columns); one u32 has 8 nibbles
        row, pair = b.binary("shr", tid, 4), b.binary("and", tid, 15)
        word_idx = b.binary("add", b.binary("mul", b.binary("add", k, row), b.binary("shr", N, 3)),
                            b.binary("shr", b.binary("add", col0, b.binary("mul", pair, 2)), 3))
        word = b.load("Bq", word_idx, U32)
        for half in range(2):
            col = b.binary("add", col0, b.binary("add", b.binary("mul", pair, 2), half))
            scale = b.load("S", col, F16)
            shift = b.binary("mul", b.binary("and", b.binary("add", b.binary("mul", pair, 2), half), 7), 4)
            nib = b.cast(b.binary("and", b.binary("shr", word, shift), 0xF), U16)
            h = b.bitcast(b.binary("or", nib, b.const(0x6400, U16)), F16)
            q = b.binary("sub", h, b.const(1032.0, F16))
            w = b.binary("mul", q, scale)
            w = b.value("fma", [w, b.const(1.0, F16), b.const(0.0, F16)], F16)
            for _ in range(60):  # filler arithmetic typical of index math / dequant
                w = b.binary("max", w, b.const(-1e4, F16))
            dst = b.binary("add", b.binary("mul", row, 32), b.binary("add", b.binary("mul", pair, 2), half))
            b.store("b_s", dst, w)
        b.barrier()
        fa = b.value("frag_load", [b.const(0)], FragmentType("a", F16, 8, 8), {"buffer": "a_s", "ld": 8})
        fb = b.value("frag_load", [b.binary("mul", warp, 8)], FragmentType("b", F16, 8, 8),
                     {"buffer": "b_s", "ld": 32})
        b.barrier()
        return [b.value("mma", [fa, fb, acc], acc.type)]
    (acc,) = _for(b, b.const(0), b.const(8 * k_steps), b.const(8), [acc0], body)
    b.op("frag_store", [acc, b.binary("add", col0, b.binary("mul", warp, 8))],
         attrs={"buffer": "C", "ld": 0})
    return _kernel(b, T, (GridDim("N", 32), 1, 1),
                   [BufferParam("A", F16, "read"), BufferParam("Bq", U32, "read"),
                    BufferParam("S", F16, "read"), BufferParam("C", F32, "write")],
                   [SharedArray("a_s", F16, 64), SharedArray("b_s", F16, 256)], scalars=["N"])


def test_speed_of_a_k_loop():
    k_steps, N = 128, 256  # 8 threadgroups of 128 threads, 128 iterations
    K = 8 * k_steps
    kernel = _dequant_gemm_kernel(k_steps)
    for op in kernel.walk():
        if op.name == "frag_store":
            op.attrs["ld"] = N
    n_ops = sum(1 for _ in kernel.walk())
    rng = np.random.default_rng(4)
    A = rng.normal(size=(8, K)).astype(np.float16)
    Bq = rng.integers(0, 2**32, K * N // 8, dtype=np.uint32)
    S = (rng.uniform(0.5, 1.5, N) / 8).astype(np.float16)
    start = time.perf_counter()
    C = run_kernel(kernel, {"A": A.ravel(), "Bq": Bq, "S": S, "C": np.full(8 * N, np.nan, np.float32)},
                   {"N": N})["C"].reshape(8, N)
    elapsed = time.perf_counter() - start
    nib = (Bq.reshape(K, N // 8)[:, :, None] >> (4 * np.arange(8))) & 0xF
    W = ((nib.reshape(K, N).astype(np.float16) - np.float16(8)) * S).astype(np.float16)
    ref = A.astype(np.float64) @ W.astype(np.float64)
    assert np.abs(C - ref).max() / np.abs(ref).max() < 1e-3
    print(f"\n{n_ops} ops in the kernel, {elapsed:.2f}s for 8 groups x 128 threads x {k_steps} iterations")
    assert elapsed < 10
