// cuda_shim_runtime.h: the runtime that runs one launch of a printed CUDA kernel on the CPU
// (part of codegen/cuda_shim.h; the design is codegen/metal_shim.h's, see its comment).
//
// Blocks run one after another in a random (seeded) order. Inside a block every CUDA thread
// is a fiber (ucontext, its own stack below a guard page) on the calling OS thread; a fiber
// runs until it reaches a synchronisation point, then the scheduler resumes another runnable
// one, chosen at random under one of four policies (seed % 4): uniform, or warp priorities
// (one warp runs ahead of the others from barrier to barrier: that is what makes a missing
// __syncthreads read shared memory before it is written, or overwrite it before it is read)
// with no / rare / frequent demotions of the running warp.
// Synchronisation points are real rendezvous:
//   - __syncthreads(): every thread of the block, at the same call site (another site, or a
//     thread exiting while others wait, is reported as a divergent barrier);
//   - warp-collective operations (__syncwarp, mma.sync, mma.sp): the 32 lanes of the warp at
//     the same call site; the last lane to arrive performs the operation for all of them,
//     reading each lane's operands from that lane's stack (so an MMA really needs all 32
//     lanes' registers, as on the GPU).
// A launch (poisoned shared memory, faults, the timeout) is cuda_shim_launch.h. Nothing here is
// thread_local: the poisoning overwrites this module's whole TLS block, and one launch runs
// at a time per process (the Python driver holds a lock).
#ifndef MDSL_CUDA_SHIM_RUNTIME_H
#define MDSL_CUDA_SHIM_RUNTIME_H

#include <csetjmp>
#include <cstdint>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <source_location>
#include <string>
#include <vector>

#include <ucontext.h>

namespace mdsl_cpu {

struct dim3_t {
  unsigned x, y, z;
};

struct Site {
  const char* file = "";
  unsigned line = 0, col = 0;
  static Site of(const std::source_location& l) { return Site{l.file_name(), (unsigned)l.line(), (unsigned)l.column()}; }
  bool operator==(const Site& o) const { return line == o.line && col == o.col && std::strcmp(file, o.file) == 0; }
};

enum CallKind { CALL_NONE = 0, CALL_SYNCWARP, CALL_MMA, CALL_MMA_SP };
inline const char* call_name(int k) {
  static const char* names[] = {"-", "__syncwarp", "mma.sync m16n8k16", "mma.sp m16n8k32"};
  return names[k];
}

// One lane's part in a warp-collective operation: its operands live on its own stack.
struct WarpCall {
  int kind = CALL_NONE;
  Site site;
  void* args = nullptr;
};

// One cp.async in flight: the bytes it will write (read at issue: the source is read-only
// global memory during the launch) and where.
struct AsyncCopy {
  unsigned char* dst;
  unsigned char data[16];
  int bytes;
};

enum State { S_NEW, S_RUNNABLE, S_RUNNING, S_BARRIER, S_WARP, S_DONE };

struct Group;

struct Fiber {
  Group* group = nullptr;
  unsigned tid = 0;
  int state = S_NEW;
  jmp_buf jb;
  ucontext_t uc;
  char* stack = nullptr;
  size_t stack_size = 0;
  Site site;  // where it waits
  WarpCall call;
  dim3_t thread_idx{0, 0, 0};
  std::vector<AsyncCopy> uncommitted;          // cp.async issued since the last commit_group
  std::vector<std::vector<AsyncCopy>> groups;  // committed groups, oldest first
};

struct Warp {
  int arrived = 0;
  WarpCall first;
};

typedef void (*Thunk)(void** buffers);
typedef void (*WarpExec)(Group* g, unsigned warp);

struct Group {
  unsigned T = 0, W = 0;
  dim3_t pos{0, 0, 0}, dims{0, 0, 0};
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  std::vector<std::vector<int>> runnable;  // per warp: its runnable lanes (thread ids)
  size_t n_runnable = 0;
  std::vector<int> priority;  // warp ids, highest priority first
  int policy = 0;
  uint64_t demote_mask = 0;
  unsigned bar_arrived = 0;
  Site bar_site;
  unsigned finished = 0;
  jmp_buf sched;
  ucontext_t sched_uc;
  bool failed = false;
  std::string error;
  uint64_t rng = 1;
  Thunk thunk = nullptr;
  void** buffers = nullptr;
};

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
  return fmt("block (%u, %u, %u), thread %u (warp %u, lane %u)", g->pos.x, g->pos.y, g->pos.z, tid, tid / 32,
             tid % 32);
}

inline std::string site_str(const Site& s) { return fmt("line %u:%u", s.line, s.col); }

inline Fiber* current() { return g_fiber; }

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

// 0: any runnable thread, uniformly; 1..3: the highest-priority warp with a runnable lane
// runs, demoted to the lowest priority never / at random rarely / often.
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
  if (g->finished)
    fail(fmt("__syncthreads at %s reached by %s after another thread of the block exited", site_str(s).c_str(),
             where(g, f->tid).c_str()));
  if (g->bar_arrived == 0) {
    g->bar_site = s;
  } else if (!(g->bar_site == s)) {
    fail(fmt("divergent __syncthreads: %s waits at %s, others at %s", where(g, f->tid).c_str(), site_str(s).c_str(),
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
// arrive runs `exec` (null: a plain __syncwarp) for the whole warp.
inline void warp_collective(int kind, const std::source_location& loc, void* args, WarpExec exec) {
  Fiber* f = g_fiber;
  Group* g = f->group;
  unsigned w = f->tid / 32;
  Warp& warp = g->warps[w];
  f->call = WarpCall{kind, Site::of(loc), args};
  if (g->finished) {
    for (unsigned l = 0; l < 32; ++l)
      if (g->fibers[w * 32 + l].state == S_DONE)
        fail(fmt("%s at %s reached by %s after lane %u of its warp exited", call_name(kind),
                 site_str(f->call.site).c_str(), where(g, f->tid).c_str(), l));
  }
  if (warp.arrived == 0) {
    warp.first = f->call;
  } else if (!(warp.first.site == f->call.site) || warp.first.kind != kind) {
    fail(fmt("divergent warp operation: %s is at %s (%s), another lane at %s (%s)", where(g, f->tid).c_str(),
             site_str(f->call.site).c_str(), call_name(kind), site_str(warp.first.site).c_str(),
             call_name(warp.first.kind)));
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
  g->thunk(g->buffers);
  f = g_fiber;
  g = f->group;
  size_t in_flight = f->uncommitted.size();
  for (const auto& group : f->groups) in_flight += group.size();
  if (in_flight)  // they would land after the block, in shared memory the next block owns
    fail(fmt("%s exited with %zu cp.async copies in flight (%zu uncommitted, %zu committed groups not waited "
             "for): they land in shared memory after the block ends; a cp.async.wait_group 0 is missing",
             where(g, f->tid).c_str(), in_flight, f->uncommitted.size(), f->groups.size()));
  f->state = S_DONE;
  g->finished++;
  if (g->bar_arrived)
    fail(fmt("%s exited while %u threads wait at the __syncthreads at %s", where(g, f->tid).c_str(), g->bar_arrived,
             site_str(g->bar_site).c_str()));
  unsigned w = f->tid / 32;
  if (g->warps[w].arrived)
    fail(fmt("%s exited while %d lanes of its warp wait at %s (%s)", where(g, f->tid).c_str(), g->warps[w].arrived,
             site_str(g->warps[w].first.site).c_str(), call_name(g->warps[w].first.kind)));
  _longjmp(g->sched, 1);
}

inline std::string deadlock_report(Group* g) {
  std::string s = fmt("deadlock in block (%u, %u, %u): no thread can run;", g->pos.x, g->pos.y, g->pos.z);
  int shown = 0;
  for (auto& f : g->fibers) {
    if (f.state == S_DONE || shown >= 6) continue;
    s += fmt(" thread %u waits at %s (%s);", f.tid, site_str(f.site).c_str(),
             f.state == S_BARRIER ? "__syncthreads" : call_name(f.call.kind));
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
    f.call = WarpCall();
    f.uncommitted.clear();
    f.groups.clear();
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

}  // namespace mdsl_cpu

#endif  // MDSL_CUDA_SHIM_RUNTIME_H
