"""A numpy interpreter for the kernel IR, with real threadgroup semantics (see docs/IR.md).

`run_kernel(kernel, buffers, scalars)` executes a `Kernel` for a whole launch grid at small
sizes and checks the rules of the execution model as it goes. It is the oracle the passes and
the printers are tested against, so it is strict: anything the spec calls an error raises
`InterpreterError` naming the op, its result, the threadgroup, the thread and the index.

Execution is vectorised over every thread of every threadgroup at once:

- a per-thread value is a numpy array of shape [G, T] (G threadgroups of the grid, T threads
  per group), plus a trailing dimension for vectors; a fragment is a per-warp array
  [G, W, rows, cols];
- control flow is predicated with an active mask [G, T]: `if`/`switch` run each region under
  its mask (a region no thread takes is skipped) and merge results with `np.where`; `for`
  iterates while any thread is active, threads whose index reached `ub` drop out;
- pure ops compute every lane (inactive lanes hold don't-care values, their floating point
  warnings are silenced); their checks (division by zero, shift widths, float->int range)
  look at active lanes only; memory ops touch memory only where the mask and the predicate
  hold, and a masked-off load gives 0.

Each op is resolved once, before execution, to a closure over register slots (`_Machine`
compiles the kernel per launch), so the per-op cost is a handful of numpy calls on G*T
elements.

Arithmetic follows docs/IR.md exactly: integers wrap in their holding dtype; f16 and f32 ops
are computed by numpy in that type (numpy's f16 ops go through f32, which is exact for
+ - * because 24 >= 2*11+2); bf16 ops are computed in f32 and rounded to bf16 (round to
nearest even on the bits) after every op. `fma` is rounded once: the product is exact in
float64, the sum is computed with TwoSum and rounded to odd, which makes the final rounding
to f32/f16/bf16 correct. `mma` computes a @ b in float64, adds c in float64 and rounds once
to c's element type (exact for the products, the float64 sum of the k products may round);
`mma_sp` does the same with the dense A rebuilt from the compressed one and the metadata.
float `min`/`max` are IEEE minNum/maxNum (`fmin`/`fmax`: a NaN operand loses), like Metal
and CUDA. float->int casts truncate toward zero; NaN or out of range is an error.
int->int casts wrap. `i32` div/rem with a negative operand raises: the spec says floor
division while C truncates, so a kernel relying on either is rejected.

Threadgroup memory is checked for reads of never-written elements and for data races:
between two threadgroup barriers, an element accessed by two different threads where at least
one access writes is a race, unless both threads are in one warp and a `simdgroup` barrier of
that warp lies between the accesses. Bookkeeping is per element (last writer thread and
the barrier epoch of its warp at the write; the reader thread, or 'several', and its warp,
or 'several warps', with the epoch of the latest read), updated with vectorised scatters.
A threadgroup barrier clears the bookkeeping of its group; each barrier bumps the epoch of
every warp it covers. Collective fragment loads/stores count as accesses by every lane of
the warp (a pseudo-thread T + warp), so even a fragment store followed by a fragment load of
the same warp needs a barrier between them. Device memory is not race-checked; ops run in
lockstep, so device memory is coherent across the launch.

Warp roles (`roles.py`): the regions of a `warp_roles` run concurrently on their own warps
(region i on the next warps[i] warps, under the mask of their threads). The interpreter runs
them as cooperative tasks, one Python thread per role of which exactly one runs at a time:
role 0 first, and the baton passes round-robin to the next role that can run only when the
running role waits at an mbarrier whose phase has not completed, or finishes. When every
unfinished role waits on a phase that cannot complete, the run stops with an error of kind
`deadlock` naming each role's wait. Runs are deterministic; an error in a role stops every
role's thread and reaches the caller as raised. All threadgroups still run in lockstep inside
a role: a wait returns once its phase has completed in every group (a deadlock message says
when the groups diverged). mbarriers (per array, barrier and group: initialised, count,
arrivals missing, phase) follow docs/IR.md; their ops are executed by whole warps with a
warp-uniform index and parity (`collective` otherwise), an index past size/2 is `bounds`, an
uninitialised barrier `uninitialised`, a parity other than 0/1 `input`, and using a barrier
from another warp than its initialiser's with no threadgroup barrier (or mbarrier ordering)
after the init is a `race`.

Races under warp roles (`clocks.py`; only kernels with warp-role ops keep this state, other
kernels run the checks above unchanged): roles order shared memory through mbarriers, so the
rule becomes happens-before. Per group, each warp has a release clock (the arrives it
executed) and a vector clock (the latest release clock of every warp it synchronised with);
an arrive releases the arriving warp's vector clock with its own entry advanced, the barrier
accumulates what its arrives released, a completed wait joins what the barrier had released
when the awaited phase completed (cumulative: arrives are read-modify-writes, so a wait is
ordered after every earlier arrive of the barrier). Each shared write is stamped with the
writer's release clock, each read per reading warp (a lazily allocated [elements, W] record).
An access by warp r after another warp w's access (one of them a write) at stamp s is
ordered iff r's clock of w is > s; anything else is a `race`. Same-warp accesses keep the
epoch rule, a threadgroup barrier still clears the records (and gives every warp every
warp's clock). Async copies count as writes of the copying thread when they land (at their
async_wait); a wgmma's reads of its shared tiles are stamped again when its wgmma_wait retires
it, so only an arrive after the wait releases the tile to a warp that overwrites it. Not
checked: an mbarrier re-initialised while other warps use it.

`atomic_add` is serialised in (group, thread) order, the group index running x fastest:
g = x + gx * (y + gy * z).

The scalar semantics of the ALU ops are the op table's (`OpDef.evaluate`, ir/semantics.py, with
the rounding rules of ir/numerics.py), which the constant folder shares. The package: `machine.py` (the
machine: masks, threadgroup memory with its race bookkeeping, async copies, the compiler of
blocks to closures, and helpers the handlers share), and one module per op group of handlers
(`alu.py`, `memory.py`, `fragments.py`, `warpgroup.py`, `control.py`, `roles.py`), joined by
`HANDLERS` here; `clocks.py` holds the happens-before state of warp roles and mbarriers.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..core import Kernel, Op
from ..verify import verify
from ..ops import OPS
from .alu import _h_const, _h_evaluate, _h_extract, _h_index, _h_scalar, _h_select, _h_vec
from .control import _h_for, _h_if, _h_switch
from .fragments import _h_frag_build, _h_frag_load, _h_frag_store, _h_frag_zero, _h_mma, _h_mma_sp, _h_shfl_xor
from .machine import Fn, InterpreterError, _Machine, launch_size
from .memory import (_h_async_commit, _h_async_copy, _h_async_wait, _h_atomic_add, _h_barrier,
                     _h_frag_elems, _h_load, _h_store, _h_vstore)
from .warpgroup import _h_fence, _h_wgmma, _h_wgmma_commit, _h_wgmma_fence, _h_wgmma_wait
from .roles import _h_mbarrier_arrive, _h_mbarrier_init, _h_mbarrier_wait, _h_warp_roles
from ..numerics import round_bf16

__all__ = ["HANDLERS", "InterpreterError", "launch_size", "round_bf16", "run_kernel"]


#: op name -> handler: builds the closure that runs the op (the handler modules below).
HANDLERS: dict[str, Callable[[_Machine, Op], Fn]] = {
    # every op with scalar semantics in the op table (add, ..., cast, bitcast, table)
    **{n: _h_evaluate for n, d in OPS.items() if d.evaluate is not None},
    "select": _h_select,  # _h_evaluate, or a warp-consistent merge of fragments
    "const": _h_const, "index": _h_index, "scalar": _h_scalar,
    "load": _h_load, "vload": _h_load, "extract": _h_extract, "store": _h_store, "vstore": _h_vstore,
    "atomic_add": _h_atomic_add, "barrier": _h_barrier, "fence": _h_fence,
    "frag_zero": _h_frag_zero, "frag_load": _h_frag_load, "frag_build": _h_frag_build, "vec": _h_vec, "frag_store": _h_frag_store,
    "frag_elems": _h_frag_elems, "shfl_xor": _h_shfl_xor, "async_copy": _h_async_copy, "async_commit": _h_async_commit,
    "async_wait": _h_async_wait,
    "mma": _h_mma, "mma_sp": _h_mma_sp, "wgmma": _h_wgmma, "wgmma_fence": _h_wgmma_fence,
    "wgmma_commit": _h_wgmma_commit, "wgmma_wait": _h_wgmma_wait, "for": _h_for, "if": _h_if, "switch": _h_switch,
    "warp_roles": _h_warp_roles, "mbarrier_init": _h_mbarrier_init, "mbarrier_arrive": _h_mbarrier_arrive,
    "mbarrier_wait": _h_mbarrier_wait,
}


def run_kernel(kernel: Kernel, buffers: dict[str, np.ndarray],
               scalars: dict[str, int]) -> dict[str, np.ndarray]:
    """Execute `kernel` over its whole grid; return the writable buffers (copies).

    `buffers` maps every declared buffer to a flat numpy array of its element type (bf16 held
    as float32). Outputs are returned in the same holding dtypes; poison them beforehand to
    see which elements the kernel wrote."""
    verify(kernel)
    machine = _Machine(kernel, buffers, scalars, HANDLERS)
    machine.run()
    return {b.name: machine.device[b.name] for b in kernel.buffers if b.access != "read"}
