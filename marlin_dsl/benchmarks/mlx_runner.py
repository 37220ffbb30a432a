"""Subjects on MLX's GPU device for `marlin-dsl bench`: our kernels, compiled and launched
through MLX by the runtime of the machine's GPU backend (`TargetRuntime.timed_kernel`, e.g. the
CUDA launcher or Metal's generated launcher; its tuned schedules, `tuned_schedule`), and MLX's
own baselines (`mx.quantized_matmul`, float16 `mx.matmul`). MLX and the compiler are imported
only when a runner is made or a kernel compiled: without them the bench says what is missing."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import time
from typing import Callable

import numpy as np

from ..formats import pack_weights as api
from ..errors import MarlinDSLError
from ..formats import dequantize
from ..formats.builtin import builtin_format
from ..schedule import Gemm
from .cases import DEFAULT_REPEATS, FP16, FP16_FORMAT, QMM, QMM_FORMAT, Measurement, Subject, bench_schedule
from .device import device_info, gpu_backend, machine
from .timing import BATCH_LAUNCHES, copies_for, e2e_time, kernel_time

#: The copy-bandwidth measurement: a chain of negations of a 1 GiB float32 array.
COPY_BYTES = 1 << 30
COPY_CHAIN = 8
COPY_SAMPLES = 5


def _rel_error(mx, y, ref) -> float:
    d = y.astype(mx.float32).reshape(ref.shape) - ref
    num = mx.sqrt(mx.sum(d * d))
    den = mx.sqrt(mx.sum(ref * ref))
    return float((num / mx.maximum(den, 1e-30)).item())


def _host_copy(mx, a):
    """A new device array with a's contents (through host memory, so never an alias)."""
    return mx.array(np.array(a))


class _Subject:
    def __init__(self, runner: "MLXRunner", kind: str, fmt: str, pipeline: str, k: int, n: int,
                 weight_bytes: int, copies: int, make_launch, make_call, reference) -> None:
        self.runner, self.kind, self.format, self.pipeline = runner, kind, fmt, pipeline
        self.k, self.n, self.weight_bytes, self.copies = k, n, weight_bytes, copies
        self._make_launch, self._make_call, self._reference = make_launch, make_call, reference

    def measure(self, m: int) -> Measurement:
        mx, r = self.runner.mx, self.runner
        x = r.activations(m, self.k)
        launch = self._make_launch(x, m)
        timed = kernel_time(mx, launch, r.repeats)
        et, esamples, y = e2e_time(mx, self._make_call(x, m), r.repeats, timed.estimate_s)
        prepared, _, _ = e2e_time(mx, launch, 2, timed.estimate_s, budget_s=0.05)
        ref = self._reference(x)
        rel = _rel_error(mx, y, ref)
        del y, ref, launch
        return Measurement(timed.per_launch_s, et, timed.launches, self.copies, rel, timed.samples_s,
                           esamples, timed.queue_s, timed.first_s, prepared)


class MLXRunner:
    """Subjects on MLX's GPU device: our kernels (through the backend's runtime) and MLX's
    baselines. Weight copies are uploaded per (K, N) and freed by
    `end_shape`."""

    def __init__(self, repeats: int = DEFAULT_REPEATS, log: Callable[..., None] | None = None,
                 seed: int = 0, serialize: bool = True) -> None:
        # Both are read once, at MLX's first evaluation on the GPU: set them before it.
        if serialize:
            os.environ.setdefault("MLX_MAX_OPS_PER_BUFFER", "1")
        os.environ.setdefault("MLX_ENABLE_TF32", "0")  # the float32 references stay float32
        try:
            import mlx.core as mx
        except ImportError:
            mx = None
        self.backend = gpu_backend(mx)
        self.mx = mx
        mx.set_default_device(mx.gpu)
        self.repeats = repeats
        self.log = log or (lambda *a: None)
        self.seed = seed
        self._weights: dict[tuple[int, int], np.ndarray] = {}
        self._x: dict[tuple[int, int], object] = {}
        self._gemms: dict[tuple[str, str], object] = {}
        self._packed: dict[tuple[str, int, int], dict] = {}
        self.compile_s: dict[str, float] = {}
        self._runtime = None  # the backend's TargetRuntime, looked up with the first kernel

    # ----- environment ------------------------------------------------------------------------

    def environment(self) -> dict:
        mx = self.mx
        info = device_info(mx)
        return {
            "device_name": str(info.get("device_name", mx.default_device())),
            "device": str(mx.default_device()), "backend": self.backend, "device_info": info,
            "mlx": mx.__version__, "numpy": np.__version__, "python": platform.python_version(),
            "host": platform.node(), "platform": machine(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "MLX_MAX_OPS_PER_BUFFER": os.environ.get("MLX_MAX_OPS_PER_BUFFER"),
            "MLX_ENABLE_TF32": os.environ.get("MLX_ENABLE_TF32"),
            "launch_floor_us": round(self.launch_floor() * 1e6, 2),
        }

    def launch_floor(self) -> float:
        mx = self.mx
        one = mx.array(np.ones(1, np.float32))
        return kernel_time(mx, lambda i: -one, max(self.repeats, 5)).per_launch_s

    def copy_bandwidth(self) -> dict:
        mx = self.mx
        a = mx.array(np.ones(COPY_BYTES // 4, np.float32))
        mx.eval(a)

        def chain():
            b = a
            for _ in range(COPY_CHAIN):
                b = -b
            return b

        mx.eval(chain())  # warm-up: allocation, first touch
        mx.synchronize()
        samples = []
        for _ in range(COPY_SAMPLES):
            b = chain()
            mx.synchronize()
            t = time.perf_counter()
            mx.eval(b)
            mx.synchronize()
            samples.append(time.perf_counter() - t)
            del b
        moved = 2 * COPY_BYTES * COPY_CHAIN
        med = statistics.median(samples)
        del a
        return {"bytes_per_s": moved / med, "array_bytes": COPY_BYTES, "chain": COPY_CHAIN,
                "bytes_per_sample": moved, "samples_s": [round(s, 6) for s in samples],
                "method": "b = -b repeated `chain` times on a 1 GiB float32 array, one eval; "
                          "(bytes read + written) / median time"}

    # ----- inputs -----------------------------------------------------------------------------

    def weight(self, k: int, n: int) -> np.ndarray:
        """The random weight of this shape, float32 [K, N], standard normal * 0.02."""
        if (k, n) not in self._weights:
            rng = np.random.default_rng([self.seed, k, n])
            self._weights[(k, n)] = (rng.standard_normal((k, n), dtype=np.float32) * 0.02)
        return self._weights[(k, n)]

    def activations(self, m: int, k: int):
        mx = self.mx
        if (m, k) not in self._x:
            rng = np.random.default_rng([self.seed, 1, m, k])
            self._x[(m, k)] = mx.array(rng.standard_normal((m, k), dtype=np.float32).astype(np.float16))
            mx.eval(self._x[(m, k)])
        return self._x[(m, k)]

    def end_shape(self) -> None:
        self._weights.clear()
        self._x.clear()
        self._packed.clear()
        try:
            self.mx.clear_cache()
        except Exception:  # noqa: BLE001
            pass

    # ----- MLX's kernels ----------------------------------------------------------------------

    def baselines(self, k: int, n: int) -> list[Subject]:
        mx = self.mx
        w = self.weight(k, n)
        w16 = mx.array(w.astype(np.float16))
        wt = mx.array(np.ascontiguousarray(w.T).astype(np.float16))  # [N, K] as QuantizedLinear holds it
        wq, scales, biases = mx.quantize(wt, group_size=64, bits=4)
        mx.eval(wq, scales, biases, w16)
        q_bytes = int(wq.nbytes + scales.nbytes + biases.nbytes)
        q_copies = [tuple(_host_copy(mx, a) for a in (wq, scales, biases)) for _ in range(copies_for(q_bytes))]
        f_copies = [_host_copy(mx, w16) for _ in range(copies_for(w16.nbytes))]
        mx.eval(*[a for c in q_copies for a in c], *f_copies)
        deq = mx.dequantize(wq, scales, biases, group_size=64, bits=4)  # [N, K]

        def q_launch(x, m):
            return lambda i: mx.quantized_matmul(x, *q_copies[i % len(q_copies)], transpose=True,
                                                 group_size=64, bits=4)

        def f_launch(x, m):
            return lambda i: mx.matmul(x, f_copies[i % len(f_copies)])

        qmm = _Subject(self, "mlx_q4", QMM_FORMAT, QMM, k, n, q_bytes, len(q_copies), q_launch, q_launch,
                       lambda x: mx.matmul(x.astype(mx.float32), deq.astype(mx.float32).T))
        fp16 = _Subject(self, "fp16", FP16_FORMAT, FP16, k, n, int(w16.nbytes), len(f_copies), f_launch,
                        f_launch, lambda x: mx.matmul(x.astype(mx.float32), w16.astype(mx.float32)))
        return [fp16, qmm]

    # ----- ours -------------------------------------------------------------------------------

    def _packed_weights(self, fmt_name: str, k: int, n: int) -> dict:
        key = (fmt_name, k, n)
        if key not in self._packed:
            self._packed = {kk: v for kk, v in self._packed.items() if kk[0] == fmt_name}  # one format at a time
            t = time.perf_counter()
            packed = api.pack(builtin_format(fmt_name), self.weight(k, n))
            dense = self.mx.array(dequantize(packed).astype(np.float32))
            self._packed[key] = {"packed": packed, "dense": dense, "copies": {}}
            self.log(f"  [{fmt_name} K={k} N={n}: packed in {time.perf_counter() - t:.1f} s, "
                     f"{packed.nbytes / 2**20:.1f} MiB]")
        return self._packed[key]

    def runtime(self):
        """The `TargetRuntime` of this machine's GPU backend. The runtimes import the compiler,
        which needs networkx: imported once it is known to be there."""
        if self._runtime is None:
            try:
                import networkx  # noqa: F401
            except ImportError as exc:
                raise MarlinDSLError(f"compiling the kernels needs networkx ({exc}): install marlin_dsl's "
                                     "dependencies on this machine (pip install marlin-dsl)") from None
            from ..targets.runtimes import runtime_for

            self._runtime = runtime_for(self.backend)
        return self._runtime

    def _gemm(self, fmt_name: str, pipeline: str, m: int = 1, k: int | None = None, n: int | None = None):
        runtime = self.runtime()
        schedule = bench_schedule(builtin_format(fmt_name), pipeline, m, k, n, tuned=runtime.tuned_schedule)
        key = (fmt_name, pipeline, schedule.name)
        if key not in self._gemms:
            from ..compiler import compile_gemm  # networkx: runtime() checked it is there

            t = time.perf_counter()
            fmt = builtin_format(fmt_name)
            gemm = Gemm(f"bench_{fmt_name}_{pipeline}_f16", fmt, schedule, activation="f16")
            self._gemms[key] = runtime.timed_kernel(compile_gemm(gemm, runtime.target))
            self.compile_s[f"{fmt_name}/{pipeline}/{schedule.name}"] = round(time.perf_counter() - t, 2)
        return self._gemms[key]

    def marlin(self, fmt_name: str, pipeline: str, k: int, n: int) -> Subject:
        mx = self.mx
        gemm = self._gemm(fmt_name, pipeline, 1, k, n)
        entry = self._packed_weights(fmt_name, k, n)
        packed, dense = entry["packed"], entry["dense"]
        count = copies_for(packed.nbytes)
        reference = lambda x: mx.matmul(x.astype(mx.float32), dense)  # noqa: E731
        if gemm.weights_key not in entry["copies"]:  # one set per physical layout
            entry["copies"][gemm.weights_key] = gemm.weight_copies(packed, count)
        copies = entry["copies"][gemm.weights_key]
        for_m = lambda m: self._gemm(fmt_name, pipeline, m, k, n)  # noqa: E731  (M picks the schedule)
        return _Subject(self, "marlin", fmt_name, pipeline, k, n, packed.nbytes, count,
                        lambda x, m: for_m(m).launch_timed(copies, x, m, n, k, BATCH_LAUNCHES),
                        lambda x, m: for_m(m).timed_call(copies, x), reference)
