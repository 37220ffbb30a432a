// cuda_shim_launch.h: one launch of a printed CUDA kernel on the CPU (part of
// codegen/cuda_shim.h): fiber stacks below guard pages, blocks in a seeded random order,
// shared memory poisoned before every block, faults and a timeout turned into errors.
//
// Shared memory is this library's thread-local storage (cuda_shim.h: `__shared__` is
// thread_local), so before every block the whole thread-local block of the library, found
// with dl_iterate_phdr, is filled with 0xFF bytes (NaN in f16, bf16 and f32): a read of
// shared memory that no thread of the block wrote sees NaN. Faults (SIGSEGV, SIGBUS, SIGFPE,
// SIGILL, a fiber's stack overflow through its guard page) and a wall-clock timeout
// (SIGRTMIN + 5, a timer of the launching thread) jump back to the launch, which reports them.
#ifndef MDSL_CUDA_SHIM_LAUNCH_H
#define MDSL_CUDA_SHIM_LAUNCH_H

#include <csignal>
#include <ctime>

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cuda_shim_runtime.h"

namespace mdsl_cpu {

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
  return true;
}

// ----- faults and timeout ------------------------------------------------------------------------

inline sigjmp_buf g_fault_jb;
inline volatile sig_atomic_t g_fault_sig = 0;
inline void* volatile g_fault_addr = nullptr;
inline volatile pid_t g_launch_tid = 0;
inline struct sigaction g_old_actions[5];
inline const int g_fault_signals[5] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGRTMIN + 5};

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

enum { LAUNCH_OK = 0, LAUNCH_ERROR = 1, LAUNCH_FAULT = 2, LAUNCH_TIMEOUT = 3, LAUNCH_BAD_ARGS = 4 };

inline int launch(Thunk thunk, void** buffers, volatile unsigned char* tls_anchor, unsigned gx, unsigned gy,
                  unsigned gz, unsigned threads, uint64_t seed, double timeout_s, size_t stack_bytes, char* err,
                  size_t errlen) {
  auto report = [&](const std::string& m) {
    if (err && errlen) std::snprintf(err, errlen, "%s", m.c_str());
  };
  if (threads == 0 || threads % 32 || threads > 1024) {
    report(fmt("threads per block must be a positive multiple of 32 up to 1024, got %u", threads));
    return LAUNCH_BAD_ARGS;
  }
  if (g_group) {
    report("a launch is already running in this process");
    return LAUNCH_BAD_ARGS;
  }
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  stack_bytes = (stack_bytes + page - 1) / page * page;
  size_t per = stack_bytes + page;  // a guard page below each stack
  char* region = (char*)mmap(nullptr, per * threads, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) {
    report("cannot map fiber stacks");
    return LAUNCH_BAD_ARGS;
  }
  Group* g = new Group();
  g->T = threads;
  g->W = threads / 32;
  g->dims = dim3_t{gx, gy, gz};
  g->fibers.resize(threads);
  g->warps.resize(threads / 32);
  g->thunk = thunk;
  g->buffers = buffers;
  g->rng = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  if (!g->rng) g->rng = 1;
  g->policy = (int)(seed % 4);
  g->demote_mask = g->policy == 2 ? 1023 : g->policy == 3 ? 63 : 0;
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = g->fibers[t];
    f.group = g;
    f.tid = t;
    f.thread_idx = dim3_t{t, 0, 0};
    mprotect(region + t * per, page, PROT_NONE);
    f.stack = region + t * per + page;
    f.stack_size = stack_bytes;
  }
  size_t total = (size_t)gx * gy * gz;
  std::vector<uint64_t> order(total);
  for (size_t i = 0; i < total; ++i) order[i] = i;
  for (size_t i = total; i > 1; --i) std::swap(order[i - 1], order[next_random(g->rng) % i]);

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
    sev.sigev_signo = SIGRTMIN + 5;
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
      g->pos = dim3_t{(unsigned)(id % gx), (unsigned)(id / gx % gy), (unsigned)(id / ((uint64_t)gx * gy))};
      std::string why;
      if (!poison_shared_memory(tls_anchor, why)) {
        status = LAUNCH_ERROR;
        report(why);
        break;
      }
      if (!run_block(g)) {
        status = LAUNCH_ERROR;
        report(g->error);
        break;
      }
    }
  } else {
    int sig = g_fault_sig;
    Fiber* f = g_fiber;
    std::string who = f ? where(g, f->tid) : std::string("the runtime");
    if (sig == SIGRTMIN + 5) {
      status = LAUNCH_TIMEOUT;
      report(fmt("timeout after %.1f s (in %s)", timeout_s, who.c_str()));
    } else {
      status = LAUNCH_FAULT;
      report(fmt("%s at address %p in %s",
                 sig == SIGSEGV ? "segmentation fault" : sig == SIGBUS ? "bus error"
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

}  // namespace mdsl_cpu

#endif  // MDSL_CUDA_SHIM_LAUNCH_H
