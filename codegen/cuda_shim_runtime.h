// cuda_shim_runtime.h: what runs one launch of a printed CUDA kernel on the CPU (part of
// codegen/cuda_shim.h): the shared runtime (codegen/shim_runtime.h: fibers, seeded
// scheduling, barriers, warp rendezvous, faults and the timeout) in CUDA's words, with what
// only CUDA has:
//   - its warp-collective operations (__syncwarp, mma.sync, mma.sp, shfl.sync: the last lane to arrive
//     performs the operation for the warp, see cuda_shim_ptx.h);
//   - each thread's cp.async copies in flight (cuda_shim_ptx.h), which must all have landed
//     when the thread exits;
//   - shared memory: this library's thread-local storage (cuda_shim.h: `__shared__` is
//     thread_local), so before every block the whole thread-local block of the library, found
//     with dl_iterate_phdr, is filled with 0xFF bytes (NaN in f16, bf16 and f32): a read of
//     shared memory that no thread of the block wrote sees NaN. That is why nothing of the
//     runtime is thread_local.
#ifndef MDSL_CUDA_SHIM_RUNTIME_H
#define MDSL_CUDA_SHIM_RUNTIME_H

#include <dlfcn.h>
#include <link.h>

#define MDSL_SHIM_NAMESPACE mdsl_cpu
#include "shim_runtime.h"

namespace mdsl_cpu {

typedef Dim3 dim3_t;

enum CallKind { CALL_NONE = 0, CALL_SYNCWARP, CALL_MMA, CALL_MMA_SP, CALL_SHFL, CALL_WGMMA, CALL_MBAR_WAIT };
inline const char* call_name(int k) {
  static const char* names[] = {"-", "__syncwarp", "mma.sync m16n8k16", "mma.sp m16n8k32", "shfl.sync.bfly",
                                "wgmma.mma_async", "mbarrier.try_wait.parity"};
  return names[k];
}

// One cp.async in flight: the bytes it will write (read at issue: the source is read-only
// global memory during the launch) and where.
struct AsyncCopy {
  unsigned char* dst;
  unsigned char data[16];
  int bytes;
};

// A thread's cp.async copies: issued since its last commit_group, and the committed groups.
struct AsyncQueue {
  std::vector<AsyncCopy> uncommitted;
  std::vector<std::vector<AsyncCopy>> groups;  // oldest first
};

inline AsyncQueue g_async[1024];  // per thread of the running block (at most 1024 threads)

inline AsyncQueue& async_queue(const Fiber* f) { return g_async[f->tid]; }

// The calling thread waits until another thread calls wake(key) (a split-phase barrier's
// waiters: the dialect's `kind` names the wait in a deadlock report).
inline void wait_for(const void* key, int kind, const std::source_location& loc) {
  Fiber* f = g_fiber;
  f->call = Call{kind, Site::of(loc), const_cast<void*>(key)};
  f->site = f->call.site;
  f->state = S_WAIT;
  suspend(f);
}

// Every thread waiting for `key` may run again (and re-checks what it waits for).
inline void wake(const void* key) {
  Group* g = g_fiber->group;
  for (auto& o : g->fibers)
    if (o.state == S_WAIT && o.call.args == key) make_runnable(g, &o);
}

// Where the shared window starts (see poison_shared_memory); set before every block.
inline uintptr_t g_shared_base = 0;

typedef void (*Thunk)(void** buffers);

struct Kernel {
  Thunk thunk;
  void** buffers;
  volatile unsigned char* tls_anchor;
};

// ----- shared memory: this module's thread-local block, poisoned before every block -----------

struct TlsSearch {
  const char* module;
  void* data;
  size_t size;
};

inline int find_tls(dl_phdr_info* info, size_t, void* p) {
  auto* s = static_cast<TlsSearch*>(p);
  if (!info->dlpi_name || std::strcmp(info->dlpi_name, s->module) != 0) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i)
    if (info->dlpi_phdr[i].p_type == PT_TLS) {
      s->data = info->dlpi_tls_data;
      s->size = info->dlpi_phdr[i].p_memsz;
    }
  return 1;
}

// Overwrites every thread_local object of this module (the kernel's __shared__ arrays, the
// dynamic block) with 0xFF bytes. `anchor` is one of them: reading it allocates the block.
inline bool poison_shared_memory(volatile unsigned char* anchor, std::string& error) {
  (void)*anchor;
  Dl_info info;
  if (!dladdr((void*)&poison_shared_memory, &info) || !info.dli_fname) {
    error = "cannot find the kernel library (dladdr)";
    return false;
  }
  TlsSearch s{info.dli_fname, nullptr, 0};
  dl_iterate_phdr(find_tls, &s);
  if (!s.data) {
    error = fmt("cannot find the thread-local block of %s (shared memory)", info.dli_fname);
    return false;
  }
  std::memset(s.data, 0xFF, s.size);
  // The shared window (__cvta_generic_to_shared): addresses from the block's start rounded
  // down to 1024 bytes, so that their low 10 bits (wgmma's 128-byte swizzle) are the host's.
  g_shared_base = reinterpret_cast<uintptr_t>(s.data) & ~static_cast<uintptr_t>(1023);
  if (reinterpret_cast<uintptr_t>(s.data) + s.size - g_shared_base > (1u << 18)) {
    error = fmt("shared memory of %zu bytes does not fit the 256 KB shared window", s.size);
    return false;
  }
  return true;
}

// ----- the dialect ---------------------------------------------------------------------------------

inline bool begin_block(Group* g, std::string& error) {
  if (!poison_shared_memory(static_cast<const Kernel*>(g->kernel)->tls_anchor, error)) return false;
  for (unsigned t = 0; t < g->T; ++t) {
    g_async[t].uncommitted.clear();
    g_async[t].groups.clear();
  }
  return true;
}

inline void run_thread(Group* g, Fiber* f) {
  const Kernel* k = static_cast<const Kernel*>(g->kernel);
  k->thunk(k->buffers);
  const AsyncQueue& q = async_queue(f);
  size_t in_flight = q.uncommitted.size();
  for (const auto& group : q.groups) in_flight += group.size();
  if (in_flight)  // they would land after the block, in shared memory the next block owns
    fail(fmt("%s exited with %zu cp.async copies in flight (%zu uncommitted, %zu committed groups not waited "
             "for): they land in shared memory after the block ends; a cp.async.wait_group 0 is missing",
             where(g, f->tid).c_str(), in_flight, q.uncommitted.size(), q.groups.size()));
}

inline int launch(Thunk thunk, void** buffers, volatile unsigned char* tls_anchor, unsigned gx, unsigned gy,
                  unsigned gz, unsigned threads, uint64_t seed, double timeout_s, size_t stack_bytes, char* err,
                  size_t errlen) {
  const Dialect dialect{"block", "warp", "__syncthreads", call_name, 5, begin_block,
                       run_thread};  // not a global: see shim_runtime.h
  const Kernel kernel{thunk, buffers, tls_anchor};
  return run_launch(dialect, &kernel, gx, gy, gz, threads, seed, timeout_s, stack_bytes, err, errlen);
}

}  // namespace mdsl_cpu

#endif  // MDSL_CUDA_SHIM_RUNTIME_H
