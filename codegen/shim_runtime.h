// shim_runtime.h: the runtime both CPU harnesses run one launch of a printed kernel with:
// codegen/metal_shim.h (Metal: threadgroups, simdgroups, threadgroup_barrier) and
// codegen/cuda_shim_runtime.h (CUDA: blocks, warps, __syncthreads). A target supplies a Dialect:
// the words its messages use, the names of its warp-collective operations, its timeout signal,
// and two hooks (what starts a block: poisoning its shared memory; what one thread runs: the
// kernel); its collectives (simdgroup matrices, mma.sync, cp.async) stay in its own header.
//
// Blocks run one after another in a random (seeded) order. Inside a block every thread is a
// fiber (ucontext, its own stack below a guard page) on the calling OS thread; a fiber runs
// until it reaches a synchronisation point, then the scheduler resumes another runnable one,
// chosen at random (seeded xorshift) under one of four policies (seed % 4, see pick_next):
// uniform, or warp priorities (one warp runs ahead of the others from barrier to barrier: that
// is what makes a missing barrier read shared memory before it is written, or overwrite it
// before it is read) with no / rare / frequent demotions of the running warp.
// Synchronisation points are real rendezvous:
//   - block_barrier: every thread of the block, at the same call site (another site, or a
//     thread exiting while others wait or before others reach a barrier, is an error);
//   - collective: the 32 lanes of a warp at the same call site and operation; the last lane to
//     arrive performs the operation for all of them, reading each lane's operands from that
//     lane's stack (so a matrix operation really needs all 32 lanes' registers, as on the GPU).
// Faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, a fiber's stack overflow through its guard page) and
// a wall-clock timeout (a timer of the launching thread) jump back to the launch, which reports
// them instead of killing the process.
//
// The includer names the namespace (MDSL_SHIM_NAMESPACE: mtl_rt, mdsl_cpu), so each target's
// runtime keeps symbols of its own. Its globals are inline variables, which g++ makes
// STB_GNU_UNIQUE: one per process across every kernel library of the target loaded, even with
// RTLD_LOCAL. They only describe the launch in progress, and one runs at a time per process
// (the Python drivers hold a lock); anything that names one library's own functions or
// memory (the Dialect) must not be such a global. Nothing here is thread_local: the CUDA shim
// poisons its library's whole thread-local block before every block.
#ifndef MDSL_SHIM_RUNTIME_H
#define MDSL_SHIM_RUNTIME_H

#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <source_location>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef MDSL_SHIM_NAMESPACE
#error "define MDSL_SHIM_NAMESPACE, the target's runtime namespace, before including shim_runtime.h"
#endif

namespace MDSL_SHIM_NAMESPACE {

struct Dim3 {
  unsigned x, y, z;
};

struct Site {
  const char* file = "";
  unsigned line = 0, col = 0;
  static Site of(const std::source_location& l) { return Site{l.file_name(), (unsigned)l.line(), (unsigned)l.column()}; }
  bool operator==(const Site& o) const { return line == o.line && col == o.col && std::strcmp(file, o.file) == 0; }
};

// One lane's part in a warp-collective operation: its kind (the target's numbering, 0: none)
// and its operands, which live on the lane's own stack.
struct Call {
  int kind = 0;
  Site site;
  void* args = nullptr;
};

enum State { S_NEW, S_RUNNABLE, S_RUNNING, S_BARRIER, S_WARP, S_WAIT, S_DONE };  // S_WAIT: a dialect's wait_for

struct Group;
struct Fiber;

// What a target puts into the runtime.
struct Dialect {
  const char* block;    // "block" / "threadgroup"
  const char* warp;     // "warp" / "simdgroup"
  const char* barrier;  // "__syncthreads" / "threadgroup_barrier"
  const char* (*call_name)(int kind);
  int timeout_signal;                                  // SIGRTMIN + this
  bool (*begin_block)(Group* g, std::string& error);  // before a block's threads start
  void (*run_thread)(Group* g, Fiber* f);             // the kernel, as thread f
};

struct Fiber {
  Group* group = nullptr;
  unsigned tid = 0;
  int state = S_NEW;
  jmp_buf jb;
  ucontext_t uc;
  char* stack = nullptr;  // usable stack (above the guard page)
  size_t stack_size = 0;
  Site site;  // where it waits
  Call call;
};

struct Warp {
  int arrived = 0;
  Call first;  // the first lane's operation (site, kind)
};

typedef void (*WarpExec)(Group* g, unsigned warp);

struct Group {
  const Dialect* dialect = nullptr;
  const void* kernel = nullptr;  // the target's: what run_thread calls, with its buffers
  unsigned T = 0, W = 0;
  Dim3 pos{0, 0, 0}, dims{0, 0, 0};
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  std::vector<std::vector<int>> runnable;  // per warp: its runnable lanes (thread ids)
  size_t n_runnable = 0;
  std::vector<int> priority;  // warp ids, highest priority first
  int policy = 0;             // see pick_next
  uint64_t demote_mask = 0;   // demote the running warp when (random & mask) == 0
  unsigned bar_arrived = 0;
  Site bar_site;
  unsigned finished = 0;
  jmp_buf sched;
  ucontext_t sched_uc;
  bool failed = false;
  std::string error;
  uint64_t rng = 1;
};

// The launch in progress (one at a time per process).
inline Group* g_group = nullptr;
inline Fiber* g_fiber = nullptr;

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

inline std::string where(const Group* g, unsigned tid) {
  return fmt("%s (%u, %u, %u), thread %u (%s %u, lane %u)", g->dialect->block, g->pos.x, g->pos.y, g->pos.z, tid,
             g->dialect->warp, tid / 32, tid % 32);
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
  f->state = S_RUNNABLE;
  g->runnable[f->tid / 32].push_back((int)f->tid);
  g->n_runnable++;
}

// Scheduling policies (chosen per launch from the seed, see run_launch):
//   0: uniform: any runnable thread of the block, at random;
//   1..3: warp priority: the warps have a random priority order and a random lane of the
//      highest-priority warp with a runnable lane runs, so one warp runs ahead of the others
//      from one barrier to the next; with policies 2 and 3 the running warp is demoted to the
//      lowest priority at random moments (rarely / often).
inline int pick_next(Group* g) {
  int w = -1;
  if (g->policy == 0) {
    uint64_t r = next_random(g->rng) % g->n_runnable;
    for (unsigned i = 0; i < g->W; ++i) {
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

inline void block_barrier(const Site& s) {
  Fiber* f = g_fiber;
  Group* g = f->group;
  const char* bar = g->dialect->barrier;
  if (g->finished)
    fail(fmt("%s at %s reached by %s after another thread of the %s exited", bar, site_str(s).c_str(),
             where(g, f->tid).c_str(), g->dialect->block));
  if (g->bar_arrived == 0) {
    g->bar_site = s;
  } else if (!(g->bar_site == s)) {
    fail(fmt("divergent %s: %s waits at %s, others at %s", bar, where(g, f->tid).c_str(), site_str(s).c_str(),
             site_str(g->bar_site).c_str()));
  }
  f->site = s;
  f->state = S_BARRIER;
  if (++g->bar_arrived == g->T) {
    g->bar_arrived = 0;
    for (auto& o : g->fibers) make_runnable(g, &o);
  }
  suspend(f);
}

// Rendezvous of the 32 lanes of the calling thread's warp at one call site; the last lane to
// arrive runs `exec` (null: a plain warp barrier) for the whole warp.
inline void collective(int kind, const std::source_location& loc, void* args, WarpExec exec) {
  Fiber* f = g_fiber;
  Group* g = f->group;
  const Dialect* d = g->dialect;
  unsigned w = f->tid / 32;
  Warp& warp = g->warps[w];
  f->call = Call{kind, Site::of(loc), args};
  if (g->finished) {
    for (unsigned l = 0; l < 32; ++l)
      if (g->fibers[w * 32 + l].state == S_DONE)
        fail(fmt("%s at %s reached by %s after lane %u of its %s exited", d->call_name(kind),
                 site_str(f->call.site).c_str(), where(g, f->tid).c_str(), l, d->warp));
  }
  if (warp.arrived == 0) {
    warp.first = f->call;
  } else if (!(warp.first.site == f->call.site) || warp.first.kind != kind) {
    fail(fmt("divergent %s operation: %s is at %s (%s), another lane at %s (%s)", d->warp, where(g, f->tid).c_str(),
             site_str(f->call.site).c_str(), d->call_name(kind), site_str(warp.first.site).c_str(),
             d->call_name(warp.first.kind)));
  }
  f->site = f->call.site;
  f->state = S_WARP;
  if (++warp.arrived == 32) {
    warp.arrived = 0;
    if (exec) exec(g, w);
    for (unsigned l = 0; l < 32; ++l) make_runnable(g, &g->fibers[w * 32 + l]);
  }
  suspend(f);
}

inline void fiber_entry() {
  Fiber* f = g_fiber;
  Group* g = f->group;
  g->dialect->run_thread(g, f);
  f = g_fiber;
  g = f->group;
  f->state = S_DONE;
  g->finished++;
  if (g->bar_arrived)
    fail(fmt("%s exited while %u threads wait at the %s at %s", where(g, f->tid).c_str(), g->bar_arrived,
             g->dialect->barrier, site_str(g->bar_site).c_str()));
  unsigned w = f->tid / 32;
  if (g->warps[w].arrived)
    fail(fmt("%s exited while %d lanes of its %s wait at %s (%s)", where(g, f->tid).c_str(), g->warps[w].arrived,
             g->dialect->warp, site_str(g->warps[w].first.site).c_str(),
             g->dialect->call_name(g->warps[w].first.kind)));
  _longjmp(g->sched, 1);
}

inline std::string deadlock_report(Group* g) {
  std::string s = fmt("deadlock in %s (%u, %u, %u): no thread can run;", g->dialect->block, g->pos.x, g->pos.y,
                      g->pos.z);
  int shown = 0;
  for (auto& f : g->fibers) {
    if (f.state == S_DONE || shown >= 6) continue;
    s += fmt(" thread %u waits at %s (%s);", f.tid, site_str(f.site).c_str(),
             f.state == S_BARRIER ? g->dialect->barrier : g->dialect->call_name(f.call.kind));
    shown++;
  }
  return s;
}

// Runs every thread of one block to completion; false on an error (g->error).
inline bool run_block(Group* g) {
  g->runnable.assign(g->W, {});
  g->n_runnable = 0;
  g->priority.resize(g->W);
  for (unsigned i = 0; i < g->W; ++i) g->priority[i] = (int)i;
  for (size_t i = g->W; i > 1; --i) std::swap(g->priority[i - 1], g->priority[next_random(g->rng) % i]);
  g->finished = 0;
  g->bar_arrived = 0;
  g->failed = false;
  for (auto& w : g->warps) w.arrived = 0;
  for (auto& f : g->fibers) {
    make_runnable(g, &f);
    f.state = S_NEW;
    f.call = Call();
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
      if (f->state == S_NEW) {
        f->state = S_RUNNING;
        swapcontext(&g->sched_uc, &f->uc);
      } else {
        f->state = S_RUNNING;
        _longjmp(f->jb, 1);
      }
    }
    if (g->failed) return false;
  }
  return true;
}

// ----- faults and timeout ------------------------------------------------------------------------

inline sigjmp_buf g_fault_jb;
inline volatile sig_atomic_t g_fault_sig = 0;
inline void* volatile g_fault_addr = nullptr;
inline volatile pid_t g_launch_tid = 0;
inline struct sigaction g_old_actions[5];
inline int g_fault_signals[5] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, 0};  // the last: the timeout's

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

// Status codes of `run_launch`.
enum { LAUNCH_OK = 0, LAUNCH_ERROR = 1, LAUNCH_FAULT = 2, LAUNCH_TIMEOUT = 3, LAUNCH_BAD_ARGS = 4 };

// Runs `kernel` (the dialect's run_thread gets it as g->kernel) on a gx x gy x gz grid of
// blocks of `threads` threads; the error, if any, goes to err. `dialect` must outlive the call.
inline int run_launch(const Dialect& dialect, const void* kernel, unsigned gx, unsigned gy, unsigned gz,
                      unsigned threads, uint64_t seed, double timeout_s, size_t stack_bytes, char* err,
                      size_t errlen) {
  auto report = [&](const std::string& m) {
    if (err && errlen) std::snprintf(err, errlen, "%s", m.c_str());
  };
  if (threads == 0 || threads % 32 || threads > 1024) {
    report(fmt("threads per %s must be a positive multiple of 32 up to 1024, got %u", dialect.block, threads));
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
  g->dialect = &dialect;
  g->kernel = kernel;
  g->T = threads;
  g->W = threads / 32;
  g->dims = Dim3{gx, gy, gz};
  g->fibers.resize(threads);
  g->warps.resize(threads / 32);
  g->rng = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  if (!g->rng) g->rng = 1;
  g->policy = (int)(seed % 4);
  g->demote_mask = g->policy == 2 ? 1023 : g->policy == 3 ? 63 : 0;
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = g->fibers[t];
    f.group = g;
    f.tid = t;
    mprotect(region + t * per, page, PROT_NONE);
    f.stack = region + t * per + page;
    f.stack_size = stack_bytes;
  }
  // Blocks in a random order.
  size_t total = (size_t)gx * gy * gz;
  std::vector<uint64_t> order(total);
  for (size_t i = 0; i < total; ++i) order[i] = i;
  for (size_t i = total; i > 1; --i) std::swap(order[i - 1], order[next_random(g->rng) % i]);

  // Fault and timeout handling for this OS thread.
  const int timeout_sig = SIGRTMIN + dialect.timeout_signal;
  g_fault_signals[4] = timeout_sig;
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
    sev.sigev_signo = timeout_sig;
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
      g->pos = Dim3{(unsigned)(id % gx), (unsigned)(id / gx % gy), (unsigned)(id / ((uint64_t)gx * gy))};
      std::string why;
      if (!dialect.begin_block(g, why)) {
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
    if (sig == timeout_sig) {
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

}  // namespace MDSL_SHIM_NAMESPACE

#endif  // MDSL_SHIM_RUNTIME_H
