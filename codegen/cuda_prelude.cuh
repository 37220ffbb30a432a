// cuda_prelude.cuh: device helpers shared by every kernel that marlin_dsl.targets.cuda.printer prints.
//
// The printer embeds this file verbatim at the top of a kernel's `header` (the text MLX's
// `mx.fast.cuda_kernel` places before its generated `__global__` function), so it must compile
// under NVRTC (MLX's JIT: no host headers, C++17, device code only) and under nvcc. The include
// guard lets several printed kernels share one translation unit (the nvcc checks do that).
//
// What it holds, and nothing format-specific:
//   - warp-level MMA fragments for PTX `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}` in the
//     registers each lane owns (PTX ISA 9.7.14.5.8, "Matrix Fragments for mma.m16n8k16 with
//     floating point type"), with lane = 4 * groupID + threadID_in_group:
//       A 16x16 (4 x .b32, 2 elements each, lower column in the low half):
//         x[0] = (g, 2t..2t+1)  x[1] = (g+8, 2t..2t+1)  x[2] = (g, 2t+8..2t+9)  x[3] = (g+8, 2t+8..2t+9)
//       B 16x8 (k x n, 2 x .b32, lower row in the low half):
//         x[0] = (2t..2t+1, g)  x[1] = (2t+8..2t+9, g)
//       C 16x8 f32 (4 floats):
//         x[0], x[1] = (g, 2t), (g, 2t+1)   x[2], x[3] = (g+8, 2t), (g+8, 2t+1)
//   - load_a / load_b: every lane reads its own elements of tile[r][c] = p[r * LD + c]
//     (TRANS: p[c * LD + r]); two elements adjacent in memory are read as one 32-bit word when
//     the address allows it (same values either way).
//   - store_c: every lane writes its four accumulator elements, converted to the memory type
//     with round-to-nearest-even.
//   - mma: the PTX instruction as inline asm (f32 accumulate; f16 or bf16 inputs).
//   - 2:4 sparse MMA, PTX `mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.{f16,bf16}`
//     (PTX ISA 9.7.14.6; the layout, checked on an H100, is marlin_dsl/machine/cuda/sparse_layout.py):
//       A: the compressed 16x16 tile (two kept values per 4 logical columns) in frag_a's layout;
//       B 32x8 (k x n, 4 x .b32, lower row in the low half): frag_b32,
//         x[r] = (2t + 8r .. 2t + 8r + 1, g), r = 0..3;
//       C as for mma; one .b32 metadata word per lane and an immediate selector F in {0, 1}:
//       lanes 4g + 2F + h (h = 0, 1) supply the 2-bit indices of rows g (bits 15:0) and g + 8
//       (bits 31:16), groups 4h..4h+3, the other lanes' words are not read.
//     load_b32 / mma_sp<F> as load_b / mma.
//   - vec<T, N>: the IR's short vectors.
#ifndef MARLIN_DSL_CUDA_PRELUDE
#define MARLIN_DSL_CUDA_PRELUDE

#ifndef __CUDACC_RTC__
#include <cstdint>
#endif
#ifndef MDSL_HOST_HALF_TYPES  // the host layout check may bring stand-ins when CUDA is absent
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace mdsl {

// Aligned to its size where that is 4, 8 or 16 bytes, so a vload is one vector access; to 16
// where it is a multiple of 16, so a vload is that many 128-bit accesses from one address.
template <typename T, int N>
struct alignas((sizeof(T) * N == 4 || sizeof(T) * N == 8 || sizeof(T) * N == 16) ? sizeof(T) * N
               : (sizeof(T) * N) % 16 == 0                                      ? 16
                                                                                  : alignof(T)) vec {
  T v[N];
};

// An all-zero vector (what a vload with a false predicate gives). NVRTC has no memset.
template <typename V>
__device__ __forceinline__ V zero_vec() {
  return V{};  // mdsl::vec: aggregate, every element value-initialised to zero
}

template <typename T>
struct frag_a {
  uint32_t x[4];
};

template <typename T>
struct frag_b {
  uint32_t x[2];
};

// B of the sparse m16n8k32 (32 x 8, k x n).
template <typename T>
struct frag_b32 {
  uint32_t x[4];
};

struct frag_c {
  float x[4];
};

// One warp's accumulator of the warpgroup MMA wgmma.mma_async m64nNk16 (sm_90a): its 16 rows x
// N columns, N/2 floats per lane, register i at row g + 8 ((i >> 1) & 1), column 8 (i >> 2) +
// 2t + (i & 1) (PTX ISA 9.7.15.5; marlin_dsl/machine/cuda/wgmma_layout.py, checked on an H100).
template <int N>
struct frag_cw {
  float x[N / 2];
};

template <int N>
__device__ __forceinline__ frag_cw<N> zero_cw() {
  return frag_cw<N>{};  // aggregate: every element value-initialised to zero
}

// The 64-bit shared-memory matrix descriptor of a wgmma operand stored K-major in 128-byte
// swizzled rows (PTX ISA 9.7.15.5.1): start address >> 4 in bits [0, 14), leading byte offset
// 16 >> 4 (unused by the swizzled K-major layout) in [16, 30), stride byte offset SBO >> 4 (the
// distance of 8-row atoms) in [32, 46), base offset 0 (atoms are SBO-aligned), swizzle mode 1
// (128 bytes) in [62, 64). bench/probes/wgmma_probe.py checked these encodings on an H100.
#ifndef MDSL_HOST_LAYOUT_CHECK  // a host build of this file has no shared address space
template <uint32_t SBO>
__device__ __forceinline__ uint64_t wgmma_desc_sw128(const void* p) {
  // A shared-window address is below 2^18 (228 KB on sm_90): no mask, so that descriptors of
  // tiles a constant apart differ by a constant (ptxas adds instead of recomputing).
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return static_cast<uint64_t>(a >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(SBO >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}
#endif  // not MDSL_HOST_LAYOUT_CHECK (wgmma_desc_sw128)

__device__ __forceinline__ uint32_t lane_id() {
  return threadIdx.x % 32u;
}

__device__ __forceinline__ uint32_t bits16(__half v) {
  return __half_as_ushort(v);
}

__device__ __forceinline__ uint32_t bits16(__nv_bfloat16 v) {
  return __bfloat16_as_ushort(v);
}

// A half2 / bfloat162 and the 32-bit word holding it (element 0 in the low half). A bit cast,
// as cuda_fp16.hpp's own __HALF2_TO_UI: building the word with shifts and ORs made ptxas emit
// one PRMT per pair (46 of 198 instructions in a 4-bit M = 1 weight-stream loop, bench/probes/sass_count.py).
__device__ __forceinline__ uint32_t pair_bits(__half2 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t pair_bits(__nv_bfloat162 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t pack2(__half lo, __half hi) {
  return pair_bits(__halves2half2(lo, hi));
}

__device__ __forceinline__ uint32_t pack2(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return pair_bits(__halves2bfloat162(lo, hi));
}

// Word I of a vector of 16-bit elements (elements 2I and 2I + 1, the lower in the low half):
// what frag_build reads when a fragment register holds two adjacent elements of one vload.
template <int I, typename T, int N>
__device__ __forceinline__ uint32_t vec_word(const vec<T, N>& v) {
  static_assert(sizeof(T) == 2 && 2 * I + 1 < N, "vec_word: a word of a vector of 16-bit elements");
  return reinterpret_cast<const uint32_t*>(v.v)[I];
}

// The IR's lop3: result bit i = bit (4 a_i + 2 b_i + c_i) of LUT. As PTX's own lop3.b32, so
// that ptxas keeps it one LOP3 where two of the operands are constants: written as C, a mask
// and an OR with two immediates become two LOP3s (LOP3 takes one immediate), e.g. an integer
// code's AND with its mask and OR with the f16 magic number (lowering/pair_decode.py).
template <int LUT>
__device__ __forceinline__ uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, %4;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(LUT));
  return d;
#else
  uint32_t d = 0u;
  for (int i = 0; i < 8; ++i) {
    if ((LUT >> i) & 1) {
      d |= ((i & 4) ? a : ~a) & ((i & 2) ? b : ~b) & ((i & 1) ? c : ~c);
    }
  }
  return d;
#endif
}

template <typename P>
__device__ __forceinline__ P bits_to_pair(uint32_t w);

template <>
__device__ __forceinline__ __half2 zero_vec<__half2>() {
  return __halves2half2(__ushort_as_half((unsigned short)0u), __ushort_as_half((unsigned short)0u));
}

template <>
__device__ __forceinline__ __nv_bfloat162 zero_vec<__nv_bfloat162>() {
  return __halves2bfloat162(__ushort_as_bfloat16((unsigned short)0u), __ushort_as_bfloat16((unsigned short)0u));
}

template <>
__device__ __forceinline__ __half2 bits_to_pair<__half2>(uint32_t w) {
  return *reinterpret_cast<const __half2*>(&w);
}

template <>
__device__ __forceinline__ __nv_bfloat162 bits_to_pair<__nv_bfloat162>(uint32_t w) {
  return *reinterpret_cast<const __nv_bfloat162*>(&w);
}

template <typename T>
__device__ __forceinline__ bool aligned4(const T* p) {
  return (reinterpret_cast<unsigned long long>(p) & 3ull) == 0ull;
}

// (tile[r][c], tile[r][c+1]) packed, tile[r][c] = p[r * LD + c]; `wide` allows one 32-bit read.
template <int LD, typename T>
__device__ __forceinline__ uint32_t pair_along_row(const T* p, uint32_t r, uint32_t c, bool wide) {
  const T* q = p + r * LD + c;
  if (wide) {
    return *reinterpret_cast<const uint32_t*>(q);
  }
  return pack2(q[0], q[1]);
}

// (tile[r][c], tile[r+1][c]) packed.
template <int LD, typename T>
__device__ __forceinline__ uint32_t pair_down_column(const T* p, uint32_t r, uint32_t c) {
  const T* q = p + r * LD + c;
  return pack2(q[0], q[LD]);
}

template <int LD, bool TRANS, typename T>
__device__ __forceinline__ frag_a<T> load_a(const T* p) {
  const uint32_t lane = lane_id(), g = lane >> 2, t = lane & 3u;
  frag_a<T> f;
  if (!TRANS) {
    const bool wide = (LD % 2 == 0) && aligned4(p);
    f.x[0] = pair_along_row<LD>(p, g, 2u * t, wide);
    f.x[1] = pair_along_row<LD>(p, g + 8u, 2u * t, wide);
    f.x[2] = pair_along_row<LD>(p, g, 2u * t + 8u, wide);
    f.x[3] = pair_along_row<LD>(p, g + 8u, 2u * t + 8u, wide);
  } else {  // tile[r][c] = p[c * LD + r]: the pair (r, c), (r, c+1) runs down a stored column
    f.x[0] = pair_down_column<LD>(p, 2u * t, g);
    f.x[1] = pair_down_column<LD>(p, 2u * t, g + 8u);
    f.x[2] = pair_down_column<LD>(p, 2u * t + 8u, g);
    f.x[3] = pair_down_column<LD>(p, 2u * t + 8u, g + 8u);
  }
  return f;
}

template <int LD, bool TRANS, typename T>
__device__ __forceinline__ frag_b<T> load_b(const T* p) {
  const uint32_t lane = lane_id(), g = lane >> 2, t = lane & 3u;
  frag_b<T> f;
  if (!TRANS) {  // tile[k][n] = p[k * LD + n]: the pair (k, n), (k+1, n) is LD apart
    f.x[0] = pair_down_column<LD>(p, 2u * t, g);
    f.x[1] = pair_down_column<LD>(p, 2u * t + 8u, g);
  } else {  // tile[k][n] = p[n * LD + k]: the pair is adjacent
    const bool wide = (LD % 2 == 0) && aligned4(p);
    f.x[0] = pair_along_row<LD>(p, g, 2u * t, wide);
    f.x[1] = pair_along_row<LD>(p, g, 2u * t + 8u, wide);
  }
  return f;
}

template <int LD, bool TRANS, typename T>
__device__ __forceinline__ frag_b32<T> load_b32(const T* p) {
  const uint32_t lane = lane_id(), g = lane >> 2, t = lane & 3u;
  frag_b32<T> f;
  const bool wide = (LD % 2 == 0) && aligned4(p);
  for (uint32_t r = 0; r < 4u; ++r) {
    if (!TRANS) {  // tile[k][n] = p[k * LD + n]
      f.x[r] = pair_down_column<LD>(p, 2u * t + 8u * r, g);
    } else {  // tile[k][n] = p[n * LD + k]
      f.x[r] = pair_along_row<LD>(p, g, 2u * t + 8u * r, wide);
    }
  }
  return f;
}

template <typename D>
__device__ __forceinline__ D from_f32(float v);

template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}

template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}

template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <int LD, typename D>
__device__ __forceinline__ void store_c(D* p, const frag_c& f) {
  const uint32_t lane = lane_id(), g = lane >> 2, t = lane & 3u;
  D* top = p + g * LD + 2u * t;
  D* bottom = p + (g + 8u) * LD + 2u * t;
  top[0] = from_f32<D>(f.x[0]);
  top[1] = from_f32<D>(f.x[1]);
  bottom[0] = from_f32<D>(f.x[2]);
  bottom[1] = from_f32<D>(f.x[3]);
}

__device__ __forceinline__ frag_c zero_c() {
  frag_c f;
  f.x[0] = 0.0f;
  f.x[1] = 0.0f;
  f.x[2] = 0.0f;
  f.x[3] = 0.0f;
  return f;
}

#ifndef MDSL_HOST_LAYOUT_CHECK  // a host build of this file (tests/test_cuda_backend.py) has no PTX
__device__ __forceinline__ frag_c mma(const frag_a<__half>& a, const frag_b<__half>& b, const frag_c& c) {
  frag_c d;
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d.x[0]), "=f"(d.x[1]), "=f"(d.x[2]), "=f"(d.x[3])
      : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]),
        "f"(c.x[0]), "f"(c.x[1]), "f"(c.x[2]), "f"(c.x[3]));
  return d;
}

__device__ __forceinline__ frag_c mma(const frag_a<__nv_bfloat16>& a, const frag_b<__nv_bfloat16>& b,
                                      const frag_c& c) {
  frag_c d;
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d.x[0]), "=f"(d.x[1]), "=f"(d.x[2]), "=f"(d.x[3])
      : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]),
        "f"(c.x[0]), "f"(c.x[1]), "f"(c.x[2]), "f"(c.x[3]));
  return d;
}

// D = A @ B + C with A 2:4 sparse: compressed in `a`, the kept values' positions in the lanes'
// `meta` words. SEL, the sparsity selector, must be an immediate in the instruction ("n").
template <int SEL>
__device__ __forceinline__ frag_c mma_sp(const frag_a<__half>& a, const frag_b32<__half>& b, const frag_c& c,
                                         uint32_t meta) {
  static_assert(SEL == 0 || SEL == 1, "mma_sp: the m16n8k32 sparsity selector is 0 or 1");
  frag_c d;
  asm volatile(
      "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9, %10, %11}, {%12, %13, %14, %15}, %16, %17;\n"
      : "=f"(d.x[0]), "=f"(d.x[1]), "=f"(d.x[2]), "=f"(d.x[3])
      : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]), "r"(b.x[2]),
        "r"(b.x[3]), "f"(c.x[0]), "f"(c.x[1]), "f"(c.x[2]), "f"(c.x[3]), "r"(meta), "n"(SEL));
  return d;
}

template <int SEL>
__device__ __forceinline__ frag_c mma_sp(const frag_a<__nv_bfloat16>& a, const frag_b32<__nv_bfloat16>& b,
                                         const frag_c& c, uint32_t meta) {
  static_assert(SEL == 0 || SEL == 1, "mma_sp: the m16n8k32 sparsity selector is 0 or 1");
  frag_c d;
  asm volatile(
      "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9, %10, %11}, {%12, %13, %14, %15}, %16, %17;\n"
      : "=f"(d.x[0]), "=f"(d.x[1]), "=f"(d.x[2]), "=f"(d.x[3])
      : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]), "r"(b.x[2]),
        "r"(b.x[3]), "f"(c.x[0]), "f"(c.x[1]), "f"(c.x[2]), "f"(c.x[3]), "r"(meta), "n"(SEL));
  return d;
}

// Asynchronous global -> shared copies (sm_80+). BYTES is 4, 8 or 16; with `pred` false the
// destination is zero-filled and nothing is read (src-size 0). 16-byte copies bypass L1 (.cg).
template <int BYTES>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool pred) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async moves 4, 8 or 16 bytes");
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const int src_bytes = pred ? BYTES : 0;
  if (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(d), "l"(src), "n"(BYTES), "r"(src_bytes)
                 : "memory");
  }
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Split-phase barriers in shared memory (PTX ISA 9.7.13.15, sm_90 for try_wait): the warp
// roles of a specialised kernel meet only here (IR ops mbarrier_init / _arrive / _wait).
// A barrier is two u32 words of an mbarrier array (8 bytes, aligned to 8).
__device__ __forceinline__ void mbar_init(const uint32_t* bar, uint32_t count) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(count) : "memory");
}

// This thread's arrival (release: its earlier memory accesses, to the phase's waiters).
__device__ __forceinline__ void mbar_arrive(const uint32_t* bar) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(a) : "memory");
}

// Wait until the phase of this parity (the current one or the one before) has completed
// (acquire). try_wait suspends the thread in hardware until the phase completes or the time
// hint (ns) runs out: without the hint the waiting warps spun, and their retries took issue
// slots from the warps they waited for (bench/results/issue15_h100_2026-11-27: 12 M retries
// against 0.2 M producer steps in one warp-role kernel).
__device__ __forceinline__ void mbar_wait(const uint32_t* bar, uint32_t parity) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(a), "r"(parity), "r"(10000000u)
        : "memory");
  } while (!done);
}
#endif  // MDSL_HOST_LAYOUT_CHECK

}  // namespace mdsl

#endif  // MARLIN_DSL_CUDA_PRELUDE
