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
//   - the runtime (namespace mtl_rt) that executes a launch.
//
// Execution model of the runtime
//   Threadgroups run one after another, in a random (seeded) order. Within a threadgroup
//   every thread is a user-level thread (a fiber with its own stack) and all of them run
//   concurrently, interleaved by a scheduler on the calling OS thread. A fiber runs until it
//   reaches a synchronisation point; the scheduler then resumes another runnable fiber chosen
//   at random (seeded xorshift) under one of four policies picked by seed % 4: uniformly
//   random, or random simdgroup priorities (one simdgroup runs ahead of the others between
//   threadgroup barriers) without / with rare / with frequent random demotions of the
//   running simdgroup (see pick_next). Synchronisation points are real rendezvous:
//     - threadgroup_barrier: the fiber blocks until all threads of the group arrive, at the
//       same barrier (call site); a different site is reported as a divergent barrier, a
//       thread that exits while others wait (or before others reach a barrier) as well.
//     - simdgroup_barrier and every simdgroup-matrix operation (load, store,
//       multiply_accumulate): the 32 lanes of the simdgroup rendezvous at the same call site;
//       the last lane to arrive executes the operation for the whole simdgroup (reading
//       every lane's operands from that lane's stack, writing every lane's result), after
//       checking that pointer / leading dimension / transpose agree across lanes, then all
//       32 lanes become runnable again.
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
#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

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

// ----- the runtime ---------------------------------------------------------------------------------

namespace mtl_rt {

struct Site {
  const char* file = "";
  const char* func = "";
  unsigned line = 0, col = 0;
  static Site of(const std::source_location& l) {
    return Site{l.file_name(), l.function_name(), (unsigned)l.line(), (unsigned)l.column()};
  }
  bool operator==(const Site& o) const {
    return line == o.line && col == o.col && std::strcmp(file, o.file) == 0;
  }
};

enum CollKind { COLL_NONE = 0, COLL_SIMD_BARRIER, COLL_LOAD, COLL_STORE, COLL_MMA };
inline const char* coll_name(int k) {
  static const char* names[] = {"-", "simdgroup_barrier", "simdgroup_load", "simdgroup_store",
                                "simdgroup_multiply_accumulate"};
  return names[k];
}

struct Coll {
  int kind = COLL_NONE;
  Site site;
  void* d = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  const void* mem = nullptr;
  ulong ld = 0, ox = 0, oy = 0;
  bool transpose = false;
};

enum FiberState { F_NEW, F_RUNNABLE, F_RUNNING, F_TG_BARRIER, F_WARP, F_DONE };

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

struct Group;

struct Fiber {
  Group* group = nullptr;
  uint tid = 0;
  int state = F_NEW;
  jmp_buf jb;
  ucontext_t uc;
  char* stack = nullptr;  // usable stack (above the guard page)
  size_t stack_size = 0;
  Site site;  // where it waits
  Coll coll;
};

struct Warp {
  int arrived = 0;
  Coll first;  // the first lane's operation (site, kind)
};

struct Group {
  uint T = 0, W = 0;
  uint3 pos, dims;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  std::vector<std::vector<int>> runnable;  // per simdgroup: its runnable lanes (thread ids)
  size_t n_runnable = 0;
  std::vector<int> priority;  // simdgroup ids, highest priority first
  int policy = 0;             // see pick_next
  uint64_t demote_mask = 0;   // demote the running simdgroup when (random & mask) == 0
  uint tg_arrived = 0;
  Site tg_site;
  uint finished = 0;
  jmp_buf sched;
  ucontext_t sched_uc;
  bool failed = false;
  std::string error;
  uint64_t rng = 0;
  Thunk thunk = nullptr;
  void* ctx = nullptr;
};

// The launch in progress on this OS thread (one launch at a time per thread).
inline thread_local Group* g_group = nullptr;
inline thread_local Fiber* g_fiber = nullptr;

inline uint64_t next_random(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

inline std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

inline std::string where(const Group* g, uint tid) {
  return fmt("threadgroup (%u, %u, %u), thread %u (simdgroup %u, lane %u)", g->pos.x, g->pos.y,
             g->pos.z, tid, tid / 32, tid % 32);
}

inline std::string site_str(const Site& s) { return fmt("line %u:%u", s.line, s.col); }

// Hand control back to the scheduler; returns when the scheduler resumes this fiber.
inline void suspend(Fiber* f) {
  if (!_setjmp(f->jb)) _longjmp(f->group->sched, 1);
}

[[noreturn]] inline void fail(const std::string& msg) {
  Group* g = g_group;
  g->failed = true;
  g->error = msg;
  _longjmp(g->sched, 1);
}

inline void make_runnable(Group* g, Fiber* f) {
  f->state = F_RUNNABLE;
  g->runnable[f->tid / 32].push_back((int)f->tid);
  g->n_runnable++;
}

// Scheduling policies (chosen per launch from the seed, see launch):
//   0: uniform: any runnable thread of the group, at random;
//   1..3: simdgroup priority: the simdgroups have a random priority order and a random lane of
//      the highest-priority simdgroup with a runnable lane runs, so one simdgroup runs ahead of
//      the others from one threadgroup barrier to the next (exposing missing barriers as
//      reads of unwritten or stale threadgroup memory); with policies 2 and 3 the running
//      simdgroup is demoted to the lowest priority at random moments (rarely / often).
inline int pick_next(Group* g) {
  int w = -1;
  if (g->policy == 0) {
    uint64_t r = next_random(g->rng) % g->n_runnable;
    for (uint i = 0; i < g->W; ++i) {
      if (r < g->runnable[i].size()) { w = (int)i; break; }
      r -= g->runnable[i].size();
    }
  } else {
    for (int i : g->priority)
      if (!g->runnable[i].empty()) { w = i; break; }
    if (g->demote_mask && (next_random(g->rng) & g->demote_mask) == 0) {
      for (size_t i = 0; i < g->priority.size(); ++i)
        if (g->priority[i] == w) {
          g->priority.erase(g->priority.begin() + (long)i);
          g->priority.push_back(w);
          break;
        }
    }
  }
  auto& lanes = g->runnable[w];
  size_t pick = (size_t)(next_random(g->rng) % lanes.size());
  int id = lanes[pick];
  lanes[pick] = lanes.back();
  lanes.pop_back();
  g->n_runnable--;
  return id;
}

inline void threadgroup_barrier_at(const Site& s) {
  Fiber* f = g_fiber;
  Group* g = f->group;
  if (g->finished)
    fail(fmt("threadgroup_barrier at %s reached by %s after another thread of the group exited",
             site_str(s).c_str(), where(g, f->tid).c_str()));
  if (g->tg_arrived == 0) {
    g->tg_site = s;
  } else if (!(g->tg_site == s)) {
    fail(fmt("divergent threadgroup_barrier: %s waits at %s, others at %s", where(g, f->tid).c_str(),
             site_str(s).c_str(), site_str(g->tg_site).c_str()));
  }
  f->site = s;
  f->state = F_TG_BARRIER;
  if (++g->tg_arrived == g->T) {
    g->tg_arrived = 0;
    for (auto& o : g->fibers) make_runnable(g, &o);
  }
  suspend(f);
}

typedef void (*CollExec)(Group* g, uint warp);

// Rendezvous of the 32 lanes of f's simdgroup at one call site; the last lane runs `exec`.
inline void collective(Fiber* f, CollExec exec) {
  Group* g = f->group;
  uint w = f->tid / 32;
  Warp& warp = g->warps[w];
  if (g->finished) {
    for (uint l = 0; l < 32; ++l)
      if (g->fibers[w * 32 + l].state == F_DONE)
        fail(fmt("%s at %s reached by %s after lane %u of its simdgroup exited", coll_name(f->coll.kind),
                 site_str(f->coll.site).c_str(), where(g, f->tid).c_str(), l));
  }
  if (warp.arrived == 0) {
    warp.first = f->coll;
  } else if (!(warp.first.site == f->coll.site) || warp.first.kind != f->coll.kind) {
    fail(fmt("divergent simdgroup operation: %s is at %s (%s), another lane at %s (%s)",
             where(g, f->tid).c_str(), site_str(f->coll.site).c_str(), coll_name(f->coll.kind),
             site_str(warp.first.site).c_str(), coll_name(warp.first.kind)));
  }
  f->site = f->coll.site;
  f->state = F_WARP;
  if (++warp.arrived == 32) {
    warp.arrived = 0;
    if (exec) exec(g, w);
    for (uint l = 0; l < 32; ++l) make_runnable(g, &g->fibers[w * 32 + l]);
  }
  suspend(f);
}

// Apple's 8x8 simdgroup-matrix layout: lane l holds (row, col) and (row, col + 1).
inline void lane_coord(uint lane, uint& row, uint& col) {
  uint qid = lane / 4;
  row = (qid & 4) + ((lane / 2) % 4);
  col = (qid & 2) * 2 + (lane % 2) * 2;
}

inline void check_uniform(Group* g, uint w) {
  const Coll& c0 = g->fibers[w * 32].coll;
  for (uint l = 1; l < 32; ++l) {
    const Coll& c = g->fibers[w * 32 + l].coll;
    if (c.mem != c0.mem || c.ld != c0.ld || c.ox != c0.ox || c.oy != c0.oy || c.transpose != c0.transpose)
      fail(fmt("%s at %s: the pointer, leading dimension, origin or transpose differ between lanes 0 and "
               "%u of simdgroup %u in threadgroup (%u, %u, %u)",
               coll_name(c.kind), site_str(c.site).c_str(), l, w, g->pos.x, g->pos.y, g->pos.z));
  }
}

inline size_t elem_offset(const Coll& c, uint r, uint col) {
  return c.transpose ? (size_t)(c.oy + col) * c.ld + c.ox + r : (size_t)(c.oy + r) * c.ld + c.ox + col;
}

template <typename T> void exec_load(Group* g, uint w) {
  check_uniform(g, w);
  const Coll& c0 = g->fibers[w * 32].coll;
  const T* src = static_cast<const T*>(c0.mem);
  for (uint l = 0; l < 32; ++l) {
    auto* d = static_cast<metal::simdgroup_matrix<T, 8, 8>*>(g->fibers[w * 32 + l].coll.d);
    uint r, c;
    lane_coord(l, r, c);
    d->e.x = src[elem_offset(c0, r, c)];
    d->e.y = src[elem_offset(c0, r, c + 1)];
  }
}

template <typename T> void exec_store(Group* g, uint w) {
  check_uniform(g, w);
  const Coll& c0 = g->fibers[w * 32].coll;
  T* dst = static_cast<T*>(const_cast<void*>(c0.mem));
  for (uint l = 0; l < 32; ++l) {
    auto* m = static_cast<const metal::simdgroup_matrix<T, 8, 8>*>(g->fibers[w * 32 + l].coll.a);
    uint r, c;
    lane_coord(l, r, c);
    dst[elem_offset(c0, r, c)] = m->e.x;
    dst[elem_offset(c0, r, c + 1)] = m->e.y;
  }
}

template <typename TD, typename TA, typename TB, typename TC> void exec_mma(Group* g, uint w) {
  double A[8][8], B[8][8], C[8][8];
  for (uint l = 0; l < 32; ++l) {
    const Coll& c = g->fibers[w * 32 + l].coll;
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
    auto* d = static_cast<metal::simdgroup_matrix<TD, 8, 8>*>(g->fibers[w * 32 + l].coll.d);
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

// ----- faults and timeout ------------------------------------------------------------------------

inline thread_local sigjmp_buf g_fault_jb;
inline thread_local volatile sig_atomic_t g_fault_sig = 0;
inline thread_local void* volatile g_fault_addr = nullptr;
inline volatile pid_t g_launch_tid = 0;
inline struct sigaction g_old_actions[5];
inline const int g_fault_signals[5] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGRTMIN + 4};

inline void fault_handler(int sig, siginfo_t* info, void*) {
  if ((pid_t)syscall(SYS_gettid) != g_launch_tid) {  // not ours: restore and let it refault
    for (int i = 0; i < 5; ++i)
      if (g_fault_signals[i] == sig) sigaction(sig, &g_old_actions[i], nullptr);
    return;
  }
  g_fault_sig = sig;
  g_fault_addr = info ? info->si_addr : nullptr;
  siglongjmp(g_fault_jb, 1);
}

inline void fiber_entry() {
  Fiber* f = g_fiber;
  Group* g = f->group;
  Ids ids;
  uint T = g->T;
  ids.threadgroup_position_in_grid = g->pos;
  ids.threadgroups_per_grid = g->dims;
  ids.threads_per_grid = uint3(g->dims.x * T, g->dims.y, g->dims.z);
  ids.grid_size = ids.threads_per_grid;
  ids.grid_origin = uint3(0u, 0u, 0u);
  ids.thread_position_in_grid = uint3(g->pos.x * T + f->tid, g->pos.y, g->pos.z);
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
  g->thunk(g->ctx, ids);
  f = g_fiber;
  g = f->group;
  f->state = F_DONE;
  g->finished++;
  if (g->tg_arrived)
    fail(fmt("%s exited while %u threads wait at the threadgroup_barrier at %s", where(g, f->tid).c_str(),
             g->tg_arrived, site_str(g->tg_site).c_str()));
  uint w = f->tid / 32;
  if (g->warps[w].arrived)
    fail(fmt("%s exited while %d lanes of its simdgroup wait at %s (%s)", where(g, f->tid).c_str(),
             g->warps[w].arrived, site_str(g->warps[w].first.site).c_str(), coll_name(g->warps[w].first.kind)));
  _longjmp(g->sched, 1);
}

inline std::string deadlock_report(Group* g) {
  std::string s = fmt("deadlock in threadgroup (%u, %u, %u): no thread can run;", g->pos.x, g->pos.y, g->pos.z);
  int shown = 0;
  for (auto& f : g->fibers) {
    if (f.state == F_DONE || shown >= 6) continue;
    s += fmt(" thread %u waits at %s (%s);", f.tid, site_str(f.site).c_str(),
             f.state == F_TG_BARRIER ? "threadgroup_barrier" : coll_name(f.coll.kind));
    shown++;
  }
  return s;
}

// Runs every thread of one threadgroup to completion. Returns false on an error (g->error).
inline bool run_group(Group* g) {
  g->runnable.assign(g->W, {});
  g->n_runnable = 0;
  g->priority.resize(g->W);
  for (uint i = 0; i < g->W; ++i) g->priority[i] = (int)i;
  for (size_t i = g->W; i > 1; --i) std::swap(g->priority[i - 1], g->priority[next_random(g->rng) % i]);
  g->finished = 0;
  g->tg_arrived = 0;
  g->failed = false;
  for (auto& w : g->warps) w.arrived = 0;
  for (auto& f : g->fibers) {
    make_runnable(g, &f);
    f.state = F_NEW;
    f.coll = Coll();
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = f.stack_size;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, (void (*)())fiber_entry, 0);
  }
  while (g->finished < g->T) {
    if (g->n_runnable == 0) {
      g->failed = true;
      g->error = deadlock_report(g);
      return false;
    }
    Fiber* f = &g->fibers[pick_next(g)];
    g_fiber = f;
    if (!_setjmp(g->sched)) {
      if (f->state == F_NEW) {
        f->state = F_RUNNING;
        swapcontext(&g->sched_uc, &f->uc);
      } else {
        f->state = F_RUNNING;
        _longjmp(f->jb, 1);
      }
    }
    if (g->failed) return false;
  }
  return true;
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

// Status codes of `launch`.
enum { LAUNCH_OK = 0, LAUNCH_ERROR = 1, LAUNCH_FAULT = 2, LAUNCH_TIMEOUT = 3, LAUNCH_BAD_ARGS = 4 };

inline int launch(Thunk thunk, void* ctx, uint gx, uint gy, uint gz, uint threads, uint64_t seed,
                  double timeout_s, size_t stack_bytes, char* err, size_t errlen) {
  auto report = [&](const std::string& m) {
    if (err && errlen) std::snprintf(err, errlen, "%s", m.c_str());
  };
  if (threads == 0 || threads % 32 || threads > 1024) {
    report(fmt("threads per threadgroup must be a positive multiple of 32 up to 1024, got %u", threads));
    return LAUNCH_BAD_ARGS;
  }
  if (g_group) {
    report("a launch is already running on this thread");
    return LAUNCH_BAD_ARGS;
  }
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  stack_bytes = (stack_bytes + page - 1) / page * page;
  size_t per = stack_bytes + page;  // guard page below each stack
  char* region = (char*)mmap(nullptr, per * threads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) {
    report("cannot map fiber stacks");
    return LAUNCH_BAD_ARGS;
  }
  Group* g = new Group();
  g->T = threads;
  g->W = threads / 32;
  g->dims = uint3(gx, gy, gz);
  g->fibers.resize(threads);
  g->warps.resize(threads / 32);
  g->thunk = thunk;
  g->ctx = ctx;
  g->rng = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  if (!g->rng) g->rng = 1;
  g->policy = (int)(seed % 4);
  g->demote_mask = g->policy == 2 ? 1023 : g->policy == 3 ? 63 : 0;
  for (uint t = 0; t < threads; ++t) {
    Fiber& f = g->fibers[t];
    f.group = g;
    f.tid = t;
    mprotect(region + t * per, page, PROT_NONE);
    f.stack = region + t * per + page;
    f.stack_size = stack_bytes;
  }
  // Threadgroups in a random order.
  size_t total = (size_t)gx * gy * gz;
  std::vector<uint64_t> order(total);
  for (size_t i = 0; i < total; ++i) order[i] = i;
  for (size_t i = total; i > 1; --i) std::swap(order[i - 1], order[next_random(g->rng) % i]);

  // Fault and timeout handling for this OS thread.
  std::vector<char> altstack_mem(1 << 16);
  stack_t alt{}, old_alt{};
  alt.ss_sp = altstack_mem.data();
  alt.ss_size = altstack_mem.size();
  sigaltstack(&alt, &old_alt);
  g_launch_tid = (pid_t)syscall(SYS_gettid);
  struct sigaction sa{};
  sa.sa_sigaction = fault_handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 5; ++i) sigaction(g_fault_signals[i], &sa, &g_old_actions[i]);
  timer_t timer{};
  bool have_timer = false;
  if (timeout_s > 0) {
    struct sigevent sev{};
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGRTMIN + 4;
    sev._sigev_un._tid = g_launch_tid;
    if (timer_create(CLOCK_MONOTONIC, &sev, &timer) == 0) {
      have_timer = true;
      struct itimerspec its{};
      its.it_value.tv_sec = (time_t)timeout_s;
      its.it_value.tv_nsec = (long)((timeout_s - (double)(time_t)timeout_s) * 1e9);
      if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
      timer_settime(timer, 0, &its, nullptr);
    }
  }
  g_group = g;
  volatile int status = LAUNCH_OK;
  if (sigsetjmp(g_fault_jb, 1) == 0) {
    for (size_t i = 0; i < total; ++i) {
      uint64_t id = order[i];
      g->pos = uint3((uint)(id % gx), (uint)(id / gx % gy), (uint)(id / ((uint64_t)gx * gy)));
      poison_threadgroup_memory();
      if (!run_group(g)) {
        status = LAUNCH_ERROR;
        report(g->error);
        break;
      }
    }
  } else {
    int sig = g_fault_sig;
    Fiber* f = g_fiber;
    std::string who = f ? where(g, f->tid) : std::string("the runtime");
    if (sig == SIGRTMIN + 4) {
      status = LAUNCH_TIMEOUT;
      report(fmt("timeout after %.1f s (in %s)", timeout_s, who.c_str()));
    } else {
      status = LAUNCH_FAULT;
      report(fmt("%s at address %p in %s", sig == SIGSEGV ? "segmentation fault" : sig == SIGBUS ? "bus error"
                 : sig == SIGFPE ? "arithmetic fault (integer division by zero?)" : "illegal instruction",
                 g_fault_addr, who.c_str()));
    }
  }
  if (have_timer) timer_delete(timer);
  for (int i = 0; i < 5; ++i) sigaction(g_fault_signals[i], &g_old_actions[i], nullptr);
  sigaltstack(&old_alt, nullptr);
  g_launch_tid = 0;
  g_group = nullptr;
  g_fiber = nullptr;
  munmap(region, per * threads);
  delete g;
  return status;
}

}  // namespace mtl_rt

// ----- barriers and simdgroup matrices (need the runtime) --------------------------------------------

namespace metal {

inline void threadgroup_barrier(mem_flags, std::source_location loc = std::source_location::current()) {
  mtl_rt::threadgroup_barrier_at(mtl_rt::Site::of(loc));
}

inline void simdgroup_barrier(mem_flags, std::source_location loc = std::source_location::current()) {
  mtl_rt::Fiber* f = mtl_rt::g_fiber;
  f->coll = mtl_rt::Coll();
  f->coll.kind = mtl_rt::COLL_SIMD_BARRIER;
  f->coll.site = mtl_rt::Site::of(loc);
  mtl_rt::collective(f, nullptr);
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
  mtl_rt::Fiber* f = mtl_rt::g_fiber;
  f->coll = mtl_rt::Coll();
  f->coll.kind = mtl_rt::COLL_LOAD;
  f->coll.site = mtl_rt::Site::of(loc);
  f->coll.d = &d;
  f->coll.mem = src;
  f->coll.ld = elements_per_row;
  f->coll.ox = matrix_origin.x;
  f->coll.oy = matrix_origin.y;
  f->coll.transpose = transpose_matrix;
  mtl_rt::collective(f, &mtl_rt::exec_load<T>);
}

template <typename T, typename U>
inline void simdgroup_store(const simdgroup_matrix<T, 8, 8>& a, U* dst, ulong elements_per_row = 8,
                            ulong2 matrix_origin = ulong2(0, 0), bool transpose_matrix = false,
                            std::source_location loc = std::source_location::current()) {
  static_assert(std::is_same_v<U, T>, "simdgroup_store: matrix and memory element types differ");
  mtl_rt::Fiber* f = mtl_rt::g_fiber;
  simdgroup_matrix<T, 8, 8> copy = a;  // the operand may be a temporary: keep it on this stack
  f->coll = mtl_rt::Coll();
  f->coll.kind = mtl_rt::COLL_STORE;
  f->coll.site = mtl_rt::Site::of(loc);
  f->coll.a = &copy;
  f->coll.mem = dst;
  f->coll.ld = elements_per_row;
  f->coll.ox = matrix_origin.x;
  f->coll.oy = matrix_origin.y;
  f->coll.transpose = transpose_matrix;
  mtl_rt::collective(f, &mtl_rt::exec_store<T>);
}

template <typename TD, typename TA, typename TB, typename TC>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                          const simdgroup_matrix<TB, 8, 8>& b, const simdgroup_matrix<TC, 8, 8>& c,
                                          std::source_location loc = std::source_location::current()) {
  mtl_rt::Fiber* f = mtl_rt::g_fiber;
  f->coll = mtl_rt::Coll();
  f->coll.kind = mtl_rt::COLL_MMA;
  f->coll.site = mtl_rt::Site::of(loc);
  f->coll.d = &d;
  f->coll.a = &a;
  f->coll.b = &b;
  f->coll.c = &c;
  mtl_rt::collective(f, &mtl_rt::exec_mma<TD, TA, TB, TC>);
}

}  // namespace metal

// ----- address spaces (last: they are macros) ---------------------------------------------------------

#define device
#define constant
#define thread
#define threadgroup static __attribute__((section("mtl_tg"), aligned(16)))

#endif  // MARLIN_METAL_SHIM_H
