// cuda_shim.h: compile the CUDA text marlin_dsl.targets.cuda.printer prints with g++ (C++20)
// and run it on the CPU (marlin_dsl/targets/cuda/cpu_harness.py builds the translation unit).
//
// The translation unit is:
//     #include "cuda_shim.h"              this file: CUDA's vocabulary for g++
//     [the dynamic shared-memory block, where the kernel has one]
//     <CudaSource.full_source()>          the printed text, byte for byte: the prelude
//                                         codegen/cuda_prelude.cuh, the tables, the kernel
//     #include "cuda_shim_ptx.h"          the PTX the prelude wraps, as C++ (see there)
//     <a launcher>                        extern "C" entry points for ctypes
//
// What is shimmed, and how (nothing in the printed text is rewritten):
//   - the prelude is compiled as it ships, with MDSL_HOST_HALF_TYPES (it then includes no CUDA
//     header: the 16-bit float types come from cuda_shim_half.h) and MDSL_HOST_LAYOUT_CHECK,
//     its own switch that leaves out the functions holding inline PTX (mma, mma_sp, cp_async*,
//     cp_async_commit, cp_async_wait, wgmma_desc_sw128); this file declares mma, mma_sp and
//     the cp.async functions with the prelude's signatures (plus a defaulted call site), and
//     cuda_shim_ptx.h defines them from the PTX ISA. lop3 takes the prelude's own C branch
//     (no __CUDA_ARCH__). Kernels whose body holds inline asm (wgmma, the async-proxy fence:
//     the warpgroup pipeline, sm_90a) are refused by the Python driver before compiling.
//   - __global__, __device__, __host__ and __launch_bounds__(...) expand to nothing,
//     __forceinline__ to inline, __align__(n) to the aligned attribute, __restrict__ to __restrict.
//   - __shared__ expands to thread_local (and `used`, so that g++ does not fold reads of an
//     array the kernel never writes to zeros): a block-scope thread_local array has static storage
//     (one per OS thread, and every fiber of a block runs on the launching thread, so the
//     block's threads share it), and `extern __shared__ ... mdsl_smem[]` stays a valid
//     declaration of the dynamic block, which the harness defines before the kernel. The
//     runtime poisons this library's whole thread-local block (0xFF) before every block.
//   - threadIdx, blockIdx, blockDim, gridDim read the running fiber's and block's indices;
//     __syncthreads is a block barrier, __syncwarp a warp rendezvous (codegen/shim_runtime.h,
//     the runtime shared with the Metal shim; CUDA's part of it in cuda_shim_runtime.h);
//     __threadfence(_block) are no-ops (fibers switch only at synchronisation points, so
//     every write is visible to every later read); atomicAdd is a plain read-modify-write for
//     the same reason; __ldcg is a plain load.
// Warp shuffles are not provided: the IR has no shuffle op, so the printer never emits one.
#ifndef MDSL_CUDA_SHIM_H
#define MDSL_CUDA_SHIM_H

#pragma GCC diagnostic ignored "-Wattributes"
#pragma GCC diagnostic ignored "-Wunused-variable"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"

#include <cstdint>
#include <source_location>

#include "cuda_shim_half.h"
#include "cuda_shim_runtime.h"

#define MDSL_CPU_SHIM 1
#define MDSL_HOST_HALF_TYPES 1
#define MDSL_HOST_LAYOUT_CHECK 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)  // a register limit for ptxas: nothing to do on the CPU
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ thread_local __attribute__((used))  // used: never folded as never written

#define threadIdx (::mdsl_cpu::dim3_t{::mdsl_cpu::g_fiber->tid, 0u, 0u})
#define blockIdx (::mdsl_cpu::g_group->pos)
#define blockDim (::mdsl_cpu::dim3_t{::mdsl_cpu::g_group->T, 1u, 1u})
#define gridDim (::mdsl_cpu::g_group->dims)
#define warpSize 32

// Read (with the anchor) to allocate this library's thread-local block before it is poisoned.
static thread_local unsigned char mdsl_cpu_tls_anchor;

inline void __syncthreads(std::source_location loc = std::source_location::current()) {
  mdsl_cpu::block_barrier(mdsl_cpu::Site::of(loc));
}

inline void __syncwarp(unsigned mask = 0xFFFFFFFFu, std::source_location loc = std::source_location::current()) {
  if (mask != 0xFFFFFFFFu)
    mdsl_cpu::fail(mdsl_cpu::fmt("__syncwarp with mask %#x: the shim synchronises whole warps only", mask));
  mdsl_cpu::collective(mdsl_cpu::CALL_SYNCWARP, loc, nullptr, nullptr);
}

// __shfl_xor_sync (full mask, width 32) for the 32-bit types the printer shuffles; defined in
// cuda_shim_ptx.h (a warp rendezvous).
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32,
                         std::source_location loc = std::source_location::current());

// Shared-window addresses (what wgmma descriptors and swizzles use): offsets from a
// 1024-aligned base below the block's shared memory (cuda_shim_runtime.h).
inline uint32_t __cvta_generic_to_shared(const void* p) {
  return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p) - mdsl_cpu::g_shared_base);
}

#include "cuda_shim_wgmma.h"  // wgmma, its fences and descriptors (needs __cvta_generic_to_shared)

inline void __threadfence() {}
inline void __threadfence_block() {}

template <typename T> inline T __ldcg(const T* p) { return *p; }

template <typename T> inline T atomicAdd(T* p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}

// The prelude's PTX wrappers (left out under MDSL_HOST_LAYOUT_CHECK), defined in
// cuda_shim_ptx.h after the kernel. The trailing call site tells a warp's lanes apart by
// where they are, as a rendezvous needs.
namespace mdsl {
template <typename T> struct frag_a;
template <typename T> struct frag_b;
template <typename T> struct frag_b32;
struct frag_c;

inline frag_c mma(const frag_a<__half>& a, const frag_b<__half>& b, const frag_c& c,
                  std::source_location loc = std::source_location::current());
inline frag_c mma(const frag_a<__nv_bfloat16>& a, const frag_b<__nv_bfloat16>& b, const frag_c& c,
                  std::source_location loc = std::source_location::current());
template <int SEL>
inline frag_c mma_sp(const frag_a<__half>& a, const frag_b32<__half>& b, const frag_c& c, uint32_t meta,
                     std::source_location loc = std::source_location::current());
template <int SEL>
inline frag_c mma_sp(const frag_a<__nv_bfloat16>& a, const frag_b32<__nv_bfloat16>& b, const frag_c& c,
                     uint32_t meta, std::source_location loc = std::source_location::current());
template <int BYTES>
inline void cp_async(void* dst, const void* src, bool pred);
inline void cp_async_commit();
template <int N>
inline void cp_async_wait();
}  // namespace mdsl

#endif  // MDSL_CUDA_SHIM_H
