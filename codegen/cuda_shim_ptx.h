// cuda_shim_ptx.h: the PTX instructions the prelude (codegen/cuda_prelude.cuh) wraps, as C++
// for the CPU shim (codegen/cuda_shim.h). Included after the kernel text, when the prelude's
// fragment types are complete.
//
// The lane layouts are written here from the PTX ISA's fragment rules, independently of
// marlin_dsl's Target tables (the packer, the lowering and the IR interpreter read those; an
// error shared by them cannot show in the interpreter, but it does here). Notation of the ISA:
// groupID g = %laneid >> 2, threadID_in_group t = %laneid % 4; register r of a fragment holds
// elements 2r (low 16 bits) and 2r + 1 (high 16 bits).
//
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 (PTX ISA 9.7.14.5.8,
// "Matrix Fragments for mma.m16n8k16 with floating point type"):
//   A (16 x 16), elements a0..a7:  row = g      for a0, a1, a4, a5;  g + 8 otherwise
//                                  col = 2t + (i & 1)  for a0..a3;   2t + (i & 1) + 8 for a4..a7
//   B (16 x 8),  elements b0..b3:  row = 2t + (i & 1) for b0, b1;    2t + (i & 1) + 8 for b2, b3
//                                  col = g
//   C, D (16 x 8, f32) c0..c3:     row = g for c0, c1;  g + 8 for c2, c3;   col = 2t + (i & 1)
// mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.{f16,bf16}.{f16,bf16}.f32
// (PTX ISA 9.7.14.6; the rules as quoted and hardware-checked in
// marlin_dsl/machine/cuda/sparse_layout.py's docstring):
//   A is 2:4 sparse along K and passed compressed: a0..a7 are the kept values, a_i and a_(i+1)
//     (i even) the two kept values of one 4-wide chunk, the lower element number holding the
//     lower column (9.7.14.6.2.2): row = g for a0, a1, a4, a5, g + 8 otherwise; chunk columns
//     4t .. 4t + 3 for a0..a3, 4t + 16 .. 4t + 19 for a4..a7.
//   B (32 x 8), b0..b7: row = 2t + (i & 1) + 8 (i >> 1), col = g (9.7.14.6.2.2).
//   C, D as for m16n8k16.
//   Metadata (9.7.14.6.1, 9.7.14.6.2.2): each chunk's two kept values have 2-bit in-chunk
//     indices, the first (lower) in the chunk's bits [1:0], the second in [3:2]; with
//     ::ordered_metadata they must increase (anything else is undefined: an error here). With
//     the sparsity selector F (0 or 1) the thread pair 4g' + 2F, 4g' + 2F + 1 supplies the
//     metadata: lane 4 (row % 8) + 2F + (chunk / 4) holds row `row` of the 16 x 32 A, rows
//     0..7 in bits [15:0], rows 8..15 in bits [31:16], chunk j's four bits at bit
//     16 (row / 8) + 4 (j % 4). The other lanes' words are not read.
// shfl.sync.bfly.b32 (PTX ISA 9.7.9.6; the printer's __shfl_xor_sync with a full mask): every
//   lane of the warp takes the 32-bit value of lane (lane ^ lane_mask); all 32 lanes must
//   arrive with the same lane_mask (a rendezvous, like mma).
// The products are exact in double and summed in double, then rounded once to f32 (the IR's
// rule for mma, docs/IR.md), so results do not depend on the hardware's adder tree.
//
// cp.async (PTX ISA 9.7.9.25): cp.async.{ca,cg}.shared.global [dst], [src], cp-size, src-size
// copies cp-size (4, 8, 16) bytes, both addresses aligned to cp-size; with src-size 0 (the
// prelude's false predicate) nothing is read and the destination is zero-filled. The copies a
// thread issued since its last cp.async.commit_group form a group; cp.async.wait_group N
// waits until at most the N most recent groups are pending. Here a copy reads its source when
// issued, fills its destination with 0xFF bytes (NaN: a read before the wait sees poison, not
// stale data) and writes the data when a wait_group of the issuing thread retires its group.
// A thread that exits with copies in flight is an error: on the GPU they may land after the
// block ends, in shared memory the next block on the SM owns (the multistage drain wait).
#ifndef MDSL_CUDA_SHIM_PTX_H
#define MDSL_CUDA_SHIM_PTX_H

namespace mdsl_cpu {

struct MmaArgs {
  const uint32_t* a;  // 4 registers
  const uint32_t* b;  // 2 (dense) or 4 (sparse) registers
  const float* c;     // 4
  float* d;           // 4
  uint32_t meta;
};

inline MmaArgs& lane_args(Group* g, unsigned w, unsigned lane) {
  return *static_cast<MmaArgs*>(g->fibers[w * 32 + lane].call.args);
}

// C in, D = A (16 x K) @ B (K x 8) + C out, every lane's four accumulator registers.
template <int K>
inline void multiply_accumulate(Group* g, unsigned w, const double (&A)[16][K], const double (&B)[K][8]) {
  for (unsigned lane = 0; lane < 32; ++lane) {
    const unsigned gid = lane >> 2, t = lane & 3u;
    MmaArgs& m = lane_args(g, w, lane);
    for (unsigned i = 0; i < 4; ++i) {
      const unsigned row = i < 2 ? gid : gid + 8, col = 2 * t + (i & 1u);
      double acc = (double)m.c[i];
      for (int k = 0; k < K; ++k) acc += A[row][k] * B[k][col];
      m.d[i] = (float)acc;
    }
  }
}

template <bool BF16>
inline void exec_mma(Group* g, unsigned w) {
  double A[16][16], B[16][8];
  for (unsigned lane = 0; lane < 32; ++lane) {
    const unsigned gid = lane >> 2, t = lane & 3u;
    const MmaArgs& m = lane_args(g, w, lane);
    for (unsigned i = 0; i < 8; ++i) {  // a_i
      const unsigned row = (i < 2 || (i >= 4 && i < 6)) ? gid : gid + 8;
      const unsigned col = 2 * t + (i & 1u) + (i >= 4 ? 8 : 0);
      A[row][col] = register_half(m.a[i / 2], (int)(i & 1u), BF16);
    }
    for (unsigned i = 0; i < 4; ++i) {  // b_i
      const unsigned row = 2 * t + (i & 1u) + (i >= 2 ? 8 : 0);
      B[row][gid] = register_half(m.b[i / 2], (int)(i & 1u), BF16);
    }
  }
  multiply_accumulate<16>(g, w, A, B);
}

template <bool BF16, int SEL>
inline void exec_mma_sp(Group* g, unsigned w) {
  double A[16][32] = {}, B[32][8];
  for (unsigned lane = 0; lane < 32; ++lane) {
    const unsigned gid = lane >> 2, t = lane & 3u;
    const MmaArgs& m = lane_args(g, w, lane);
    for (unsigned i = 0; i < 8; i += 2) {  // the pair a_i, a_(i+1): one chunk's kept values
      const unsigned row = (i < 2 || (i >= 4 && i < 6)) ? gid : gid + 8;
      const unsigned chunk = i < 4 ? t : t + 4;
      const unsigned meta_lane = 4 * (row % 8) + 2 * SEL + chunk / 4;
      const unsigned shift = 16 * (row / 8) + 4 * (chunk % 4);
      const uint32_t nibble = (lane_args(g, w, meta_lane).meta >> shift) & 0xFu;
      const unsigned first = nibble & 3u, second = nibble >> 2;
      if (first >= second)
        fail(fmt("mma.sp::ordered_metadata with selector %d: lane %u's metadata for row %u, columns %u..%u is "
                 "%#x (indices %u, %u): the two indices must increase (undefined on the GPU); warp %u of block "
                 "(%u, %u, %u)", SEL, meta_lane, row, 4 * chunk, 4 * chunk + 3, nibble, first, second, w,
                 g->pos.x, g->pos.y, g->pos.z));
      A[row][4 * chunk + first] = register_half(m.a[i / 2], 0, BF16);
      A[row][4 * chunk + second] = register_half(m.a[i / 2], 1, BF16);
    }
    for (unsigned i = 0; i < 8; ++i) {  // b_i
      const unsigned row = 2 * t + (i & 1u) + 8 * (i >> 1);
      B[row][gid] = register_half(m.b[i / 2], (int)(i & 1u), BF16);
    }
  }
  multiply_accumulate<32>(g, w, A, B);
}

struct ShflArgs {
  uint32_t value;
  int lane_mask;
  uint32_t result;
};

inline void exec_shfl_xor(Group* g, unsigned w) {
  auto args = [&](unsigned lane) -> ShflArgs& { return *static_cast<ShflArgs*>(g->fibers[w * 32 + lane].call.args); };
  const int lane_mask = args(0).lane_mask;
  for (unsigned lane = 0; lane < 32; ++lane)
    if (args(lane).lane_mask != lane_mask)
      fail(fmt("shfl.sync.bfly: lane %u of warp %u uses lane mask %d, lane 0 %d (block (%u, %u, %u))", lane, w,
               args(lane).lane_mask, lane_mask, g->pos.x, g->pos.y, g->pos.z));
  if (lane_mask <= 0 || lane_mask >= 32)
    fail(fmt("shfl.sync.bfly: lane mask %d is not in 1..31 (warp %u)", lane_mask, w));
  for (unsigned lane = 0; lane < 32; ++lane) args(lane).result = args(lane ^ (unsigned)lane_mask).value;
}

}  // namespace mdsl_cpu

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width, std::source_location loc) {
  static_assert(sizeof(T) == 4, "__shfl_xor_sync: the shim moves 32-bit values");
  if (mask != 0xFFFFFFFFu || width != 32)
    mdsl_cpu::fail(mdsl_cpu::fmt("__shfl_xor_sync with mask %#x, width %d: the shim shuffles whole warps only",
                                 mask, width));
  mdsl_cpu::ShflArgs args{0u, lane_mask, 0u};
  std::memcpy(&args.value, &var, 4);
  mdsl_cpu::collective(mdsl_cpu::CALL_SHFL, loc, &args, &mdsl_cpu::exec_shfl_xor);
  std::memcpy(&var, &args.result, 4);
  return var;
}

namespace mdsl {



inline frag_c mma(const frag_a<__half>& a, const frag_b<__half>& b, const frag_c& c, std::source_location loc) {
  frag_c d;
  mdsl_cpu::MmaArgs args{a.x, b.x, c.x, d.x, 0u};
  mdsl_cpu::collective(mdsl_cpu::CALL_MMA, loc, &args, &mdsl_cpu::exec_mma<false>);
  return d;
}

inline frag_c mma(const frag_a<__nv_bfloat16>& a, const frag_b<__nv_bfloat16>& b, const frag_c& c,
                  std::source_location loc) {
  frag_c d;
  mdsl_cpu::MmaArgs args{a.x, b.x, c.x, d.x, 0u};
  mdsl_cpu::collective(mdsl_cpu::CALL_MMA, loc, &args, &mdsl_cpu::exec_mma<true>);
  return d;
}

template <int SEL>
inline frag_c mma_sp(const frag_a<__half>& a, const frag_b32<__half>& b, const frag_c& c, uint32_t meta,
                     std::source_location loc) {
  static_assert(SEL == 0 || SEL == 1, "mma_sp: the m16n8k32 sparsity selector is 0 or 1");
  frag_c d;
  mdsl_cpu::MmaArgs args{a.x, b.x, c.x, d.x, meta};
  mdsl_cpu::collective(mdsl_cpu::CALL_MMA_SP, loc, &args, &mdsl_cpu::exec_mma_sp<false, SEL>);
  return d;
}

template <int SEL>
inline frag_c mma_sp(const frag_a<__nv_bfloat16>& a, const frag_b32<__nv_bfloat16>& b, const frag_c& c,
                     uint32_t meta, std::source_location loc) {
  static_assert(SEL == 0 || SEL == 1, "mma_sp: the m16n8k32 sparsity selector is 0 or 1");
  frag_c d;
  mdsl_cpu::MmaArgs args{a.x, b.x, c.x, d.x, meta};
  mdsl_cpu::collective(mdsl_cpu::CALL_MMA_SP, loc, &args, &mdsl_cpu::exec_mma_sp<true, SEL>);
  return d;
}

template <int BYTES>
inline void cp_async(void* dst, const void* src, bool pred) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async moves 4, 8 or 16 bytes");
  mdsl_cpu::Fiber* f = mdsl_cpu::g_fiber;
  if (reinterpret_cast<uintptr_t>(dst) % BYTES || (pred && reinterpret_cast<uintptr_t>(src) % BYTES))
    mdsl_cpu::fail(mdsl_cpu::fmt("cp.async of %d bytes from %p to %p: both addresses must be aligned to %d (%s)",
                                 BYTES, src, dst, BYTES, mdsl_cpu::where(f->group, f->tid).c_str()));
  mdsl_cpu::AsyncCopy copy;
  copy.dst = static_cast<unsigned char*>(dst);
  copy.bytes = BYTES;
  if (pred)
    std::memcpy(copy.data, src, BYTES);
  else
    std::memset(copy.data, 0, BYTES);  // src-size 0: zero-fill, nothing read
  std::memset(dst, 0xFF, BYTES);       // in flight: what a premature read finds
  mdsl_cpu::async_queue(f).uncommitted.push_back(copy);
}

inline void cp_async_commit() {
  mdsl_cpu::AsyncQueue& q = mdsl_cpu::async_queue(mdsl_cpu::g_fiber);
  q.groups.push_back(std::move(q.uncommitted));
  q.uncommitted.clear();
}

template <int N>
inline void cp_async_wait() {
  mdsl_cpu::AsyncQueue& q = mdsl_cpu::async_queue(mdsl_cpu::g_fiber);
  while (q.groups.size() > (size_t)N) {
    for (const mdsl_cpu::AsyncCopy& c : q.groups.front()) std::memcpy(c.dst, c.data, (size_t)c.bytes);
    q.groups.erase(q.groups.begin());
  }
}

}  // namespace mdsl

#endif  // MDSL_CUDA_SHIM_PTX_H
