// metal_shim.h: compile Metal Shading Language kernels emitted by marlin_dsl with g++ (C++20)
// and run them on the CPU with real threadgroup semantics.
//
// What it provides
//   - Metal's types: half (_Float16 where g++ has it, else an emulated class; define
//     MTL_SHIM_EMULATE_HALF to force the class), bfloat (a class, IEEE bf16 with
//     round-to-nearest-even), uchar/ushort/uint/ulong, vectors (half2, uint4, uint3 with
//     .x/.y/.z, ...), float16_t / bfloat16_t / uint32_t ... as MLX names buffer types.
//   - address-space qualifiers as macros (`device`, `constant`, `thread` expand to nothing;
//     `threadgroup` declares a static array in the section "mtl_tg", which the runtime
//     poisons with 0xFF bytes (NaN for half/float) at the start of every threadgroup).
//   - attributes: [[kernel]], [[buffer(n)]], [[thread_index_in_threadgroup]]... are unknown
//     to g++, which ignores them ("-Wattributes" is silenced here).
//   - metal:: functions the printer uses (min, max, fmin, fmax, fma), as_type, mem_flags,
//     threadgroup_barrier, simdgroup_barrier, atomic_uint + atomic_fetch_add_explicit,
//     simdgroup_matrix<T, 8, 8> with simdgroup_load / simdgroup_store /
//     simdgroup_multiply_accumulate / make_filled_simdgroup_matrix / thread_elements().
//   - the runtime (namespace mtl_rt) that executes a launch: codegen/shim_runtime.h, shared
//     with the CUDA shim, in Metal's words, with the simdgroup matrices.
//
// Execution model of the runtime (codegen/shim_runtime.h has the details)
//   Threadgroups run one after another, in a random (seeded) order. Within a threadgroup
//   every thread is a fiber, interleaved by a seeded random scheduler on the calling OS thread
//   at every synchronisation point; these are real rendezvous:
//     - threadgroup_barrier: all threads of the group, at the same barrier (call site); a
//       different site, or a thread that exits while others wait (or before others reach a
//       barrier), is an error.
//     - simdgroup_barrier and every simdgroup-matrix operation (load, store,
//       multiply_accumulate): the 32 lanes of the simdgroup at the same call site; the last
//       lane to arrive executes the operation for the whole simdgroup (reading every lane's
//       operands from that lane's stack, writing every lane's result), after checking that
//       pointer / leading dimension / transpose agree across lanes.
//   A simdgroup_matrix holds, in each lane, only that lane's two elements (Apple's 8x8
//   layout: lane l holds row (l/4 & 4) + (l/2 % 4), columns (l/4 & 2)*2 + (l%2)*2 and +1),
//   so thread_elements() is lane-local exactly as on the GPU, and no lane can compute a
//   product without the others.
//   Races become visible because (1) the interleaving at every rendezvous is random, so a
//   missing barrier lets a simdgroup read threadgroup memory before (or after) another warp
//   wrote it, and (2) threadgroup memory starts every group poisoned (0xFF bytes), so a read
//   of an element nobody wrote yields NaN.
//   Faults (SIGSEGV/SIGBUS/SIGFPE/SIGILL, including fiber stack overflow through a guard
//   page) and a wall-clock timeout are caught and reported as errors instead of killing the
//   host process. Device memory is plain memory; atomics are __atomic builtins.
#ifndef MARLIN_METAL_SHIM_H
#define MARLIN_METAL_SHIM_H

#pragma GCC diagnostic ignored "-Wattributes"
#pragma GCC diagnostic ignored "-Wunused-variable"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <source_location>
#include <string>
#include <type_traits>

#define MDSL_SHIM_NAMESPACE mtl_rt
#include "shim_runtime.h"

#define MTL_SHIM_VERSION 1

// ----- scalar types ----------------------------------------------------------------------------

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

namespace mtl_rt {

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// float64 -> float32 rounded to odd: a later rounding to <= 22 bits is then correctly rounded.
inline float f64_to_f32_odd(double d) {
  float f = (float)d;
  if (std::isnan(d) || (double)f == d) return f;
  uint32_t b = f32_bits(f);
  if (std::fabs((double)f) > std::fabs(d)) b -= 1;  // rounded away from zero: step back
  return bits_f32(b | 1u);
}

inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t b = f32_bits(f);
  if (std::isnan(f)) return (uint16_t)((b >> 16) | 0x40);  // stays a quiet NaN
  return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

inline uint16_t f32_to_f16_bits(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal (or zero) half
    float scaled = bits_f32(ax) * 16777216.0f;  // exact: multiples of 2^-24
    return (uint16_t)(sign | (uint32_t)std::nearbyint(scaled));
  }
  uint32_t r = ax - 0x38000000u;  // rebias 127 -> 15
  r = r + 0xFFFu + ((r >> 13) & 1u);
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

}  // namespace mtl_rt

struct bfloat {
  uint16_t bits;
  bfloat() = default;
  bfloat(float f) : bits(mtl_rt::f32_to_bf16_bits(f)) {}
  bfloat(double d) : bits(mtl_rt::f32_to_bf16_bits(mtl_rt::f64_to_f32_odd(d))) {}
  template <typename I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  bfloat(I i) : bfloat((double)i) {}
#if defined(__FLT16_MAX__)
  bfloat(_Float16 h) : bfloat((float)h) {}
#endif
  operator float() const { return mtl_rt::bits_f32((uint32_t)bits << 16); }
  friend bfloat operator+(bfloat a, bfloat b) { return bfloat(float(a) + float(b)); }
  friend bfloat operator-(bfloat a, bfloat b) { return bfloat(float(a) - float(b)); }
  friend bfloat operator*(bfloat a, bfloat b) { return bfloat(float(a) * float(b)); }
  friend bfloat operator/(bfloat a, bfloat b) { return bfloat(float(a) / float(b)); }
  bfloat operator-() const { bfloat r; r.bits = bits ^ 0x8000u; return r; }
  friend bool operator<(bfloat a, bfloat b) { return float(a) < float(b); }
  friend bool operator<=(bfloat a, bfloat b) { return float(a) <= float(b); }
  friend bool operator>(bfloat a, bfloat b) { return float(a) > float(b); }
  friend bool operator>=(bfloat a, bfloat b) { return float(a) >= float(b); }
  friend bool operator==(bfloat a, bfloat b) { return float(a) == float(b); }
  friend bool operator!=(bfloat a, bfloat b) { return float(a) != float(b); }
};

#if defined(__FLT16_MAX__) && !defined(MTL_SHIM_EMULATE_HALF)
typedef _Float16 half;
#define MTL_SHIM_NATIVE_HALF 1
#else
#define MTL_SHIM_NATIVE_HALF 0
// IEEE binary16 emulated: every operation computes in float and rounds once to half
// (exact for + - * /: float has at least 2 * 11 + 2 bits).
struct half {
  uint16_t bits;
  half() = default;
  half(float f) : bits(mtl_rt::f32_to_f16_bits(f)) {}
  half(double d) : bits(mtl_rt::f32_to_f16_bits(mtl_rt::f64_to_f32_odd(d))) {}
  template <typename I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  half(I i) : half((double)i) {}
  half(bfloat b) : half(float(b)) {}
  operator float() const { return mtl_rt::f16_bits_to_f32(bits); }
  friend half operator+(half a, half b) { return half(float(a) + float(b)); }
  friend half operator-(half a, half b) { return half(float(a) - float(b)); }
  friend half operator*(half a, half b) { return half(float(a) * float(b)); }
  friend half operator/(half a, half b) { return half(float(a) / float(b)); }
  half operator-() const { half r; r.bits = bits ^ 0x8000u; return r; }
  friend bool operator<(half a, half b) { return float(a) < float(b); }
  friend bool operator<=(half a, half b) { return float(a) <= float(b); }
  friend bool operator>(half a, half b) { return float(a) > float(b); }
  friend bool operator>=(half a, half b) { return float(a) >= float(b); }
  friend bool operator==(half a, half b) { return float(a) == float(b); }
  friend bool operator!=(half a, half b) { return float(a) != float(b); }
};
#endif

typedef half float16_t;
typedef bfloat bfloat16_t;

static_assert(sizeof(half) == 2 && sizeof(bfloat) == 2, "16-bit float types");
static_assert(std::is_trivially_copyable_v<half> && std::is_trivially_copyable_v<bfloat>);

// ----- the metal namespace -------------------------------------------------------------------------

namespace metal {

template <typename T, int N> struct vec;

template <typename T> struct vec<T, 2> {
  T x, y;
  vec() = default;
  vec(T s) : x(s), y(s) {}
  template <typename A, typename B> vec(A a, B b) : x(T(a)), y(T(b)) {}
  template <typename U, std::enable_if_t<!std::is_same_v<U, T>, int> = 0>
  explicit vec(const vec<U, 2>& o) : x(T(o.x)), y(T(o.y)) {}
  T& operator[](int i) { return (&x)[i]; }
  const T& operator[](int i) const { return (&x)[i]; }
};
template <typename T> struct vec<T, 3> {
  T x, y, z;
  vec() = default;
  vec(T s) : x(s), y(s), z(s) {}
  template <typename A, typename B, typename C> vec(A a, B b, C c) : x(T(a)), y(T(b)), z(T(c)) {}
  template <typename U, std::enable_if_t<!std::is_same_v<U, T>, int> = 0>
  explicit vec(const vec<U, 3>& o) : x(T(o.x)), y(T(o.y)), z(T(o.z)) {}
  T& operator[](int i) { return (&x)[i]; }
  const T& operator[](int i) const { return (&x)[i]; }
};
template <typename T> struct vec<T, 4> {
  T x, y, z, w;
  vec() = default;
  vec(T s) : x(s), y(s), z(s), w(s) {}
  template <typename A, typename B, typename C, typename D>
  vec(A a, B b, C c, D d) : x(T(a)), y(T(b)), z(T(c)), w(T(d)) {}
  template <typename U, std::enable_if_t<!std::is_same_v<U, T>, int> = 0>
  explicit vec(const vec<U, 4>& o) : x(T(o.x)), y(T(o.y)), z(T(o.z)), w(T(o.w)) {}
  T& operator[](int i) { return (&x)[i]; }
  const T& operator[](int i) const { return (&x)[i]; }
};

// Element-wise vector arithmetic (half2 / half4 decode): each element rounds as its scalar op.
template <typename T, int N> inline vec<T, N> operator+(vec<T, N> a, const vec<T, N>& b) {
  for (int i = 0; i < N; ++i) a[i] = T(a[i] + b[i]);
  return a;
}
template <typename T, int N> inline vec<T, N> operator-(vec<T, N> a, const vec<T, N>& b) {
  for (int i = 0; i < N; ++i) a[i] = T(a[i] - b[i]);
  return a;
}
template <typename T, int N> inline vec<T, N> operator*(vec<T, N> a, const vec<T, N>& b) {
  for (int i = 0; i < N; ++i) a[i] = T(a[i] * b[i]);
  return a;
}

template <typename T, typename U> inline T as_type(const U& u) {
  static_assert(sizeof(T) == sizeof(U), "as_type between types of different sizes");
  T t;
  std::memcpy(&t, &u, sizeof(T));
  return t;
}

template <typename T> inline T min(T a, T b) { return b < a ? b : a; }
template <typename T> inline T max(T a, T b) { return a < b ? b : a; }
// IEEE minNum / maxNum: a NaN operand loses.
template <typename T> inline T fmin(T a, T b) { return T(std::fmin((float)a, (float)b)); }
template <typename T> inline T fmax(T a, T b) { return T(std::fmax((float)a, (float)b)); }
inline float fmin(float a, float b) { return std::fmin(a, b); }
inline float fmax(float a, float b) { return std::fmax(a, b); }
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
inline float exp2(float a) { return std::exp2(a); }
// half: the product is exact in double; TwoSum + round-to-odd make the final rounding single.
inline half fma(half a, half b, half c) {
  double p = (double)(float)a * (double)(float)b, q = (double)(float)c, s = p + q;
  double bb = s - p, err = (p - (s - bb)) + (q - bb);
  if (err != 0 && std::isfinite(s)) {
    uint64_t u; std::memcpy(&u, &s, 8);
    if (!(u & 1)) s = std::nextafter(s, err > 0 ? INFINITY : -INFINITY);
  }
  return half(mtl_rt::f64_to_f32_odd(s));
}

template <typename T, int N> inline vec<T, N> fma(vec<T, N> a, const vec<T, N>& b, const vec<T, N>& c) {
  for (int i = 0; i < N; ++i) a[i] = fma(a[i], b[i], c[i]);
  return a;
}

enum class mem_flags : int { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags((int)a | (int)b); }

enum memory_order { memory_order_relaxed, memory_order_acquire, memory_order_release,
                    memory_order_acq_rel, memory_order_seq_cst };
struct atomic_uint { uint value; };
struct atomic_int { int value; };
inline uint atomic_fetch_add_explicit(atomic_uint* obj, uint v, memory_order) {
  return __atomic_fetch_add(&obj->value, v, __ATOMIC_SEQ_CST);
}
inline int atomic_fetch_add_explicit(atomic_int* obj, int v, memory_order) {
  return __atomic_fetch_add(&obj->value, v, __ATOMIC_SEQ_CST);
}
enum thread_scope { thread_scope_thread, thread_scope_simdgroup, thread_scope_threadgroup, thread_scope_device };
inline void atomic_thread_fence(mem_flags, memory_order, thread_scope) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline uint atomic_load_explicit(atomic_uint* obj, memory_order) {
  return __atomic_load_n(&obj->value, __ATOMIC_SEQ_CST);
}
inline void atomic_store_explicit(atomic_uint* obj, uint v, memory_order) {
  __atomic_store_n(&obj->value, v, __ATOMIC_SEQ_CST);
}

template <typename T, int R, int C> struct simdgroup_matrix {
  static_assert(R == 8 && C == 8, "the shim implements 8x8 simdgroup matrices");
  vec<T, 2> e;  // this lane's two elements
  simdgroup_matrix() : e(T(std::numeric_limits<float>::quiet_NaN())) {}
  vec<T, 2>& thread_elements() { return e; }
  const vec<T, 2>& thread_elements() const { return e; }
};

}  // namespace metal

using metal::vec;
typedef metal::vec<half, 2> half2;
typedef metal::vec<half, 3> half3;
typedef metal::vec<half, 4> half4;
typedef metal::vec<bfloat, 2> bfloat2;
typedef metal::vec<bfloat, 3> bfloat3;
typedef metal::vec<bfloat, 4> bfloat4;
typedef metal::vec<float, 2> float2;
typedef metal::vec<float, 3> float3;
typedef metal::vec<float, 4> float4;
typedef metal::vec<uint, 2> uint2;
typedef metal::vec<uint, 3> uint3;
typedef metal::vec<uint, 4> uint4;
typedef metal::vec<int, 2> int2;
typedef metal::vec<int, 3> int3;
typedef metal::vec<int, 4> int4;
typedef metal::vec<ushort, 2> ushort2;
typedef metal::vec<ushort, 3> ushort3;
typedef metal::vec<ushort, 4> ushort4;
typedef metal::vec<uchar, 2> uchar2;
typedef metal::vec<uchar, 3> uchar3;
typedef metal::vec<uchar, 4> uchar4;
typedef metal::vec<bool, 2> bool2;
typedef metal::vec<bool, 3> bool3;
typedef metal::vec<bool, 4> bool4;
typedef metal::vec<ulong, 2> ulong2;

// ----- the runtime: codegen/shim_runtime.h, in Metal's words, with its simdgroup matrices -----------

namespace mtl_rt {

enum CollKind { COLL_NONE = 0, COLL_SIMD_BARRIER, COLL_LOAD, COLL_STORE, COLL_MMA };
inline const char* coll_name(int k) {
  static const char* names[] = {"-", "simdgroup_barrier", "simdgroup_load", "simdgroup_store",
                                "simdgroup_multiply_accumulate"};
  return names[k];
}

// One lane's operands of a simdgroup-matrix operation (on the lane's stack while it waits).
struct Coll {
  void* d = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  const void* mem = nullptr;
  ulong ld = 0, ox = 0, oy = 0;
  bool transpose = false;
};

// The memory side of a simdgroup_load / simdgroup_store.
inline Coll in_memory(const void* mem, ulong ld, ulong2 origin, bool transpose) {
  Coll c;
  c.mem = mem;
  c.ld = ld;
  c.ox = origin.x;
  c.oy = origin.y;
  c.transpose = transpose;
  return c;
}

inline const Coll& lane_coll(Group* g, uint w, uint lane) {
  return *static_cast<const Coll*>(g->fibers[w * 32 + lane].call.args);
}

struct Ids {
  uint3 threadgroup_position_in_grid, threadgroups_per_grid, threads_per_grid, thread_position_in_grid,
      thread_position_in_threadgroup, threads_per_threadgroup, grid_origin, grid_size,
      dispatch_threads_per_threadgroup;
  uint thread_index_in_threadgroup, simdgroup_index_in_threadgroup, thread_index_in_simdgroup,
      simdgroups_per_threadgroup, threads_per_simdgroup, thread_execution_width,
      quadgroup_index_in_threadgroup, thread_index_in_quadgroup, quadgroups_per_threadgroup,
      dispatch_quadgroups_per_threadgroup, dispatch_simdgroups_per_threadgroup;
};

typedef void (*Thunk)(void* ctx, const Ids& ids);

struct Kernel {
  Thunk thunk;
  void* ctx;
};

// Apple's 8x8 simdgroup-matrix layout: lane l holds (row, col) and (row, col + 1).
inline void lane_coord(uint lane, uint& row, uint& col) {
  uint qid = lane / 4;
  row = (qid & 4) + ((lane / 2) % 4);
  col = (qid & 2) * 2 + (lane % 2) * 2;
}

inline void check_uniform(Group* g, uint w) {
  const Coll& c0 = lane_coll(g, w, 0);
  for (uint l = 1; l < 32; ++l) {
    const Coll& c = lane_coll(g, w, l);
    const Call& call = g->fibers[w * 32 + l].call;
    if (c.mem != c0.mem || c.ld != c0.ld || c.ox != c0.ox || c.oy != c0.oy || c.transpose != c0.transpose)
      fail(fmt("%s at %s: the pointer, leading dimension, origin or transpose differ between lanes 0 and "
               "%u of simdgroup %u in threadgroup (%u, %u, %u)",
               coll_name(call.kind), site_str(call.site).c_str(), l, w, g->pos.x, g->pos.y, g->pos.z));
  }
}

inline size_t elem_offset(const Coll& c, uint r, uint col) {
  return c.transpose ? (size_t)(c.oy + col) * c.ld + c.ox + r : (size_t)(c.oy + r) * c.ld + c.ox + col;
}

template <typename T> void exec_load(Group* g, uint w) {
  check_uniform(g, w);
  const Coll& c0 = lane_coll(g, w, 0);
  const T* src = static_cast<const T*>(c0.mem);
  for (uint l = 0; l < 32; ++l) {
    auto* d = static_cast<metal::simdgroup_matrix<T, 8, 8>*>(lane_coll(g, w, l).d);
    uint r, c;
    lane_coord(l, r, c);
    d->e.x = src[elem_offset(c0, r, c)];
    d->e.y = src[elem_offset(c0, r, c + 1)];
  }
}

template <typename T> void exec_store(Group* g, uint w) {
  check_uniform(g, w);
  const Coll& c0 = lane_coll(g, w, 0);
  T* dst = static_cast<T*>(const_cast<void*>(c0.mem));
  for (uint l = 0; l < 32; ++l) {
    auto* m = static_cast<const metal::simdgroup_matrix<T, 8, 8>*>(lane_coll(g, w, l).a);
    uint r, c;
    lane_coord(l, r, c);
    dst[elem_offset(c0, r, c)] = m->e.x;
    dst[elem_offset(c0, r, c + 1)] = m->e.y;
  }
}

template <typename TD, typename TA, typename TB, typename TC> void exec_mma(Group* g, uint w) {
  double A[8][8], B[8][8], C[8][8];
  for (uint l = 0; l < 32; ++l) {
    const Coll& c = lane_coll(g, w, l);
    auto* a = static_cast<const metal::simdgroup_matrix<TA, 8, 8>*>(c.a);
    auto* b = static_cast<const metal::simdgroup_matrix<TB, 8, 8>*>(c.b);
    auto* cc = static_cast<const metal::simdgroup_matrix<TC, 8, 8>*>(c.c);
    uint r, col;
    lane_coord(l, r, col);
    A[r][col] = (double)(float)a->e.x; A[r][col + 1] = (double)(float)a->e.y;
    B[r][col] = (double)(float)b->e.x; B[r][col + 1] = (double)(float)b->e.y;
    C[r][col] = (double)(float)cc->e.x; C[r][col + 1] = (double)(float)cc->e.y;
  }
  for (uint l = 0; l < 32; ++l) {
    auto* d = static_cast<metal::simdgroup_matrix<TD, 8, 8>*>(lane_coll(g, w, l).d);
    uint r, col;
    lane_coord(l, r, col);
    for (uint j = 0; j < 2; ++j) {
      double acc = 0;
      for (uint k = 0; k < 8; ++k) acc += A[r][k] * B[k][col + j];
      acc += C[r][col + j];
      d->e[j] = TD((float)acc);  // float: rounded once; half/bfloat: via float
    }
  }
}

inline void run_thread(Group* g, Fiber* f) {
  Ids ids;
  uint T = g->T;
  uint3 pos(g->pos.x, g->pos.y, g->pos.z), dims(g->dims.x, g->dims.y, g->dims.z);
  ids.threadgroup_position_in_grid = pos;
  ids.threadgroups_per_grid = dims;
  ids.threads_per_grid = uint3(dims.x * T, dims.y, dims.z);
  ids.grid_size = ids.threads_per_grid;
  ids.grid_origin = uint3(0u, 0u, 0u);
  ids.thread_position_in_grid = uint3(pos.x * T + f->tid, pos.y, pos.z);
  ids.thread_position_in_threadgroup = uint3(f->tid, 0u, 0u);
  ids.threads_per_threadgroup = uint3(T, 1u, 1u);
  ids.dispatch_threads_per_threadgroup = ids.threads_per_threadgroup;
  ids.thread_index_in_threadgroup = f->tid;
  ids.simdgroup_index_in_threadgroup = f->tid / 32;
  ids.thread_index_in_simdgroup = f->tid % 32;
  ids.simdgroups_per_threadgroup = ids.dispatch_simdgroups_per_threadgroup = T / 32;
  ids.threads_per_simdgroup = ids.thread_execution_width = 32;
  ids.quadgroup_index_in_threadgroup = f->tid / 4;
  ids.thread_index_in_quadgroup = f->tid % 4;
  ids.quadgroups_per_threadgroup = ids.dispatch_quadgroups_per_threadgroup = T / 4;
  const Kernel* k = static_cast<const Kernel*>(g->kernel);
  k->thunk(k->ctx, ids);
}

// Extern symbols bracketing the threadgroup-memory section (absent when the kernel has none).
extern "C" char __start_mtl_tg[] __attribute__((weak));
extern "C" char __stop_mtl_tg[] __attribute__((weak));

inline void poison_threadgroup_memory() {
  char* start = __start_mtl_tg;
  char* stop = __stop_mtl_tg;
  if (start && stop && stop > start) std::memset(start, 0xFF, (size_t)(stop - start));
}

inline size_t threadgroup_memory_bytes() {
  return (__start_mtl_tg && __stop_mtl_tg) ? (size_t)(__stop_mtl_tg - __start_mtl_tg) : 0;
}

inline bool begin_block(Group*, std::string&) {
  poison_threadgroup_memory();
  return true;
}

inline int launch(Thunk thunk, void* ctx, uint gx, uint gy, uint gz, uint threads, uint64_t seed,
                  double timeout_s, size_t stack_bytes, char* err, size_t errlen) {
  const Dialect dialect{"threadgroup", "simdgroup", "threadgroup_barrier", coll_name, 4, begin_block,
                       run_thread};  // not a global: see shim_runtime.h
  const Kernel kernel{thunk, ctx};
  return run_launch(dialect, &kernel, gx, gy, gz, threads, seed, timeout_s, stack_bytes, err, errlen);
}

}  // namespace mtl_rt

// ----- barriers and simdgroup matrices (need the runtime) --------------------------------------------

namespace metal {

inline void threadgroup_barrier(mem_flags, std::source_location loc = std::source_location::current()) {
  mtl_rt::block_barrier(mtl_rt::Site::of(loc));
}

inline void simdgroup_barrier(mem_flags, std::source_location loc = std::source_location::current()) {
  mtl_rt::collective(mtl_rt::COLL_SIMD_BARRIER, loc, nullptr, nullptr);
}

template <typename T, int R = 8, int C = 8>
inline simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T value) {
  simdgroup_matrix<T, R, C> m;
  m.e = vec<T, 2>(value);
  return m;
}

template <typename T, typename U>
inline void simdgroup_load(simdgroup_matrix<T, 8, 8>& d, const U* src, ulong elements_per_row = 8,
                           ulong2 matrix_origin = ulong2(0, 0), bool transpose_matrix = false,
                           std::source_location loc = std::source_location::current()) {
  static_assert(std::is_same_v<std::remove_cv_t<U>, T>, "simdgroup_load: matrix and memory element types differ");
  mtl_rt::Coll c = mtl_rt::in_memory(src, elements_per_row, matrix_origin, transpose_matrix);
  c.d = &d;
  mtl_rt::collective(mtl_rt::COLL_LOAD, loc, &c, &mtl_rt::exec_load<T>);
}

template <typename T, typename U>
inline void simdgroup_store(const simdgroup_matrix<T, 8, 8>& a, U* dst, ulong elements_per_row = 8,
                            ulong2 matrix_origin = ulong2(0, 0), bool transpose_matrix = false,
                            std::source_location loc = std::source_location::current()) {
  static_assert(std::is_same_v<U, T>, "simdgroup_store: matrix and memory element types differ");
  simdgroup_matrix<T, 8, 8> copy = a;  // the operand may be a temporary: keep it on this stack
  mtl_rt::Coll c = mtl_rt::in_memory(dst, elements_per_row, matrix_origin, transpose_matrix);
  c.a = &copy;
  mtl_rt::collective(mtl_rt::COLL_STORE, loc, &c, &mtl_rt::exec_store<T>);
}

template <typename TD, typename TA, typename TB, typename TC>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                          const simdgroup_matrix<TB, 8, 8>& b, const simdgroup_matrix<TC, 8, 8>& c,
                                          std::source_location loc = std::source_location::current()) {
  mtl_rt::Coll op;
  op.d = &d;
  op.a = &a;
  op.b = &b;
  op.c = &c;
  mtl_rt::collective(mtl_rt::COLL_MMA, loc, &op, &mtl_rt::exec_mma<TD, TA, TB, TC>);
}

}  // namespace metal

// ----- address spaces (last: they are macros) ---------------------------------------------------------

#define device
#define constant
#define thread
#define threadgroup static __attribute__((section("mtl_tg"), aligned(16)))

#endif  // MARLIN_METAL_SHIM_H
