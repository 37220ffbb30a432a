"""The kernels of bench/probes/decode_sweep.py: the candidate schedules (the tuned ones and the grid
the command line asks for), built and printed for CUDA, the probe variants (printed text with a
load's caching changed), and the kernels folder a dry run writes and the GPU run reads."""
from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path

# ----- candidates -----------------------------------------------------------------------------------

def candidates(args) -> list[dict]:
    """[{name, format, m, tuned_for: [(K, N)], schedule fields}]: one entry per distinct kernel."""
    import marlin_dsl as md
    from marlin_dsl import CUDA
    from marlin_dsl.errors import ScheduleError
    from marlin_dsl.layouts.weight_stream import stream_layout
    from marlin_dsl.schedule import Schedule, WeightStream
    from marlin_dsl.targets.cuda.tuning import tuned_schedule

    shapes = parse_shapes(args.shapes)
    out: dict[str, dict] = {}

    def add(fmt_name: str, m: int, tile_m: int, warps_n: int, k_warps: int, depth: int, unroll: int,
            vectors: int, tuned_for: tuple[int, int] | None = None, n_tiles: int = 1, stages: int = 0,
            x_ahead: int = 0, x_shuffle: int = 0) -> None:
        tile_n = 16 * warps_n * n_tiles
        name = kernel_name(fmt_name, m, tile_m, tile_n, n_tiles, k_warps, depth, unroll, vectors, stages, x_ahead,
                           x_shuffle)
        key = f"{name}@m{m}"  # a kernel serves any M; each M it is a candidate for is timed
        if key not in out:
            fmt = md.builtin_format(fmt_name)
            chunk = stream_layout(fmt, CUDA).dense_chunk
            sched = Schedule(name, tile_m=tile_m, tile_n=tile_n, tile_k=vectors * chunk,
                             warps_m=1, warps_n=warps_n,
                             pipeline=WeightStream(k_warps=k_warps, depth=depth, unroll=unroll, stages=stages,
                                                    x_ahead=x_ahead, x_shuffle=x_shuffle))
            try:
                sched.check(fmt, CUDA)
            except ScheduleError as exc:
                print(f"skip {name}: {exc}")
                return
            out[key] = {"name": name, "format": fmt_name, "m": m, "tile_m": tile_m, "tile_n": tile_n,
                         "warps_n": warps_n, "n_tiles": n_tiles, "k_warps": k_warps, "depth": depth, "unroll": unroll,
                         "vectors": vectors, "stages": stages, "x_ahead": x_ahead, "x_shuffle": x_shuffle,
                         "tuned_for": [], "schedule": sched}
        if tuned_for is not None:
            out[key]["tuned_for"].append(list(tuned_for))

    for fmt_name in args.formats.split(","):
        fmt = md.builtin_format(fmt_name)
        for m in ints(args.ms):
            # tile_m 8 below 9 rows, else 16; --tile-m 8 also runs M = 16 as two 8-row tiles over
            # the same weights (the second read from L2)
            tile_m = args.tile_m or (8 if m <= 8 else 16)
            for k, n in shapes:
                t = tuned_schedule(fmt, m, CUDA, k, n)
                add(fmt_name, m, t.tile_m, t.warps_n, **_grid_fields(fmt, t), tuned_for=(k, n))
            for k_warps, depth, warps_n, unroll, vectors, n_tiles, stages, x_ahead, x_shuffle in itertools.product(
                    ints(args.k_warps), ints(args.depth), ints(args.warps_n), ints(args.unroll), ints(args.vectors),
                    ints(args.n_tiles), ints(args.stages), ints(args.x_ahead), ints(args.x_shuffle)):
                # a warp's registers grow with its N tiles: past 1024 "thread-tiles" ptxas's count
                # (130-168 for 4 tiles of 512 threads) exceeds what 65536 registers allow
                if 32 * k_warps * warps_n <= 1024 and 32 * k_warps * n_tiles <= 1024:
                    add(fmt_name, m, tile_m, warps_n, k_warps, depth, unroll, vectors, n_tiles=n_tiles, stages=stages,
                        x_ahead=x_ahead, x_shuffle=x_shuffle)
    return list(out.values())


def kernel_name(fmt_name: str, m: int, tile_m: int, tile_n: int, n_tiles: int, k_warps: int, depth: int,
                unroll: int, vectors: int, stages: int = 0, x_ahead: int = 0, x_shuffle: int = 0) -> str:
    """A candidate's name: its schedule's fields. n_tiles > 1: one warp decodes several 16-row
    N tiles and reuses each B fragment (activation load) across them; `_s`: the weight words
    through a shared ring; `_xa`: B fragments loaded a step ahead; `_xs{L}`: activation loads
    shared by L lanes through warp shuffles; `_at{m}`: M tiles smaller
    than the default's for M (8 below 9 rows, else 16)."""
    wide = f"t{n_tiles}" if n_tiles > 1 else ""
    ring = f"_s{stages}" if stages else ""
    xa = f"_xa{x_ahead}" if x_ahead else ""
    xs = f"_xs{x_shuffle}" if x_shuffle else ""
    at = f"_at{m}" if tile_m < (8 if m <= 8 else 16) else ""
    return f"{fmt_name}_m{tile_m}_n{tile_n}{wide}_kw{k_warps}_d{depth}_u{unroll}_v{vectors}{ring}{xa}{xs}{at}"


def _grid_fields(fmt, sched) -> dict:
    """A weight-stream schedule's grid fields (k_warps, depth, unroll, vectors, n_tiles, stages,
    x_ahead) as `candidates` names them."""
    from marlin_dsl import CUDA
    from marlin_dsl.layouts.weight_stream import stream_layout

    p = sched.pipeline
    return {"k_warps": p.k_warps, "depth": p.depth, "unroll": p.unroll,
            "vectors": sched.tile_k // stream_layout(fmt, CUDA).dense_chunk,
            "n_tiles": sched.tile_n // (16 * sched.warps_n), "stages": p.stages, "x_ahead": p.x_ahead,
            "x_shuffle": p.x_shuffle}


def tuned_kernel_name(fmt_name: str, m: int, k: int, n: int) -> str:
    """The name `candidates` gives the tuned schedule for M rows of a [K, N] weight."""
    import marlin_dsl as md
    from marlin_dsl import CUDA
    from marlin_dsl.targets.cuda.tuning import tuned_schedule

    fmt = md.builtin_format(fmt_name)
    t = tuned_schedule(fmt, m, CUDA, k, n)
    return kernel_name(fmt_name, m, t.tile_m, t.tile_n, **_grid_fields(fmt, t))


def build(cands: list[dict], act: str = "f16") -> None:
    """Compile and print every candidate: entry["kernel"] (IR) and entry["source"] (CudaSource)."""
    from marlin_dsl import CUDA, Gemm, builtin_format
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.targets.cuda.launch import gemm_inout_inputs
    from marlin_dsl.targets.cuda.printer import print_cuda

    for c in cands:
        c["gemm"] = Gemm(c["name"], builtin_format(c["format"]), c["schedule"], act)
        c["kernel"] = compile_gemm(c["gemm"], CUDA).kernel
        c["source"] = print_cuda(c["kernel"], inout_inputs=gemm_inout_inputs(c["kernel"]))


#: Probe variants (`--probe`): the printed text of each candidate changed, to test a hypothesis
#: before the IR carries it. "l1na": weight words loaded with ld.global.nc.L1::no_allocate
#: (streamed past L1, which keeps the activations). "xpf1" / "xpf2": after each activation
#: load, a `prefetch.global.L1` of the same lane's activations 1 / 2 steps ahead (no
#: registers held; bounded by M * K), so a step's activations wait less on L2.
WEIGHT_LOAD = "*reinterpret_cast<const mdsl::vec<uint32_t, 4>*>(&qweight["
X_LOAD = re.compile(r"(= \*reinterpret_cast<const mdsl::vec<__half, \d+>\*>\(&x\[(v_\w+)\]\);)")
PROBE_HELPER = r"""
__device__ __forceinline__ mdsl::vec<uint32_t, 4> mdsl_probe_ld(const uint32_t* p) {
  mdsl::vec<uint32_t, 4> r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.v[0]), "=r"(r.v[1]), "=r"(r.v[2]), "=r"(r.v[3]) : "l"(p));
  return r;
}
__device__ __forceinline__ void mdsl_probe_pf(const __half* x, uint32_t i, uint32_t n) {
  if (i < n) asm volatile("prefetch.global.L1 [%0];" ::"l"(x + i));
}
"""
PROBES = ("l1na", "xpf1", "xpf2")


def probe_body(c: dict, probe: str) -> str | None:
    """The candidate's body with `probe` applied (None: nothing to change in it)."""
    body = c["source"].body
    if probe == "l1na":
        return body.replace(WEIGHT_LOAD, "mdsl_probe_ld(&qweight[") if WEIGHT_LOAD in body else None
    if c["source"].elems.get("x") != "f16" or not X_LOAD.search(body) or "v_M0" not in body or "v_K0" not in body:
        return None
    ahead = int(probe[-1]) * c["k_warps"] * c["schedule"].tile_k  # activations a step ahead: k_warps steps on
    return X_LOAD.sub(lambda mt: f"{mt.group(1)} mdsl_probe_pf(x, {mt.group(2)} + {ahead}u, v_M0 * v_K0);", body)


def probe_variants(cands: list[dict], probes: list[str]) -> list[dict]:
    """Copies of the candidates with their printed text mutated (`PROBE_HELPER`); the GPU
    checks run them against the reference like every candidate."""
    out = []
    for probe in probes:
        if probe not in PROBES:
            raise SystemExit(f"--probe: unknown variant {probe!r} (known: {', '.join(PROBES)})")
        for c in cands:
            body = probe_body(c, probe)
            if body is None:
                continue
            src = c["source"]
            v = dict(c, name=f"{c['name']}_{probe}", tuned_for=[], probe=probe)
            v["source"] = dataclasses.replace(src, name=f"{src.name}_{probe}", body=body,
                                              declarations=src.declarations + PROBE_HELPER)
            out.append(v)
    return out


def write_kernels(cands: list[dict], root: Path) -> None:
    """manifest.json + one CudaSource JSON and one readable .cu per kernel."""
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for c in cands:
        (root / f"{c['name']}.json").write_text(json.dumps(c["source"].to_json()))
        (root / f"{c['name']}.cu").write_text(c["source"].full_source())
        entries.append({**public(c), "file": f"{c['name']}.json"})
    (root / "manifest.json").write_text(json.dumps({"kernels": entries}, indent=1))


def load_kernels(root: Path, args) -> list[dict]:
    from marlin_dsl.targets.cuda.source import CudaSource

    manifest = json.loads((root / "manifest.json").read_text())
    formats, ms = set(args.formats.split(",")), set(ints(args.ms))
    cands = [dict(e) for e in manifest["kernels"] if e["format"] in formats and e["m"] in ms]
    for c in cands:
        c["source"] = CudaSource.from_json(json.loads((root / c["file"]).read_text()))
    return cands


def public(c: dict) -> dict:
    """The JSON-safe fields of a candidate."""
    return {k: v for k, v in c.items() if k not in ("schedule", "gemm", "kernel", "source", "launcher")}


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",")]  # type: ignore[misc]


__all__ = ["candidates", "kernel_name", "tuned_kernel_name", "build", "probe_variants", "write_kernels", "load_kernels", "public", "ints", "parse_shapes"]
