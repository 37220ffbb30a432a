"""The CUDA CPU shim's number formats (codegen/cuda_shim_half.h): every conversion and 16-bit
intrinsic the printed kernels call, built into a small program with g++ and compared with
numpy and with exact rational arithmetic (fractions): round to nearest even, one rounding for
fma and for integer conversions, the saturating float -> int conversions, NaN rules."""
from __future__ import annotations

import subprocess
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from marlin_dsl.ir.numerics import f64_to_f32_odd, round_bf16, round_to_activation
from marlin_dsl.targets.cuda.cpu_harness import find_compiler

CXX = find_compiler()
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler (g++ / $CXX) to build the CUDA shim")
CODEGEN = Path(__file__).resolve().parents[1] / "codegen"

#: op -> C++ body computing `uint32_t r` from the record's words x, y, z.
OPS = {
    "f2h": "r = __half_as_ushort(__float2half_rn(__uint_as_float(x)));",
    "f2bf": "r = __bfloat16_as_ushort(__float2bfloat16_rn(__uint_as_float(x)));",
    "h2f": "r = __float_as_uint(__half2float(__ushort_as_half((unsigned short)x)));",
    "bf2f": "r = __float_as_uint(__bfloat162float(__ushort_as_bfloat16((unsigned short)x)));",
    "i2h": "r = __half_as_ushort(__int2half_rn((int)x));",
    "u2h": "r = __half_as_ushort(__uint2half_rn(x));",
    "i2bf": "r = __bfloat16_as_ushort(__int2bfloat16_rn((int)x));",
    "u2bf": "r = __bfloat16_as_ushort(__uint2bfloat16_rn(x));",
    "u2f": "r = __float_as_uint(__uint2float_rn(x));",
    "f2i": "r = (uint32_t)__float2int_rz(__uint_as_float(x));",
    "f2u": "r = __float2uint_rz(__uint_as_float(x));",
    **{f"{op}2_{t}": f"{{ {P} a, b; std::memcpy(&a, &x, 4); std::memcpy(&b, &y, 4); {P} d = __{op}2(a, b); "
                     f"std::memcpy(&r, &d, 4); }}"
       for t, P in (("h", "__half2"), ("bf", "__nv_bfloat162")) for op in ("hadd", "hsub", "hmul", "hmin", "hmax")},
    **{f"hfma2_{t}": f"{{ {P} a, b, c; std::memcpy(&a, &x, 4); std::memcpy(&b, &y, 4); std::memcpy(&c, &z, 4); "
                     f"{P} d = __hfma2(a, b, c); std::memcpy(&r, &d, 4); }}"
       for t, P in (("h", "__half2"), ("bf", "__nv_bfloat162"))},
    "hneu": "r = __hneu(__ushort_as_half((unsigned short)x), __ushort_as_half((unsigned short)y));",
    "hlt": "r = __hlt(__ushort_as_half((unsigned short)x), __ushort_as_half((unsigned short)y));",
}


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    """run(op, x, y=0, z=0) -> uint32 results, from a program built against the shim."""
    d = tmp_path_factory.mktemp("cuda_shim")
    cases = "\n".join(f'    if (op == "{k}") {v}' for k, v in OPS.items())
    (d / "t.cpp").write_text(f"""#include <cstdio>
#include <string>
#include <vector>
#include "cuda_shim_half.h"
int main(int argc, char** argv) {{
  std::string op = argv[1];
  FILE* in = std::fopen(argv[2], "rb");
  std::vector<uint32_t> w;
  uint32_t v;
  while (std::fread(&v, 4, 1, in) == 1) w.push_back(v);
  std::fclose(in);
  FILE* out = std::fopen(argv[3], "wb");
  for (size_t i = 0; i + 2 < w.size(); i += 3) {{
    uint32_t x = w[i], y = w[i + 1], z = w[i + 2], r = 0;
{cases}
    std::fwrite(&r, 4, 1, out);
  }}
  std::fclose(out);
}}
""")
    flags = ["-std=c++20", "-O1", "-ffp-contract=off", "-fno-fast-math"]
    proc = subprocess.run([CXX, *flags, f"-I{CODEGEN}", "-o", str(d / "t"), str(d / "t.cpp")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]

    def run(op: str, x, y=0, z=0) -> np.ndarray:
        """x: float32 (passed as its bits) or unsigned words; y, z: words."""
        x = np.asarray(x)
        x = x.view(np.uint32) if x.dtype == np.float32 else x.astype(np.uint32)
        words = np.stack(np.broadcast_arrays(x, np.asarray(y, np.uint32), np.asarray(z, np.uint32)), axis=-1)
        words.tofile(d / "in.bin")
        subprocess.run([str(d / "t"), op, str(d / "in.bin"), str(d / "out.bin")], check=True)
        return np.fromfile(d / "out.bin", dtype=np.uint32)

    return run


RNG = np.random.default_rng(17)


def _floats(n: int) -> np.ndarray:
    """float32 values over the f16/bf16 ranges, ties, subnormals, overflow, NaN and infinities."""
    mags = np.exp2(RNG.uniform(-30, 20, n)).astype(np.float32) * RNG.choice([-1, 1], n).astype(np.float32)
    halves = np.arange(0, 0x7C00, 7, dtype=np.uint16).view(np.float16).astype(np.float32)
    ties = (halves[:-1] + halves[1:]) / 2  # exact midpoints between halves (in float32)
    special = np.array([0.0, -0.0, 65504, 65519.99, 65520, 1e9, np.inf, -np.inf, np.nan, 2 ** -25, 2 ** -24 * 1.5],
                       np.float32)
    return np.concatenate([mags, ties, special]).astype(np.float32)


def _bits16(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, np.float16).view(np.uint16).astype(np.uint32)


def _same(got_bits: np.ndarray, want_bits: np.ndarray, width: int = 16) -> None:
    """Bit equality, any NaN equal to any NaN."""
    if width == 16:
        nan_g, nan_w = (got_bits & 0x7FFF) > 0x7C00, (want_bits & 0x7FFF) > 0x7C00
    else:
        nan_g, nan_w = (got_bits & 0x7FFF) > 0x7F80, (want_bits & 0x7FFF) > 0x7F80
    ok = (got_bits == want_bits) | (nan_g & nan_w)
    assert ok.all(), f"{int((~ok).sum())} differ, first at {int(np.argmin(ok))}: {got_bits[~ok][:4]} vs {want_bits[~ok][:4]}"


def test_float_to_half_and_bf16(shim) -> None:
    x = _floats(20000)
    with np.errstate(over="ignore"):
        _same(shim("f2h", x), _bits16(x.astype(np.float16)))
    want_bf = round_to_activation(x, "bf16").astype(np.float32).view(np.uint32) >> 16
    _same(shim("f2bf", x), want_bf, width=8)
    every = np.arange(65536, dtype=np.uint32)
    got = shim("h2f", every).view(np.float32)
    want = every.astype(np.uint16).view(np.float16).astype(np.float32)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(shim("bf2f", every), every << 16)


def _round_exact(q: Fraction, kind: str) -> int:
    """The 16-bit pattern nearest to the rational q (ties to even), by exact comparison; an
    exact zero is +0 (IEEE round to nearest: x + (-x) = +0)."""
    if q == 0:
        return 0
    if kind == "h":
        h = np.float16(float(q))
        cands = [h, np.nextafter(h, np.float16(np.inf)), np.nextafter(h, np.float16(-np.inf))]
        bits = [int(np.array(c, np.float16).view(np.uint16)) for c in cands if np.isfinite(c)]
        value = {b: Fraction(float(np.array(b, np.uint16).view(np.float16))) for b in bits}
    else:
        b0 = int(np.array(float(q), np.float32).view(np.uint32)) >> 16  # truncated: q lies above it
        bits = [b for b in (b0 - 1, b0, b0 + 1, b0 + 2) if b >> 15 == b0 >> 15 and (b & 0x7FFF) < 0x7F80]
        value = {b: Fraction(float(np.array(b << 16, np.uint32).view(np.float32))) for b in bits}
    best = min(bits, key=lambda b: (abs(value[b] - q), b & 1))
    return best


def _to_f(bits: int, kind: str) -> Fraction:
    if kind == "h":
        return Fraction(float(np.array(bits, np.uint16).view(np.float16)))
    return Fraction(float(np.array(bits << 16, np.uint32).view(np.float32)))


def _double_rounding_traps(kind: str, count: int = 64) -> np.ndarray:
    """[3, count] bits of f16 (a, b, c) where a * b + c rounded to float32 first and then to
    f16 differs from rounding it once (what a naive fma gets wrong): every pair of mantissas in
    [1, 2) with c = +-2^12, 2^11; the sums are exact in double. (bf16 has no such cases: its
    16-bit products fit in float32 beside any c they can round with.)"""
    one, cs = 0x3C00, (0x6C00, 0xEC00, 0x6800)
    m = np.arange(2 ** 10, dtype=np.uint32) | one
    a, b = (x.ravel() for x in np.meshgrid(m, m, indexing="ij"))
    found = []
    for c in cs:
        c_bits = np.full_like(a, c)
        exact = _value(a, kind) * _value(b, kind) + _value(c_bits, kind)  # float64, exact
        once, twice = _round16(exact, kind), _round16(exact.astype(np.float32).astype(np.float64), kind)
        hit = np.nonzero(once != twice)[0][:count // len(cs)]
        found.append(np.stack([a[hit], b[hit], c_bits[hit]]))
    traps = np.concatenate(found, axis=1)
    assert traps.shape[1] >= 8, "the search for double-rounding cases found too few"
    return traps


def _value(bits: np.ndarray, kind: str) -> np.ndarray:
    if kind == "h":
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _round16(x: np.ndarray, kind: str) -> np.ndarray:
    """float64 -> 16-bit pattern, one rounding (numpy converts double to half directly)."""
    if kind == "h":
        return x.astype(np.float16).view(np.uint16).astype(np.uint32)
    return round_bf16(f64_to_f32_odd(x)).astype(np.float32).view(np.uint32) >> 16


@pytest.mark.parametrize("kind", ["h", "bf"])
def test_pair_arithmetic_rounds_once(shim, kind: str) -> None:
    n = 3000
    exps = RNG.integers(-12, 8, size=(3, n)) if kind == "h" else RNG.integers(-40, 40, size=(3, n))
    vals = RNG.uniform(1, 2, size=(3, n)) * np.exp2(exps) * RNG.choice([-1, 1], size=(3, n))
    if kind == "h":
        bits = _bits16(vals.astype(np.float16))
    else:
        bits = round_to_activation(vals.astype(np.float32), "bf16").astype(np.float32).view(np.uint32) >> 16
    bits[2, : n // 4] = bits[0, : n // 4] ^ 0x8000  # c = -a (cancellation: a * b + c near a (b - 1))
    if kind == "h":
        bits = np.concatenate([bits, _double_rounding_traps(kind)], axis=1)
        n = bits.shape[1] - bits.shape[1] % 2
        bits = bits[:, :n]
    words = (bits[:, 0::2] | (bits[:, 1::2] << 16)).astype(np.uint32)  # pairs: (even, odd) elements
    exact = {"hadd": lambda a, b, c: a + b, "hsub": lambda a, b, c: a - b, "hmul": lambda a, b, c: a * b,
             "hfma": lambda a, b, c: a * b + c}
    for op, f in exact.items():
        got = shim(f"{op}2_{kind}", words[0], words[1], words[2])
        got16 = np.stack([got & 0xFFFF, got >> 16], axis=-1).reshape(-1)
        want = [_round_exact(f(*(_to_f(int(bits[r, i]), kind) for r in range(3))), kind) for i in range(n)]
        assert np.array_equal(got16, np.array(want, np.uint32)), op


def test_integer_conversions_round_once(shim) -> None:
    ints = np.concatenate([RNG.integers(-2 ** 31, 2 ** 31, 3000), np.arange(-70000, 70000, 97),
                           [2 ** 24 + 1, 2 ** 25 + 2 ** 17 + 1, 2 ** 31 - 1, -2 ** 31, 65519, 65520, 2049]])
    u = ints.astype(np.int64) & 0xFFFFFFFF
    for op, vals, kind in (("i2h", ints, "h"), ("u2h", u, "h"), ("i2bf", ints, "bf"), ("u2bf", u, "bf")):
        got = shim(op, (vals.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32))
        if kind == "h":  # numpy converts an int64 to double (exact here) and rounds once
            with np.errstate(over="ignore"):
                want = _bits16(vals.astype(np.float64).astype(np.float16))
        else:
            want = np.array([_round_exact(Fraction(int(v)), "bf") for v in vals], np.uint32)
        _same(got, want, 16 if kind == "h" else 8)
    assert np.array_equal(shim("u2f", u.astype(np.uint32)).view(np.float32), u.astype(np.float64).astype(np.float32))


def test_float_to_int_truncates_and_saturates(shim) -> None:
    x = np.array([1.9, -1.9, 0.5, -0.0, 3e9, -3e9, np.inf, -np.inf, np.nan, 2 ** 31, 4e9, 5e9, -1.0], np.float32)
    assert shim("f2i", x).view(np.int32).tolist() == [1, -1, 0, 0, 2 ** 31 - 1, -2 ** 31, 2 ** 31 - 1, -2 ** 31, 0,
                                                       2 ** 31 - 1, 2 ** 31 - 1, 2 ** 31 - 1, -1]
    assert shim("f2u", x).tolist() == [1, 0, 0, 0, 3000000000, 0, 2 ** 32 - 1, 0, 0, 2 ** 31, 4000000000,
                                       2 ** 32 - 1, 0]


def test_min_max_and_comparisons_with_nan(shim) -> None:
    nan, one, two = 0x7E00, 0x3C00, 0x4000
    pairs = np.array([nan | (one << 16), two | (nan << 16)], np.uint32)
    other = np.array([one | (nan << 16), nan | (nan << 16)], np.uint32)
    for op in ("hmin2_h", "hmax2_h"):  # a NaN operand loses; two NaNs give NaN
        got = shim(op, pairs, other)
        assert (got & 0xFFFF).tolist() == [one, two] and (got[0] >> 16) == one
        assert (got[1] >> 16) & 0x7FFF > 0x7C00
    assert shim("hneu", [nan, one, one], [one, one, two]).tolist() == [1, 0, 1]
    assert shim("hlt", [nan, one, two], [one, two, one]).tolist() == [0, 1, 0]
