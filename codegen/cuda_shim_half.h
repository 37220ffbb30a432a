// cuda_shim_half.h: CUDA's 16-bit float types and the intrinsics the printed kernels call, for
// g++ on the CPU (part of codegen/cuda_shim.h; see the comment there).
//
// Written from the CUDA Math API's definitions, not from <cuda_fp16.h>, so the harness runs
// without the CUDA toolkit and every rounding is spelled out here:
//   - __half is IEEE binary16, __nv_bfloat16 the upper 16 bits of a binary32; both are plain
//     structs of their bits (trivial, so `__shared__` arrays of them need no constructor and
//     `V{}` is all-zero bits, as on the GPU).
//   - every arithmetic intrinsic computes exactly in float or double and rounds once to the
//     result type, to nearest even:
//       + - * of two f16 (11-bit) or bf16 (8-bit) values in float (24 bits) and then rounding
//       to 16 bits is correctly rounded (double rounding is innocuous when the wider format has
//       at least 2p + 2 bits); fma (__hfma, __hfma2, __fmaf_rn) rounds a*b + c once: the
//       product is exact in double and the sum is rounded to odd (TwoSum), which a later
//       rounding to fewer bits then rounds correctly.
//   - conversions from integers go through double (exact for 32-bit integers), then to float
//     rounded to odd, then to the 16-bit type: one correct rounding.
//   - float -> int conversions truncate and saturate as the PTX cvt.rzi does (NaN gives 0).
//   - min/max return the other operand when one is NaN (fmin/fmax; CUDA's __hmin/__hmax);
//     comparisons are ordered, except __hneu (true for NaN).
#ifndef MDSL_CUDA_SHIM_HALF_H
#define MDSL_CUDA_SHIM_HALF_H

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace mdsl_cpu {

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// double -> float rounded to odd (a value between two floats gets the one with an odd last
// bit): a later round-to-nearest to <= 22 bits is then correctly rounded.
inline float f64_to_f32_odd(double d) {
  float f = (float)d;
  if (std::isnan(d) || std::isinf(d) || (double)f == d) return f;
  uint32_t b = f32_bits(f);
  if (std::fabs((double)f) > std::fabs(d)) b -= 1;  // rounded away from zero: step back
  return bits_f32(b | 1u);
}

// a + b rounded to odd in double (TwoSum gives the rounding error of the double sum).
inline double add_f64_odd(double a, double b) {
  double s = a + b;
  if (!std::isfinite(s)) return s;
  double bb = s - a, err = (a - (s - bb)) + (b - bb);
  uint64_t u;
  std::memcpy(&u, &s, 8);
  if (err != 0 && !(u & 1)) s = std::nextafter(s, err > 0 ? INFINITY : -INFINITY);
  return s;
}

inline uint16_t f32_to_f16_bits(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));  // NaN stays NaN
  if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // >= 65520 rounds to infinity
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal half (or zero), multiples of 2^-24
    float scaled = bits_f32(ax) * 16777216.0f;  // exact
    return (uint16_t)(sign | (uint32_t)std::nearbyint(scaled));  // the default mode: nearest even
  }
  uint32_t r = ax - 0x38000000u;  // rebias the exponent, 127 -> 15
  r = r + 0xFFFu + ((r >> 13) & 1u);  // round the 13 dropped bits to nearest even
  return (uint16_t)(sign | (r >> 13));
}

inline float f16_bits_to_f32(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {
    float v = (float)m * (1.0f / 16777216.0f);
    return s ? -v : v;
  }
  if (e == 31) return bits_f32(s | 0x7F800000u | (m << 13));
  return bits_f32(s | ((e + 112u) << 23) | (m << 13));
}

inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t b = f32_bits(f);
  if (std::isnan(f)) return (uint16_t)((b >> 16) | 0x40u);  // stays a quiet NaN
  return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

inline float bf16_bits_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

}  // namespace mdsl_cpu

struct __half {
  uint16_t __x;
};
struct __nv_bfloat16 {
  uint16_t __x;
};
// Element x in the low 16 bits of the 32-bit word (the prelude's pair_bits reads it so).
struct alignas(4) __half2 {
  __half x, y;
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
static_assert(sizeof(__half) == 2 && sizeof(__nv_bfloat16) == 2 && sizeof(__half2) == 4 &&
              sizeof(__nv_bfloat162) == 4, "CUDA's 16-bit float types");

// ----- bits and conversions -------------------------------------------------------------------

constexpr unsigned short __half_as_ushort(__half v) { return v.__x; }
constexpr unsigned short __bfloat16_as_ushort(__nv_bfloat16 v) { return v.__x; }
constexpr __half __ushort_as_half(unsigned short x) { return __half{x}; }
constexpr __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) { return __nv_bfloat16{x}; }
inline unsigned int __float_as_uint(float f) { return mdsl_cpu::f32_bits(f); }
inline float __uint_as_float(unsigned int u) { return mdsl_cpu::bits_f32(u); }

inline float __half2float(__half v) { return mdsl_cpu::f16_bits_to_f32(v.__x); }
inline float __bfloat162float(__nv_bfloat16 v) { return mdsl_cpu::bf16_bits_to_f32(v.__x); }
inline __half __float2half_rn(float f) { return __half{mdsl_cpu::f32_to_f16_bits(f)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{mdsl_cpu::f32_to_bf16_bits(f)}; }

namespace mdsl_cpu {
// An integer (exact in double) rounded once to f16 / bf16.
inline __half half_of(double d) { return __float2half_rn(f64_to_f32_odd(d)); }
inline __nv_bfloat16 bf16_of(double d) { return __float2bfloat16_rn(f64_to_f32_odd(d)); }
}  // namespace mdsl_cpu

inline __half __int2half_rn(int i) { return mdsl_cpu::half_of((double)i); }
inline __half __uint2half_rn(unsigned int u) { return mdsl_cpu::half_of((double)u); }
inline __half __ushort2half_rn(unsigned short u) { return mdsl_cpu::half_of((double)u); }
inline __nv_bfloat16 __int2bfloat16_rn(int i) { return mdsl_cpu::bf16_of((double)i); }
inline __nv_bfloat16 __uint2bfloat16_rn(unsigned int u) { return mdsl_cpu::bf16_of((double)u); }
inline __nv_bfloat16 __ushort2bfloat16_rn(unsigned short u) { return mdsl_cpu::bf16_of((double)u); }
inline float __int2float_rn(int i) { return (float)(double)i; }  // exact in double, then one rounding
inline float __uint2float_rn(unsigned int u) { return (float)(double)u; }  // one rounding (to nearest even)

// PTX cvt.rzi.s32.f32 / .u32.f32: truncate toward zero, saturate to the integer range, NaN -> 0.
inline int __float2int_rz(float f) {
  if (std::isnan(f)) return 0;
  if (f >= 2147483648.0f) return INT_MAX;
  if (f <= -2147483648.0f) return INT_MIN;
  return (int)f;
}
inline unsigned int __float2uint_rz(float f) {
  if (std::isnan(f) || f <= 0.0f) return 0u;
  if (f >= 4294967296.0f) return UINT_MAX;
  return (unsigned int)f;
}

inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162{a, b}; }

// ----- f32 arithmetic (round to nearest even, never contracted: compiled -ffp-contract=off) --------

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }

// ----- 16-bit arithmetic ----------------------------------------------------------------------------

namespace mdsl_cpu {
inline float f(__half v) { return __half2float(v); }
inline float f(__nv_bfloat16 v) { return __bfloat162float(v); }
inline __half round_to(__half, float v) { return __float2half_rn(v); }
inline __nv_bfloat16 round_to(__nv_bfloat16, float v) { return __float2bfloat16_rn(v); }
// a * b + c rounded once: the product of two 16-bit floats is exact in double.
template <typename H> H fma16(H a, H b, H c) {
  double s = add_f64_odd((double)f(a) * (double)f(b), (double)f(c));
  return round_to(a, f64_to_f32_odd(s));
}
// fmin / fmax: a NaN operand loses; -0 < +0.
template <typename H> H min16(H a, H b) {
  float x = f(a), y = f(b);
  if (std::isnan(x)) return b;
  if (std::isnan(y)) return a;
  if (x == y) return std::signbit(x) ? a : b;
  return x < y ? a : b;
}
template <typename H> H max16(H a, H b) {
  float x = f(a), y = f(b);
  if (std::isnan(x)) return b;
  if (std::isnan(y)) return a;
  if (x == y) return std::signbit(x) ? b : a;
  return x > y ? a : b;
}
}  // namespace mdsl_cpu

#define MDSL_CPU_HALF_OPS(H)                                                                          \
  inline H __hadd_rn(H a, H b) { return mdsl_cpu::round_to(a, mdsl_cpu::f(a) + mdsl_cpu::f(b)); }   \
  inline H __hsub_rn(H a, H b) { return mdsl_cpu::round_to(a, mdsl_cpu::f(a) - mdsl_cpu::f(b)); }   \
  inline H __hmul_rn(H a, H b) { return mdsl_cpu::round_to(a, mdsl_cpu::f(a) * mdsl_cpu::f(b)); }   \
  inline H __hadd(H a, H b) { return __hadd_rn(a, b); }                                               \
  inline H __hsub(H a, H b) { return __hsub_rn(a, b); }                                               \
  inline H __hmul(H a, H b) { return __hmul_rn(a, b); }                                               \
  inline H __hfma(H a, H b, H c) { return mdsl_cpu::fma16(a, b, c); }                                 \
  inline H __hmin(H a, H b) { return mdsl_cpu::min16(a, b); }                                         \
  inline H __hmax(H a, H b) { return mdsl_cpu::max16(a, b); }                                         \
  inline bool __hlt(H a, H b) { return mdsl_cpu::f(a) < mdsl_cpu::f(b); }                             \
  inline bool __hle(H a, H b) { return mdsl_cpu::f(a) <= mdsl_cpu::f(b); }                            \
  inline bool __hgt(H a, H b) { return mdsl_cpu::f(a) > mdsl_cpu::f(b); }                             \
  inline bool __hge(H a, H b) { return mdsl_cpu::f(a) >= mdsl_cpu::f(b); }                            \
  inline bool __heq(H a, H b) { return mdsl_cpu::f(a) == mdsl_cpu::f(b); }                            \
  inline bool __hne(H a, H b) { return mdsl_cpu::f(a) < mdsl_cpu::f(b) || mdsl_cpu::f(a) > mdsl_cpu::f(b); } \
  inline bool __hneu(H a, H b) { return !(mdsl_cpu::f(a) == mdsl_cpu::f(b)); }

MDSL_CPU_HALF_OPS(__half)
MDSL_CPU_HALF_OPS(__nv_bfloat16)

// Pairs: element-wise, each element rounded once (CUDA's add.f16x2 ... and, for bf16, the
// fma.rn.bf16x2 these are built from on sm_80).
#define MDSL_CPU_PAIR_OPS(P)                                                                          \
  inline P __hadd2(P a, P b) { return P{__hadd_rn(a.x, b.x), __hadd_rn(a.y, b.y)}; }                  \
  inline P __hsub2(P a, P b) { return P{__hsub_rn(a.x, b.x), __hsub_rn(a.y, b.y)}; }                  \
  inline P __hmul2(P a, P b) { return P{__hmul_rn(a.x, b.x), __hmul_rn(a.y, b.y)}; }                  \
  inline P __hmin2(P a, P b) { return P{__hmin(a.x, b.x), __hmin(a.y, b.y)}; }                        \
  inline P __hmax2(P a, P b) { return P{__hmax(a.x, b.x), __hmax(a.y, b.y)}; }                        \
  inline P __hfma2(P a, P b, P c) { return P{__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)}; }

MDSL_CPU_PAIR_OPS(__half2)
MDSL_CPU_PAIR_OPS(__nv_bfloat162)

#undef MDSL_CPU_HALF_OPS
#undef MDSL_CPU_PAIR_OPS

#endif  // MDSL_CUDA_SHIM_HALF_H
