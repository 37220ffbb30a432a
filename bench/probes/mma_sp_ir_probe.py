"""Check the IR op `mma_sp` end to end on an NVIDIA GPU: IR -> print_cuda -> MLX's CUDA backend.

A hand-built kernel (`build_kernel`, no lowering involved): every lane of every warp loads its
own compressed-A elements, B elements and metadata word from flat buffers, builds fragments
with `frag_build` (B optionally with `frag_load` of the 32x8 tile instead), and runs

    d0 = mma_sp[selector=0](a0, b, 0, meta)      tile 0, metadata in lanes 4g, 4g+1
    d1 = mma_sp[selector=1](a1, b, d0, meta)     tile 1, metadata in lanes 4g+2, 4g+3

so one metadata register carries both tiles (the lanes a selector does not read hold the other
tile's valid metadata, so a wrong lane mapping cannot pass by accident). It stores
y[w*256 : w*256+128] = d0 (16x8 row-major) and y[w*256+128 : w*256+256] = d1 for every warp w.
The buffers come from random 2:4-sparse A0, A1 (16x32) and B (32x8) of small integers via
`marlin_dsl.machine.cuda.sparse_layout`, so A0 @ B and A0 @ B + A1 @ B are exact in f32 and
the check is equality. The interpreter runs the same kernel first (it must agree exactly too).

    PYTHONPATH=/tmp/site:$PWD python3 bench/probes/mma_sp_ir_probe.py            # on the GPU machine
    python3 bench/probes/mma_sp_ir_probe.py --interpret-only                     # anywhere (no MLX)

Prints one PASS/FAIL line per case (f16, bf16) x (B from frag_build, B from frag_load), then
PASS or FAIL. Exit status: 0 all PASS, 1 some FAIL, 2 MLX (with its CUDA backend) unusable.
Needs numpy, marlin_dsl's IR, interpreter and CUDA printer (no networkx, no lark), and MLX.
tests/test_mma_sp.py imports `build_kernel` and `make_case` from here.
"""
from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from marlin_dsl.machine.cuda import sparse_layout as sl  # noqa: E402
from marlin_dsl.targets.cuda.launch import mlx_kernel  # noqa: E402
from marlin_dsl.ir import (BF16, F16, F32, U32, Builder, BufferParam, FragmentType, GridDim,  # noqa: E402
                           Kernel, ScalarParam, VectorType, verify)

#: warps per threadgroup; the launch scalar W (total warps) must be a multiple of it
WARPS = 2
#: y elements per warp: two 16x8 f32 tiles
Y_PER_WARP = 2 * sl.SPARSE_M * sl.SPARSE_N
ELEMS = {"f16": F16, "bf16": BF16}


def build_kernel(elem: str = "f16", b_from: str = "build", name: str | None = None) -> Kernel:
    """The probe kernel for 16-bit type `elem`; B from `frag_build` ("build": per-lane buffer
    like A's) or from `frag_load` ("load": B stored 32x8 row-major per warp)."""
    t = ELEMS[elem]
    frag_a = FragmentType("a", t, 16, 16)
    frag_b = FragmentType("b", t, 32, 8)
    frag_c = FragmentType("c", F32, 16, 8)
    b = Builder()
    lane = b.index("lane")
    gw = b.binary("add", b.binary("mul", b.index("group_x"), WARPS), b.index("warp"), hint="gw")
    gl = b.binary("add", b.binary("mul", gw, 32), lane, hint="gl")  # global lane
    base = b.binary("mul", gl, 8, hint="base")  # this lane's 8 elements

    # compressed A: one 16-byte vector load of the lane's 8 elements
    a_frags = []
    for name_ in ("a0", "a1"):
        v = b.value("vload", [base], VectorType(t, 8), {"buffer": name_, "size": 8}, hint=name_)
        a_frags.append(b.value("frag_build", [v], frag_a, hint="f" + name_))
    if b_from == "build":  # B: four pairs, one 32-bit register each
        pairs = []
        for r in range(4):
            idx = base if r == 0 else b.binary("add", base, 2 * r)
            pairs.append(b.value("vload", [idx], VectorType(t, 2), {"buffer": "b", "size": 2}, hint="bp"))
        fb = b.value("frag_build", pairs, frag_b, hint="fb")
    elif b_from == "load":
        fb = b.value("frag_load", [b.binary("mul", gw, 256)], frag_b, {"buffer": "b", "ld": 8}, hint="fb")
    else:
        raise ValueError(f"b_from must be 'build' or 'load', not {b_from!r}")
    meta = b.load("meta", gl, U32, hint="meta")
    zero = b.value("frag_zero", [], frag_c, hint="acc")
    d0 = b.value("mma_sp", [a_frags[0], fb, zero, meta], frag_c, {"selector": 0}, hint="d")
    d1 = b.value("mma_sp", [a_frags[1], fb, d0, meta], frag_c, {"selector": 1}, hint="d")
    y0 = b.binary("mul", gw, Y_PER_WARP, hint="yo")
    b.op("frag_store", [d0, y0], attrs={"buffer": "y", "ld": 8})
    b.op("frag_store", [d1, b.binary("add", y0, Y_PER_WARP // 2)], attrs={"buffer": "y", "ld": 8})
    kernel = Kernel(name or f"mma_sp_probe_{elem}_{b_from}", WARPS * 32, (GridDim("W", WARPS), GridDim(None),
                    GridDim(None)), b.block,
                    buffers=[BufferParam("a0", t, "read"), BufferParam("a1", t, "read"),
                             BufferParam("b", t, "read"), BufferParam("meta", U32, "read"),
                             BufferParam("y", F32, "write")],
                    scalars=[ScalarParam("W")], attrs={"target": "cuda"})
    verify(kernel)
    return kernel


def make_case(rng: np.random.Generator, warps: int, b_from: str = "build"):
    """(buffers, scalars, expected y) for `warps` warps in all: numpy float32 for the 16-bit
    buffers (exact small integers), u32 metadata; expected y is float32."""
    if warps % WARPS:
        raise ValueError(f"warps must be a multiple of {WARPS}")
    a0s, a1s, bs, metas, ys = [], [], [], [], []
    for _ in range(warps):
        a0, a1 = sl.random_2of4(rng), sl.random_2of4(rng)
        bm = rng.integers(-4, 5, size=(sl.SPARSE_K, sl.SPARSE_N)).astype(np.float64)
        v0, p0 = sl.compress_2of4(a0)
        v1, p1 = sl.compress_2of4(a1)
        a0s.append(sl.a_lane_values(v0).ravel())
        a1s.append(sl.a_lane_values(v1).ravel())
        bs.append(sl.b_lane_values(bm).ravel() if b_from == "build" else bm.ravel())
        metas.append(sl.pack_metadata_pair(p0, p1))
        d0 = a0 @ bm
        ys.append(np.concatenate([d0.ravel(), (d0 + a1 @ bm).ravel()]))
    buffers = {"a0": np.concatenate(a0s).astype(np.float32), "a1": np.concatenate(a1s).astype(np.float32),
               "b": np.concatenate(bs).astype(np.float32), "meta": np.concatenate(metas).astype(np.uint32),
               "y": np.full(warps * Y_PER_WARP, np.nan, np.float32)}
    return buffers, {"W": warps}, np.concatenate(ys).astype(np.float32)


def run_interpreter(kernel: Kernel, buffers: dict, scalars: dict) -> np.ndarray:
    from marlin_dsl.ir.interpret import run_kernel

    ins = dict(buffers)
    elem = kernel.symbol("a0").elem
    if elem == F16:
        ins = {k: (v.astype(np.float16) if k in ("a0", "a1", "b") else v) for k, v in ins.items()}
    return run_kernel(kernel, ins, scalars)["y"]


def run_mlx(kernel: Kernel, buffers: dict, scalars: dict) -> np.ndarray:
    """Print the kernel for CUDA and launch it with `mx.fast.cuda_kernel`; y as float32."""
    import mlx.core as mx

    from marlin_dsl.targets.cuda.printer import print_cuda

    src = print_cuda(kernel)
    kern = mlx_kernel(src, name=f"{src.name}_{src.digest[:12]}")
    dtype = {"f16": mx.float16, "bf16": mx.bfloat16, "u32": mx.uint32, "f32": mx.float32}
    inputs = []
    for n in src.input_names:
        if n == "dims":
            inputs.append(mx.array(src.dims(scalars)))
        else:
            inputs.append(mx.array(buffers[n]).astype(dtype[src.elems[n]]))
    grid, threadgroup = src.launch_dims(scalars)
    (y,) = kern(inputs=inputs, output_shapes=[buffers["y"].shape], output_dtypes=[mx.float32],
                grid=grid, threadgroup=threadgroup, init_value=float("nan"))
    mx.eval(y)
    return np.array(y)


def _compare(name: str, got: np.ndarray, want: np.ndarray) -> tuple[bool, str]:
    if got.shape != want.shape:
        return False, f"{name}: shape {got.shape}, expected {want.shape}"
    bad = ~(got == want)
    if not bad.any():
        return True, f"{name}: exact ({want.size} values)"
    i = int(np.argmax(bad))
    warp, rest = divmod(i, Y_PER_WARP)
    tile, rc = divmod(rest, Y_PER_WARP // 2)
    return False, (f"{name}: {int(bad.sum())} of {want.size} differ; first: warp {warp} tile {tile} "
                   f"row {rc // 8} col {rc % 8}: got {got[i]!r}, expected {want[i]!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warps", type=int, default=8, help="warps in all (a multiple of %d)" % WARPS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--interpret-only", action="store_true", help="no MLX: the interpreter only")
    args = ap.parse_args(argv)
    if not args.interpret_only:
        try:
            import mlx.core as mx

            cuda = getattr(mx, "cuda", None)
            if cuda is not None and not cuda.is_available():
                print("MLX has no CUDA backend here (mx.cuda.is_available() is False)")
                return 2
        except Exception as exc:  # noqa: BLE001
            print(f"MLX with its CUDA backend is needed ({exc!r}); --interpret-only runs without it")
            return 2
    rng = np.random.default_rng(args.seed)
    ok_all = True
    for elem in ("f16", "bf16"):
        for b_from in ("build", "load"):
            case = f"{elem} B-{b_from}"
            try:
                kernel = build_kernel(elem, b_from)
                buffers, scalars, want = make_case(rng, args.warps, b_from)
                ok, msg = _compare("interpreter", run_interpreter(kernel, buffers, scalars), want)
                lines = [msg]
                if not args.interpret_only:
                    ok_gpu, msg = _compare("gpu", run_mlx(kernel, buffers, scalars), want)
                    ok, lines = ok and ok_gpu, lines + [msg]
            except Exception:  # noqa: BLE001
                ok, lines = False, ["error:\n" + traceback.format_exc()]
            ok_all &= ok
            print(f"{'PASS' if ok else 'FAIL'} {case}: " + "; ".join(lines), flush=True)
    print("PASS" if ok_all else "FAIL")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
