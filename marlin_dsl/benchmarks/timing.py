"""The timing loops of `marlin-dsl bench`: back-to-back launches in batches (kernel time) and
single calls (end-to-end time), on any object with MLX's `eval`/`synchronize` (a fake clock and a
fake MLX in the tests), and how many weight copies the launches rotate over."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

#: Launches per timed batch, and the fewest when a launch is slow.
BATCH_LAUNCHES = 50
MIN_BATCH_LAUNCHES = 3
#: A batch is cut to about this long (seconds), never below MIN_BATCH_LAUNCHES launches.
BATCH_TARGET_S = 0.05
#: Weight copies rotate over at least this many bytes (the H100's L2 holds 50 MB).
ROTATE_BYTES = 128 << 20
MIN_COPIES, MAX_COPIES = 4, 64


def copies_for(weight_bytes: int) -> int:
    """How many weight copies the launches rotate over."""
    return max(MIN_COPIES, min(MAX_COPIES, math.ceil(ROTATE_BYTES / max(int(weight_bytes), 1))))



@dataclass
class TimedLaunches:
    per_launch_s: float
    launches: int
    samples_s: list[float]
    estimate_s: float  # one launch evaluated alone
    queue_s: float  # Python time to queue one launch
    first_s: float  # the first launch (JIT compilation on first use)


def kernel_time(mx, launch: Callable[[int], object], repeats: int, *,
                clock: Callable[[], float] = time.perf_counter,
                max_launches: int = BATCH_LAUNCHES, min_launches: int = MIN_BATCH_LAUNCHES,
                target_s: float = BATCH_TARGET_S) -> TimedLaunches:
    """Median seconds per launch of back-to-back launches: `launch(i)` queues launch number i
    (lazily, MLX array out). One launch first (compiles on first use), two timed single
    launches to size a first batch, which is a warm-up (allocator, caches) and sizes the
    `repeats` timed batches that follow."""
    counter = 0
    queue_s: list[float] = []

    def queue(count: int) -> list:
        nonlocal counter
        t = clock()
        outs = [launch(counter + i) for i in range(count)]
        queue_s.append((clock() - t) / count)
        counter += count
        return outs

    t = clock()
    mx.eval(*queue(1))
    mx.synchronize()
    first = clock() - t
    single = []
    for _ in range(2):
        outs = queue(1)
        t = clock()
        mx.eval(*outs)
        mx.synchronize()
        single.append(clock() - t)
    estimate = max(min(single), 1e-9)

    def size(per_launch: float) -> int:
        return max(min_launches, min(max_launches, int(target_s / max(per_launch, 1e-9) + 1e-6)))

    count = size(estimate)
    samples = []
    for r in range(repeats + 1):
        outs = queue(count)
        mx.synchronize()
        t = clock()
        mx.eval(*outs)
        mx.synchronize()
        elapsed = clock() - t
        del outs
        if r:
            samples.append(elapsed / count)
        else:  # the warm-up batch sizes the timed ones better than single launches do
            count = size(elapsed / count)
    return TimedLaunches(statistics.median(samples), count, samples, estimate,
                         statistics.median(queue_s[1:]), first)


def e2e_time(mx, call: Callable[[int], object], repeats: int, estimate_s: float, *,
             clock: Callable[[], float] = time.perf_counter, budget_s: float = 0.25):
    """Median seconds of single calls, each followed by mx.eval: max(3, min(2 * repeats,
    budget / estimate)) calls. Returns (median, samples, the first output)."""
    count = max(3, min(2 * repeats, int(budget_s / max(estimate_s, 1e-9))))
    samples, first = [], None
    for i in range(count):
        t = clock()
        y = call(i)
        mx.eval(y)
        samples.append(clock() - t)
        if first is None:
            first = y
    return statistics.median(samples), samples, first

