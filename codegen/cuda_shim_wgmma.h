// cuda_shim_wgmma.h: Hopper's warpgroup MMA and split-phase barriers for the CPU shim (part of codegen/cuda_shim.h,
// which includes it before the kernel text). The harness (marlin_dsl/targets/cuda/cpu_harness_ptx.py)
// rewrites each inline-PTX statement of a printed kernel into a call of these functions; the
// rest of the text compiles as printed.
//
// Written from the PTX ISA (9.7.15, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"),
// not from marlin_dsl's Target tables:
//   wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16} d, a, b-desc, scale-d, ...
//   - the warpgroup (4 consecutive warps) computes D (64 x N) += A (64 x 16) B (16 x N); warp
//     w % 4 of it holds rows 16 (w % 4) .. + 15 of A (in registers) and of D;
//   - D, f32, N/2 registers a lane: register i at row g + 8 ((i >> 1) & 1), column
//     8 (i >> 2) + 2t + (i & 1) (9.7.15.5.1.1: "Register fragment for wgmma .m64nNk16 D"),
//     g = lane >> 2, t = lane % 4;
//   - A from registers: 4 registers a lane, register j at row g + 8 (j & 1), columns
//     2t + 8 (j >> 1) + {0, 1} (its low and high halves);
//   - A or B from shared memory through a 64-bit matrix descriptor (9.7.15.5.1.2): start address
//     >> 4 in bits [0, 14), stride byte offset >> 4 in [32, 46), base offset in [49, 52),
//     swizzle mode in [62, 64). Only K-major operands in 128-byte swizzled rows (mode 1, base
//     offset 0) are read here: a tile's rows lie in atoms of 8 rows x 128 bytes, atoms SBO
//     bytes apart; inside a row the 16-byte chunk index is XORed with the row's index in its
//     atom (address bits [4, 7) ^= bits [7, 10) of the shared-window address). B is given as
//     its transpose (N rows of K), A as M rows of K;
//   - scale-d = 1 (d += a b), the operands' scales 1 and both K-major (transpose 0): the only
//     forms the harness accepts.
// The products are exact in double, summed in double, rounded once to f32 per instruction, as
// the shim's mma.
// Asynchrony: the shim computes a wgmma when all 32 lanes of a warp have issued it (each warp
// its own 16 rows: warps of one warpgroup are not made to rendezvous with each other), reading
// shared memory then. wgmma.fence, commit_group and wait_group, and the async-proxy fence, order
// nothing further here: a kernel that rewrites a wgmma's shared operands before its wait, or
// reads its accumulator early, is not caught by the shim (the IR interpreter's wgmma rules are).
#ifndef MDSL_CUDA_SHIM_WGMMA_H
#define MDSL_CUDA_SHIM_WGMMA_H

namespace mdsl_cpu {

struct WgmmaArgs {
  float* const* d;    // N/2 accumulator registers (updated in place)
  const uint32_t* a;  // 4 registers, or null: A through a_desc
  uint64_t a_desc;
  uint64_t b_desc;
  int n;
  bool bf16;
};

struct SwizzledTile {
  uint32_t start;  // shared-window address of row 0, K 0
  uint32_t sbo;    // bytes between 8-row atoms
};

// The value of half `half` (0: low 16 bits) of a register holding two f16 or bf16 values (also
// cuda_shim_ptx.h's MMAs, included after the kernel).
inline double register_half(uint32_t reg, int half, bool bf16) {
  const uint16_t bits = static_cast<uint16_t>(half ? reg >> 16 : reg & 0xFFFFu);
  return bf16 ? static_cast<double>(bf16_bits_to_f32(bits)) : static_cast<double>(f16_bits_to_f32(bits));
}

inline SwizzledTile decode_descriptor(uint64_t desc, const char* operand, unsigned warp) {
  const unsigned mode = static_cast<unsigned>(desc >> 62), base = static_cast<unsigned>((desc >> 49) & 7u);
  if (mode != 1 || base != 0)
    fail(fmt("wgmma (warp %u): the %s descriptor %#llx has swizzle mode %u and base offset %u; the shim reads "
             "K-major tiles in 128-byte swizzled rows (mode 1, base offset 0) only",
             warp, operand, static_cast<unsigned long long>(desc), mode, base));
  return {static_cast<uint32_t>(desc & 0x3FFFu) << 4, static_cast<uint32_t>((desc >> 32) & 0x3FFFu) << 4};
}

inline double tile_element(const SwizzledTile& t, unsigned row, unsigned k, bool bf16) {
  uint32_t a = t.start + (row / 8) * t.sbo + (row % 8) * 128 + 2 * k;
  a ^= ((a >> 7) & 7u) << 4;
  uint16_t bits;
  std::memcpy(&bits, reinterpret_cast<const void*>(g_shared_base + a), 2);
  return register_half(bits, 0, bf16);
}

inline void exec_wgmma(Group* g, unsigned w) {
  auto args = [&](unsigned lane) -> const WgmmaArgs& {
    return *static_cast<const WgmmaArgs*>(g->fibers[w * 32 + lane].call.args);
  };
  const WgmmaArgs& first = args(0);
  for (unsigned lane = 1; lane < 32; ++lane) {
    const WgmmaArgs& m = args(lane);
    if (m.n != first.n || m.bf16 != first.bf16 || m.b_desc != first.b_desc || (m.a == nullptr) != (first.a == nullptr) ||
        (!m.a && m.a_desc != first.a_desc))
      fail(fmt("wgmma: lane %u of warp %u gives another shape or descriptor than lane 0 (block (%u, %u, %u))", lane, w,
               g->pos.x, g->pos.y, g->pos.z));
  }
  const int n = first.n;
  const bool bf16 = first.bf16;
  const unsigned row0 = 16 * (w % 4);  // this warp's rows of the warpgroup's 64
  double A[16][16];
  if (first.a == nullptr) {
    const SwizzledTile ta = decode_descriptor(first.a_desc, "A", w);
    for (unsigned r = 0; r < 16; ++r)
      for (unsigned k = 0; k < 16; ++k) A[r][k] = tile_element(ta, row0 + r, k, bf16);
  } else {
    for (unsigned lane = 0; lane < 32; ++lane) {
      const unsigned gid = lane >> 2, t = lane & 3u;
      for (unsigned j = 0; j < 4; ++j)
        for (int h = 0; h < 2; ++h) A[gid + 8 * (j & 1u)][2 * t + 8 * (j >> 1) + h] = register_half(args(lane).a[j], h, bf16);
    }
  }
  const SwizzledTile tb = decode_descriptor(first.b_desc, "B", w);
  static thread_local double B[16][256];
  for (int c = 0; c < n; ++c)
    for (unsigned k = 0; k < 16; ++k) B[k][c] = tile_element(tb, static_cast<unsigned>(c), k, bf16);
  for (unsigned lane = 0; lane < 32; ++lane) {
    const unsigned gid = lane >> 2, t = lane & 3u;
    for (int i = 0; i < n / 2; ++i) {
      const unsigned row = gid + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * t + (i & 1);
      double acc = static_cast<double>(*args(lane).d[i]);
      for (unsigned k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
      *args(lane).d[i] = static_cast<float>(acc);
    }
  }
}

// One lane's wgmma (the harness's rewrite of the inline PTX): A from registers (`a`, 4 words)
// or from shared memory (`a_desc`, with a == nullptr).
inline void wgmma(float* const* d, int n, bool bf16, const uint32_t* a, uint64_t a_desc, uint64_t b_desc,
                  std::source_location loc = std::source_location::current()) {
  if (n < 8 || n > 256 || n % 8)
    fail(fmt("wgmma: N = %d is not a multiple of 8 in 8..256 (%s)", n, where(g_group, g_fiber->tid).c_str()));
  WgmmaArgs args{d, a, a_desc, b_desc, n, bf16};
  collective(CALL_WGMMA, loc, &args, &exec_wgmma);
}

inline void wgmma_fence() {}
inline void wgmma_commit() {}
inline void wgmma_wait(int) {}
inline void fence_proxy_async() {}
inline void setmaxnreg(int) {}  // a register budget for ptxas: nothing to do on the CPU

// ----- split-phase barriers (mbarrier, PTX ISA 9.7.13.15) ----------------------------------------
// A barrier is the 8 bytes the kernel gives it in shared memory: here word 0 holds the arrivals
// still pending in the current phase, word 1 the phase's parity (bit 31) and the expected count.
// init sets the count (phase 0); each arrive counts one down, and the last of a phase starts
// the next (parity flipped, the count restored) and wakes the waiters; try_wait.parity P
// succeeds once the phase of parity P has completed, that is while the current parity is not
// P. Shared memory starts poisoned (0xFF): a barrier used before its init is an error.

constexpr uint32_t kMbarPhase = 0x80000000u;

inline uint32_t* mbar_words(const uint32_t* bar, const char* op) {
  auto* w = const_cast<uint32_t*>(bar);
  if (reinterpret_cast<uintptr_t>(bar) % 8)
    fail(fmt("%s: the mbarrier at %p is not 8-byte aligned (%s)", op, static_cast<const void*>(bar),
             where(g_group, g_fiber->tid).c_str()));
  const uint32_t expected = w[1] & ~kMbarPhase;
  if (expected == 0 || expected > (1u << 20) || w[0] > expected)
    fail(fmt("%s: the mbarrier at shared address %#x was not initialised (words %#x %#x; %s)", op,
             __cvta_generic_to_shared(bar), w[0], w[1], where(g_group, g_fiber->tid).c_str()));
  return w;
}

}  // namespace mdsl_cpu

namespace mdsl {

__device__ inline void mbar_init(const uint32_t* bar, uint32_t count) {
  if (count == 0 || count > (1u << 20))
    mdsl_cpu::fail(mdsl_cpu::fmt("mbarrier.init: count %u is not in 1..2^20 (%s)", count,
                                 mdsl_cpu::where(mdsl_cpu::g_group, mdsl_cpu::g_fiber->tid).c_str()));
  auto* w = const_cast<uint32_t*>(bar);
  w[0] = count;
  w[1] = count;
}

__device__ inline void mbar_arrive(const uint32_t* bar) {
  uint32_t* w = mdsl_cpu::mbar_words(bar, "mbarrier.arrive");
  if (--w[0] == 0) {
    w[1] ^= mdsl_cpu::kMbarPhase;
    w[0] = w[1] & ~mdsl_cpu::kMbarPhase;
    mdsl_cpu::wake(bar);
  }
}

__device__ inline void mbar_wait(const uint32_t* bar, uint32_t parity,
                                 std::source_location loc = std::source_location::current()) {
  for (;;) {
    const uint32_t* w = mdsl_cpu::mbar_words(bar, "mbarrier.try_wait.parity");
    if ((w[1] >> 31) != (parity & 1u)) return;
    mdsl_cpu::wait_for(bar, mdsl_cpu::CALL_MBAR_WAIT, loc);
  }
}

// The prelude's descriptor builder, which it leaves out of host builds (MDSL_HOST_LAYOUT_CHECK):
// the same encoding, over the shim's shared window.
template <uint32_t SBO>
inline uint64_t wgmma_desc_sw128(const void* p) {
  const uint32_t a = __cvta_generic_to_shared(p);
  return static_cast<uint64_t>(a >> 4) | (static_cast<uint64_t>(1) << 16) | (static_cast<uint64_t>(SBO >> 4) << 32) |
         (static_cast<uint64_t>(1) << 62);
}

}  // namespace mdsl

#endif  // MDSL_CUDA_SHIM_WGMMA_H
