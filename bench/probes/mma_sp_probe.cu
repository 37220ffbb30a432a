// Hardware probe for the register layout of
//   mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.{f16,bf16}.{f16,bf16}.f32
// modelled by marlin_dsl/machine/cuda/sparse_layout.py.  Driven by bench/probes/mma_sp_probe.py,
// which writes the per-lane registers and reads back the per-lane D registers; this program
// embeds no layout knowledge of its own: it only feeds registers to the instruction.
//
// Usage: mma_sp_probe IN.bin OUT.bin
//   IN.bin : int32 ncases, then per case:
//              int32 kind (bit 0: selector F, bit 1: bf16), int32 pad,
//              uint32 a[32][4], uint32 b[32][4], float c[32][4], uint32 meta[32]
//   OUT.bin: per case float d[32][4]
// Build: nvcc -arch=sm_90 -o mma_sp_probe mma_sp_probe.cu   (sm_80 and later)
//        add -DMMA_SP_UNORDERED for toolkits older than CUDA 12.5 / PTX 8.5, which lack
//        ::ordered_metadata (the plain mma.sp form accepts the same ordered metadata).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

#ifdef MMA_SP_UNORDERED
#define MMA_SP_OP "mma.sp.sync.aligned.m16n8k32.row.col.f32."
#else
#define MMA_SP_OP "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32."
#endif

struct Case {
  int32_t kind;
  int32_t pad;
  uint32_t a[32][4];
  uint32_t b[32][4];
  float c[32][4];
  uint32_t meta[32];
};

// The sparsity selector must be an immediate (PTX ISA 9.7.14.6.1 "Sparse matrix storage";
// ptxas rejects a register), hence one asm statement per (type, selector).
#define MMA_SP(TYPES, SEL)                                                              \
  asm volatile(MMA_SP_OP TYPES " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, "        \
               "{%12,%13,%14,%15}, %16, " SEL ";\n"                                       \
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                           \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),        \
                 "r"(b[2]), "r"(b[3]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]),        \
                 "r"(e))

__global__ void probe(const Case* cases, float* out) {
  const Case& cs = cases[blockIdx.x];
  const int lane = threadIdx.x;
  uint32_t a[4], b[4];
  float c[4], d[4];
  for (int i = 0; i < 4; ++i) {
    a[i] = cs.a[lane][i];
    b[i] = cs.b[lane][i];
    c[i] = cs.c[lane][i];
    d[i] = -12345.0f;
  }
  const uint32_t e = cs.meta[lane];
  switch (cs.kind) {  // uniform across the warp
    case 0: MMA_SP("f16.f16.f32", "0x0"); break;
    case 1: MMA_SP("f16.f16.f32", "0x1"); break;
    case 2: MMA_SP("bf16.bf16.f32", "0x0"); break;
    case 3: MMA_SP("bf16.bf16.f32", "0x1"); break;
    default: break;
  }
  for (int i = 0; i < 4; ++i) out[(blockIdx.x * 32 + lane) * 4 + i] = d[i];
}

#define CHECK(x)                                                                     \
  do {                                                                               \
    cudaError_t err_ = (x);                                                          \
    if (err_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(err_),     \
                   __FILE__, __LINE__);                                              \
      return 2;                                                                      \
    }                                                                                \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IN.bin OUT.bin\n", argv[0]);
    return 2;
  }
  FILE* f = std::fopen(argv[1], "rb");
  if (!f) { std::perror(argv[1]); return 2; }
  int32_t n = 0;
  if (std::fread(&n, sizeof n, 1, f) != 1 || n <= 0 || n > 4096) {
    std::fprintf(stderr, "bad case count\n");
    return 2;
  }
  std::vector<Case> cases(n);
  if (std::fread(cases.data(), sizeof(Case), n, f) != (size_t)n) {
    std::fprintf(stderr, "short input file\n");
    return 2;
  }
  std::fclose(f);

  int dev = 0;
  cudaDeviceProp prop;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);

  Case* d_cases = nullptr;
  float* d_out = nullptr;
  CHECK(cudaMalloc(&d_cases, sizeof(Case) * n));
  CHECK(cudaMalloc(&d_out, sizeof(float) * n * 32 * 4));
  CHECK(cudaMemcpy(d_cases, cases.data(), sizeof(Case) * n, cudaMemcpyHostToDevice));
  probe<<<n, 32>>>(d_cases, d_out);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> out(n * 32 * 4);
  CHECK(cudaMemcpy(out.data(), d_out, sizeof(float) * out.size(), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(d_cases));
  CHECK(cudaFree(d_out));

  FILE* g = std::fopen(argv[2], "wb");
  if (!g) { std::perror(argv[2]); return 2; }
  std::fwrite(out.data(), sizeof(float), out.size(), g);
  std::fclose(g);
  return 0;
}
