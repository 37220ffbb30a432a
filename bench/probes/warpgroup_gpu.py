"""The warpgroup (wgmma, sm_90a) GEMM kernels on an H100: correctness and speed, in one run.

Two steps, because the GPU machine has no package index:

1. Here (the whole compiler, nvcc): `python bench/probes/warpgroup_gpu.py prepare DIR` lowers and
   prints every kernel of the run, compiles each printed translation unit with nvcc for
   sm_90a to a cubin (wgmma exists only there) and writes DIR/<kernel>.json (the printed
   `CudaSource`: what the launcher needs) and DIR/<kernel>.cubin. The multistage kernels of
   the same formats (the mma.sync pipeline they replace at large M) go in as well.
2. On the GPU machine (MLX with its CUDA backend, numpy):
   `PYTHONPATH=/tmp/site:$PWD python3 bench/probes/warpgroup_gpu.py run DIR --out $OUT`
   launches each cubin with `mx.fast.precompiled_cuda_kernel` (MLX's `cuda_kernel` compiles
   for plain sm_90) and each multistage kernel with `mx.fast.cuda_kernel`.

Correctness: fresh random weights and activations per check (standard normal), outputs
poisoned with NaN, against the float64 reference (`marlin_dsl.reference_matmul`) under the
error model's checks (`marlin_dsl.checks.gpu_output`: the relative error within 1.5x of what
the roundings predict, no bias, no element off by > 5% rms); any NaN left fails. Results
record the commit and each kernel's digest. Shapes:
M = 1, 3, 65, 129, 300, 2048 with N and K tails.
Speed (M = 256 .. 2048 on 4096 x 4096, 4096 x 14336, 14336 x 4096): median seconds per
launch of back-to-back launches rotating over weight copies (`benchmarks.timing`), with
fp16 `mx.matmul`, MLX 4-bit `mx.quantized_matmul` (group 64) and the multistage kernel in
the same process; the timed format's bf16 kernels against bf16 `mx.matmul` ($WG_TIME_BF16=0
skips them). A table is printed last; DIR/results.json under --out.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

FORMATS = tuple(__import__("os").environ.get("WG_FORMATS", "fp4,int4,uint4_zp,nf4").split(","))
#: how many of SCHEDULES to build ($WG_SCHEDULES): the first is checked on every format and shape
ACTS = ("f16", "bf16")
#: (name, tile_m, warps_n, stages, depth, a_source): the schedules timed (the first is checked
#: on every format and shape)
SCHEDULES = (("wgs256x128s4d2", 256, 8, 4, 2, "shared"), ("wgs128x128s4", 128, 8, 4, 1, "shared"),
             ("wgr128x128s3", 128, 8, 3, 1, "registers"))
if __import__("os").environ.get("WG_SCHEDULE_SPECS"):
    # "name:tile_m:warps_n:stages:depth:a_source[:sparse_pass[:producers[:a_stages[:copies[:epilogue]]]]],..."
    # (a_source "registers+ahead": A in registers with Warpgroup.decode_ahead)
    SCHEDULES = tuple((f[0], int(f[1]), int(f[2]), int(f[3]), int(f[4]), f[5], *(int(v) for v in f[6:9]), *f[9:11])
                      for f in (spec.split(":") for spec in __import__("os").environ["WG_SCHEDULE_SPECS"].split(",")))
CHECK_SHAPES = ((1, 4096, 4096), (3, 4136, 4096), (65, 4104, 4224), (129, 256, 512),
                (300, 4096, 4096 + 128), (2048, 4096, 4096))
_ENV = __import__("os").environ
#: timed shapes and rows ($WG_TIME_KN="4096x4096,..." and $WG_TIME_MS="2048,..." narrow them)
TIME_KN = tuple(tuple(int(v) for v in kn.split("x")) for kn in
                _ENV.get("WG_TIME_KN", "4096x4096,4096x14336,14336x4096").split(",") if kn)
#: time the bf16 kernels of the timed format too ($WG_TIME_BF16=0: only f16)
TIME_BF16 = _ENV.get("WG_TIME_BF16", "1") != "0"
TIME_MS = tuple(int(v) for v in _ENV.get("WG_TIME_MS", "128,256,512,1024,2048").split(",") if v)


def kernel_specs():
    """(kernel name, format, activation, schedule) of every kernel of the run."""
    import marlin_dsl as md
    from marlin_dsl.layouts.weight_stream import stream_layout

    out = []
    for fmt_name in FORMATS:
        fmt = md.builtin_format(fmt_name)
        for act in ACTS:
            first = int(__import__("os").environ.get("WG_SCHEDULES", len(SCHEDULES)))
            scheds = SCHEDULES[:first] if fmt_name == FORMATS[0] else SCHEDULES[:1]
            for name, tm, wn, st, depth, a_source, *extra in scheds:
                sparse_pass, producers, a_stages, copies, epilogue = (
                    list(extra) + [2, 0, 3, "producers", "branch"][len(extra):])[:5]
                s = md.Schedule(name, tile_m=tm, tile_n=16 * wn, tile_k=stream_layout(fmt, md.CUDA).dense_chunk,
                                warps_m=1, warps_n=wn,
                                pipeline=md.Warpgroup(stages=st, depth=depth, a_source=a_source.split("+")[0],
                                                      decode_ahead=a_source.endswith("+ahead"),
                                                      sparse_pass=sparse_pass, producers=producers,
                                                      a_stages=a_stages, copies=copies, epilogue=epilogue))
                out.append((f"{fmt_name}_{act}_{name}", fmt, act, s))
        out.append((f"{fmt_name}_f16_multistage", fmt, "f16", md.multistage_schedule(fmt, 2048)))
    return out


def sparse_meta_hazards(sass: str) -> list[str]:
    """Writes to the metadata register of an `HGMMA.SP` before a `WARPGROUP.DEPBAR.LE gsb0, 0x0`
    retires it, in the SASS text's order (the lowering ends every loop pass with such a wait, so
    no back edge lies in between). The H100 reads that register when the instruction executes:
    such a write corrupts the warp's rows (issue15_h100_2026-11-25d/sparse_wgmma)."""
    import re

    live: dict[str, str] = {}  # metadata register -> the HGMMA.SP reading it
    found = []
    for line in sass.splitlines():
        ins = re.sub(r"/\*.*?\*/", "", line).strip().rstrip(";").strip()
        m = re.search(r"HGMMA\.SP\S* R\d+, gdesc\[\w+\], R\d+, (R\d+)", ins)
        if m:
            live[m.group(1)] = ins
            continue
        if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in ins:
            live.clear()
            continue
        words = ins.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        dst = words[1].rstrip(",") if len(words) > 1 else ""
        for reg in live:
            if dst == reg:
                found.append(f"{ins!r} writes {reg}, read by the queued {live[reg]!r}")
    return found


def prepare(out_dir: Path) -> int:
    import marlin_dsl as md
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.targets.cuda.launch import gemm_inout_inputs
    from marlin_dsl.targets.cuda.nvcc import find_nvcc
    from marlin_dsl.targets.cuda.printer import print_cuda
    from marlin_dsl.layouts.weight_stream import stream_layout

    nvcc = find_nvcc()
    if nvcc is None:
        print("nvcc not found", file=sys.stderr)
        return 3
    out_dir.mkdir(parents=True, exist_ok=True)
    index = []
    for name, fmt, act, sched in kernel_specs():
        kernel = compile_gemm(md.Gemm(name, fmt, sched, act), md.CUDA).kernel
        src = print_cuda(kernel, inout_inputs=gemm_inout_inputs(kernel))
        entry = {"name": name, "format": fmt.name, "act": act, "schedule": sched.name,
                 "pipeline": sched.pipeline.kind, "source": src.to_json()}
        if src.attrs.get("cuda_arch") == "sm_90a":
            cu = out_dir / f"{name}.cu"
            text = src.full_source(name=name)
            if sched.name.endswith("_nofence"):
                # a probe, not a kernel: without the async-proxy fences (MEMBAR.ALL.CTA +
                # FENCE.VIEW.ASYNC.S on the H100), what do they cost? Its results may be wrong.
                text = text.replace('asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");', ";")
                entry["probe"] = "no async-proxy fences"
            if sched.name.endswith("_fusedscale"):
                text = fused_scale_probe(text)
                entry["probe"] = "FP4 rebias folded into the scale splat (exact only for |scale| < 4)"
            cu.write_text(text)
            res = subprocess.run([nvcc, "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-cubin",
                                  "-o", str(out_dir / f"{name}.cubin"), str(cu), "-Xptxas", "-v"],
                                 capture_output=True, text=True)
            if res.returncode:
                print(res.stderr, file=sys.stderr)
                return 1
            regs = [ln.strip() for ln in res.stderr.splitlines() if "registers" in ln or "C75" in ln or "spill" in ln]
            entry["ptxas"] = regs
            # ptxas serialising the wgmmas (C7513-C7515) costs their overlap: say so loudly
            entry["serialized"] = any("serialized" in ln for ln in regs)
            if entry["serialized"]:
                print(f"WARNING {name}: ptxas serialised its wgmmas:", *[ln for ln in regs if "serialized" in ln],
                      file=sys.stderr)
            cuobjdump = shutil.which("cuobjdump")
            if cuobjdump and stream_layout(fmt, md.CUDA).sparse:  # kernels with the sparse wgmma
                sass = subprocess.run([cuobjdump, "-sass", str(out_dir / f"{name}.cubin")],
                                      capture_output=True, text=True).stdout
                hazards = sparse_meta_hazards(sass)
                entry["sparse_meta_hazards"] = hazards
                if hazards:
                    print(name, "sparse metadata hazards:", *hazards[:3], sep="\n  ", file=sys.stderr)
                    return 1
            cu.unlink()
            print(name, *regs)
        (out_dir / f"{name}.json").write_text(json.dumps(entry))
        index.append(name)
    (out_dir / "index.json").write_text(json.dumps(index))
    return 0


def fused_scale_probe(text: str) -> str:
    """A probe, not a kernel: the FP4 f16 decode with its rebias (x 2**14) folded into each
    scale splat (one HMUL2 per pair instead of two). Exact only while |scale| * 2**14 stays
    finite in f16 (|scale| < 4): what would the saved multiply buy?"""
    rebias = re.search(r"__half2 (v_v2_\d+) = __halves2half2\((v_c\d+), \2\);", text)
    if rebias is None:
        raise SystemExit("fused-scale probe: no rebias splat in the kernel text")
    splat = rebias.group(1)
    text, n_mul = re.subn(rf"__hmul2\((v_raw\d+), {splat}\)", r"\1", text)
    text, n_scale = re.subn(r"= __halves2half2\((v_(?!c)\w+), \1\);", rf"= __hmul2(__halves2half2(\1, \1), {splat});",
                            text)
    if not n_mul or not n_scale:
        raise SystemExit(f"fused-scale probe: {n_mul} rebias multiplies, {n_scale} scale splats")
    return text


# ----- on the GPU -----------------------------------------------------------------------------

class Precompiled:
    """A cubin launched with mx.fast.precompiled_cuda_kernel (inputs, then outputs)."""

    def __init__(self, source, cubin: bytes, name: str) -> None:
        self.source, self.cubin, self.name = source, cubin, name

    def __call__(self, mx, inputs, shapes, dtypes, scalars, init_value):
        s = self.source
        grid, tg = s.launch_dims(scalars)
        return mx.fast.precompiled_cuda_kernel(
            name=self.name, compiled_source=self.cubin, inputs=inputs, output_shapes=shapes,
            output_dtypes=dtypes, scalars=[], grid=grid, threadgroup=tg,
            shared_memory=s.dynamic_shared_bytes, init_value=init_value)


def run(kdir: Path, out: Path | None) -> int:
    import mlx.core as mx

    import marlin_dsl as md
    from marlin_dsl.benchmarks.timing import copies_for, kernel_time
    from marlin_dsl.checks.format_check import sample_weights
    from marlin_dsl.kernel_args import physical_arrays
    from marlin_dsl.targets.cuda.launch import build_cuda_kernel
    from marlin_dsl.targets.cuda.source import CudaSource
    from marlin_dsl.benchmarks.provenance import git_commit
    from marlin_dsl.checks.gpu_output import check_gpu_output, record

    log_lines: list[str] = []

    def log(*parts) -> None:
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        log_lines.append(line)

    results = {"device": None, "date": _dt.date.today().isoformat(), "checks": [], "times": [],
               "python": platform.python_version(), "mlx": mx.__version__, "commit": git_commit(ROOT)}
    try:
        import subprocess as sp
        results["device"] = sp.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                   capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    log("device:", results["device"], "mlx", mx.__version__)
    names = json.loads((kdir / "index.json").read_text())
    entries = {n: json.loads((kdir / f"{n}.json").read_text()) for n in names}
    # the printed text each result is about (CudaSource.digest: everything MLX compiles)
    digests = {n: CudaSource.from_json(e["source"]).digest for n, e in entries.items()}
    results["digests"] = digests
    mxd = {"f16": mx.float16, "bf16": mx.bfloat16}
    rng = np.random.default_rng(20261125)
    launchers = {}
    for n, e in entries.items():
        src = CudaSource.from_json(e["source"])
        if (kdir / f"{n}.cubin").exists():
            launchers[n] = ("pre", src, Precompiled(src, (kdir / f"{n}.cubin").read_bytes(), n))
        else:
            launchers[n] = ("jit", src, build_cuda_kernel(src, name=f"{n}_{src.digest[:12]}"))

    def launch(n, arrays, x, m, k, nn, poison=True):
        kind, src, obj = launchers[n]
        scalars = {"M": m, "N": nn, "K": k}
        if kind == "jit":
            from marlin_dsl.targets.cuda.launch import CudaWeights
            return obj(CudaWeights(arrays, (k, nn)), x, poison=poison)
        inputs = [x if nm == "x" else mx.array(src.dims(scalars)) if nm == "dims" else arrays[nm]
                  for nm in src.input_names]
        outs = obj(mx, inputs, [(m, nn)], [mxd[entries[n]["act"]]], scalars, float("nan") if poison else None)
        return outs[0]

    def device_arrays(src, packed):
        arrays = physical_arrays(src.attrs, packed)
        return {nm: mx.array(np.ascontiguousarray(arrays[nm]).ravel()) for nm in src.input_names
                if nm not in ("x", "dims")}

    failures = 0
    # ----- correctness
    for n, e in entries.items():
        if e["pipeline"] != "warpgroup":
            continue
        fmt = md.builtin_format(e["format"])
        shapes = CHECK_SHAPES if e["schedule"] == SCHEDULES[0][0] else CHECK_SHAPES[-2:]
        # $WG_CHECK_REPEAT: each check that many times (fresh inputs each): races show as rare misses
        for (m, nn, k) in [sh for sh in shapes for _ in range(int(_ENV.get("WG_CHECK_REPEAT", "1")))]:
            check = None
            try:
                packed = md.pack(fmt, sample_weights(fmt, k, nn, rng))
                x = rng.standard_normal((m, k))
                xa = mx.array(x.astype(np.float32)).astype(mxd[e["act"]])
                xr = np.array(xa.astype(mx.float32)).astype(np.float64)
                y = launch(n, device_arrays(launchers[n][1], packed), xa, m, k, nn)
                y = np.array(y.astype(mx.float32)).astype(np.float64)
                # the error model's checks (norm from the roundings, bias, worst element)
                check = check_gpu_output(y, xr, packed, e["act"])
                ref = md.reference_matmul(xr, packed)
                nan, err, ok = check.untouched, check.rel_error, check.ok
                # where any output is far off: a race that spoils one warp's rows moves the
                # norm of the error less than the bf16 tolerance (seen: 16 rows x 128 columns)
                bad = np.abs(np.nan_to_num(y) - ref) > 0.05 * np.sqrt(np.mean(ref ** 2))
                if bad.any():  # where the wrong outputs are (row = M, column = N)
                    bm, bn = np.nonzero(bad)
                    log(f"  {n} {(m, nn, k)}: {int(bad.sum())} outputs off by > 5% rms; M rows "
                        f"{sorted(set(bm.tolist()))[:12]} N cols {sorted(set(bn.tolist()))[:12]} "
                        f"({len(set(bm.tolist()))} rows, {len(set(bn.tolist()))} cols)")
            except Exception as ex:  # noqa: BLE001 - report and go on
                ok, err, nan = False, float("nan"), -1
                log("ERROR", n, (m, nn, k), repr(ex))
                traceback.print_exc()
            failures += not ok
            row = {"kernel": n, "shape": [m, nn, k], "rel_error": err, "nan": nan, "ok": ok,
                   "digest": digests.get(n)}
            if check is not None:
                row.update(record(check))
            results["checks"].append(row)
            log(f"check {n:28s} M={m:5d} N={nn:6d} K={k:6d} rel {err:.2e} nan {nan} {'ok' if ok else 'FAIL'}")
    # ----- speed
    for k, nn in TIME_KN:
        wf = rng.standard_normal((k, nn)).astype(np.float32)
        w16 = mx.array(wf.T).astype(mx.float16)  # [N, K] for x @ w.T
        qw, qs, qb = mx.quantize(w16, group_size=64, bits=4)
        time_fmt = md.builtin_format(FORMATS[0])  # the timed format: the first of the run
        packed = md.pack(time_fmt, sample_weights(time_fmt, k, nn, rng))
        some = next(n for n, e in entries.items() if e["format"] == FORMATS[0] and e["act"] == "f16")
        # every kernel of the format reads the same physical layout (lane_stream): one set of copies
        copies = [device_arrays(launchers[some][1], packed) for _ in range(copies_for(k * nn // 2))]
        mx.eval(*[a for c in copies for a in c.values()])
        for m in TIME_MS:
            x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(mx.float16)
            mx.eval(x, w16, qw, qs, qb)
            row = {"M": m, "N": nn, "K": k}
            t = kernel_time(mx, lambda i: mx.matmul(x, w16.T), 5)
            row["fp16_us"] = t.per_launch_s * 1e6
            t = kernel_time(mx, lambda i: mx.quantized_matmul(x, qw, qs, qb, transpose=True, group_size=64, bits=4), 5)
            row["mlx4_us"] = t.per_launch_s * 1e6
            xb = x.astype(mx.bfloat16)  # bf16 kernels against bf16 mx.matmul
            wb = w16.astype(mx.bfloat16)
            mx.eval(xb, wb)
            t = kernel_time(mx, lambda i: mx.matmul(xb, wb.T), 5)
            row["bf16_matmul_us"] = t.per_launch_s * 1e6
            for n, e in entries.items():
                if e["format"] != FORMATS[0] or (e["act"] == "bf16" and not TIME_BF16):
                    continue
                key = e["schedule"] + "_us" if e["act"] == "f16" else "bf16_" + e["schedule"] + "_us"
                xa = x if e["act"] == "f16" else xb
                try:
                    t = kernel_time(mx, lambda i: launch(n, copies[i % len(copies)], xa, m, k, nn, poison=False), 5)
                    row[key] = t.per_launch_s * 1e6
                except Exception as ex:  # noqa: BLE001
                    log("ERROR timing", n, repr(ex))
                    row[key] = None
            results["times"].append(row)
            cols = " ".join(f"{key[:-3]}={v:.1f}" for key, v in row.items() if key.endswith("_us") and v)
            log(f"time M={m} N={nn} K={k}: {cols}")
        copies.clear()  # free the weight copies before the next shape
    # ----- table
    log("\nwarpgroup speed (us per launch; x = fp16 time / kernel time):")
    for row in results["times"]:
        line = (f"  M={row['M']:5d} {row['K']}x{row['N']}: fp16 {row['fp16_us']:.1f}  bf16 {row['bf16_matmul_us']:.1f}  "
                f"mlx4 {row['mlx4_us']:.1f}  "
                f"multistage {row.get('multistage_large_us') or row.get('multistage_small_us') or 0:.1f}")
        for family in ("wg", "ws", "bf16_wg"):  # "ws...": schedules with warp roles (producers)
            times = [(v, key) for key, v in row.items() if key.startswith(family) and v]
            if times:
                best = min(times)
                base, base_name = ((row["bf16_matmul_us"], "bf16") if family.startswith("bf16") else
                                   (row["fp16_us"], "fp16"))
                line += f"  best {family} {best[0]:.1f} ({best[1][:-3]}, {base / best[0]:.2f}x {base_name})"
        log(line)
    log(f"correctness: {sum(c['ok'] for c in results['checks'])}/{len(results['checks'])} ok")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "warpgroup_results.json").write_text(json.dumps(results, indent=1))
        (out / "warpgroup.log").write_text("\n".join(log_lines) + "\n")
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("dir", type=Path)
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--out", type=Path)
    a = ap.parse_args()
    t = time.time()
    rc = prepare(a.dir) if a.cmd == "prepare" else run(a.dir, a.out)
    print(f"({time.time() - t:.0f} s)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
