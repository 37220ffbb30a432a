"""Check marlin_dsl/machine/cuda/sparse_layout.py against the GPU.

Generates random 2:4-sparse A (16 x 32), B (32 x 8) and C (16 x 8) of small integers (exact in
f16, bf16 and f32), builds every lane's A/B/C registers and metadata word with the layout
module, runs `mma.sp::ordered_metadata ... m16n8k32` on the GPU (bench/probes/mma_sp_probe.cu, built
here with nvcc) and compares the D registers, mapped back with the module's accumulator
layout, with A @ B + C exactly.  Cases: f16 and bf16, selector 0 and 1 (the lanes the selector
does not read carry other, valid metadata, so a wrong lane mapping cannot pass by accident),
and one metadata register shared by two tiles (pack_metadata_pair: tile 0 with selector 0,
tile 1 with selector 1).  On a failure it reports which alternative metadata layouts, if any,
would explain the GPU's result.

    python3 bench/probes/mma_sp_probe.py                       # nvcc from PATH or /usr/local/cuda/bin
    python3 bench/probes/mma_sp_probe.py --nvcc /usr/local/cuda-12.4/bin/nvcc --arch sm_90

Exit status: 0 all PASS, 1 some FAIL, 2 build/run error, 3 no nvcc found.  Needs only numpy.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CU = HERE / "mma_sp_probe.cu"


def _load_layout():
    # Load the module by path so that the probe needs numpy only (not the package's deps).
    path = ROOT / "marlin_dsl" / "machine" / "cuda" / "sparse_layout.py"
    spec = importlib.util.spec_from_file_location("cuda_sparse_layout", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


sl = _load_layout()

CASE_DTYPE = np.dtype([("kind", "<i4"), ("pad", "<i4"), ("a", "<u4", (32, 4)),
                       ("b", "<u4", (32, 4)), ("c", "<f4", (32, 4)), ("meta", "<u4", (32,))])


def find_nvcc(explicit: str | None) -> str | None:
    if explicit:
        p = shutil.which(explicit) or (explicit if os.access(explicit, os.X_OK) else None)
        return p
    for cand in [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc",
                 *sorted(glob.glob("/usr/local/cuda-*/bin/nvcc"), reverse=True)]:
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def build(nvcc: str, arch: str, out: Path) -> tuple[bool, str]:
    """Compile the probe; falls back to plain mma.sp for toolkits without ::ordered_metadata.
    Returns (ordered, log)."""
    log = ""
    for extra, ordered in (([], True), (["-DMMA_SP_UNORDERED"], False)):
        cmd = [nvcc, f"-arch={arch}", "-O2", *extra, "-o", str(out), str(CU)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            return ordered, log + "nvcc timed out\n"
        log += " ".join(cmd) + "\n" + r.stdout + r.stderr
        if r.returncode == 0:
            return ordered, log
    raise RuntimeError("nvcc failed:\n" + log)


class Case:
    def __init__(self, name, dtype, selector, a, b, c, meta, vals):
        self.name, self.dtype, self.selector = name, dtype, selector
        self.a, self.b, self.c, self.meta, self.vals = a, b, c, meta, vals

    def record(self):
        rec = np.zeros((), dtype=CASE_DTYPE)
        rec["kind"] = self.selector | (2 if self.dtype == "bf16" else 0)
        rec["a"] = sl.to_b32_registers(sl.a_lane_values(self.vals), self.dtype)
        rec["b"] = sl.to_b32_registers(sl.b_lane_values(self.b), self.dtype)
        rec["c"] = sl.c_lane_values(self.c).astype(np.float32)
        rec["meta"] = self.meta
        return rec

    def expected(self):
        return self.a @ self.b + self.c


def _rand_positions(rng):
    return np.sort(np.argsort(rng.random((16, 8, 4)), axis=-1)[..., :2], axis=-1)


def make_cases(rng, trials: int):
    cases = []
    for dtype in ("f16", "bf16"):
        for sel in (0, 1):
            for i in range(trials):
                a = sl.random_2of4(rng, allow_fewer=(i % 2 == 1))
                b = rng.integers(-4, 5, size=(32, 8)).astype(np.float64)
                c = rng.integers(-16, 17, size=(16, 8)).astype(np.float64)
                vals, pos = sl.compress_2of4(a)
                meta = sl.pack_metadata(pos, sel) | sl.pack_metadata(_rand_positions(rng), 1 - sel)
                cases.append(Case(f"{dtype} selector={sel}", dtype, sel, a, b, c, meta, vals))
        for i in range(trials):
            a0, a1 = sl.random_2of4(rng, allow_fewer=False), sl.random_2of4(rng, allow_fewer=False)
            b = rng.integers(-4, 5, size=(32, 8)).astype(np.float64)
            c = rng.integers(-16, 17, size=(16, 8)).astype(np.float64)
            v0, p0 = sl.compress_2of4(a0)
            v1, p1 = sl.compress_2of4(a1)
            meta = sl.pack_metadata_pair(p0, p1)
            cases.append(Case(f"{dtype} pair tile0 (sel 0)", dtype, 0, a0, b, c, meta, v0))
            cases.append(Case(f"{dtype} pair tile1 (sel 1)", dtype, 1, a1, b, c, meta, v1))
    return cases


# --- alternative metadata layouts, for diagnosing a failure ------------------------------

def _alt_fields(selector, variant):
    r, j, s = np.meshgrid(np.arange(16), np.arange(8), np.arange(2), indexing="ij")
    r, j, s = r.ravel(), j.ravel(), s.ravel()
    if variant == "model":
        return sl.metadata_fields(selector)
    if variant == "nibbles reversed in each 16-bit half":
        lanes = 4 * (r & 7) + 2 * selector + (j >> 2)
        bits = 16 * (r >> 3) + 4 * (3 - (j & 3)) + 2 * s
    elif variant == "lane bit 0 = row half (lane holds a full row)":
        lanes = 4 * (r & 7) + 2 * selector + (r >> 3)
        bits = 4 * j + 2 * s
    elif variant == "lane bit 0 = row half, halves interleaved":
        lanes = 4 * (r & 7) + 2 * selector + (r >> 3)
        bits = 16 * (j >> 2) + 4 * (j & 3) + 2 * s
    elif variant == "slots swapped in a nibble":
        lanes = 4 * (r & 7) + 2 * selector + (j >> 2)
        bits = 16 * (r >> 3) + 4 * (j & 3) + 2 * (1 - s)
    elif variant == "T1 holds columns 0..15 (pair roles swapped)":
        lanes = 4 * (r & 7) + 2 * selector + (1 - (j >> 2))
        bits = 16 * (r >> 3) + 4 * (j & 3) + 2 * s
    else:
        raise ValueError(variant)
    return lanes, bits, r, j, s


ALT_VARIANTS = ("model", "nibbles reversed in each 16-bit half",
                "lane bit 0 = row half (lane holds a full row)",
                "lane bit 0 = row half, halves interleaved", "slots swapped in a nibble",
                "T1 holds columns 0..15 (pair roles swapped)")


def _alt_expected(case, variant):
    lanes, bits, rows, groups, slots = _alt_fields(case.selector, variant)
    pos = np.zeros((16, 8, 2), dtype=np.int64)
    pos[rows, groups, slots] = (case.meta.astype(np.uint64)[lanes] >> bits.astype(np.uint64)) & 3
    if np.any(pos[..., 0] == pos[..., 1]):
        return None
    dense = np.zeros((16, 8, 4))
    v = case.vals.reshape(16, 8, 2)
    for s in range(2):  # unordered pairs are fine for this what-if
        np.put_along_axis(dense, pos[..., s:s + 1], v[..., s:s + 1], axis=-1)
    return dense.reshape(16, 32) @ case.b + case.c


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvcc", help="nvcc to use (default: PATH, then /usr/local/cuda/bin/nvcc)")
    ap.add_argument("--arch", default="sm_90", help="nvcc -arch (default sm_90)")
    ap.add_argument("--trials", type=int, default=8, help="random trials per case (default 8)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--keep", help="directory to keep the binary and data files in")
    args = ap.parse_args(argv)

    nvcc = find_nvcc(args.nvcc)
    if nvcc is None:
        print("mma_sp_probe: no nvcc found (tried --nvcc, PATH, /usr/local/cuda/bin, "
              "/usr/local/cuda-*/bin); pass --nvcc /path/to/nvcc", file=sys.stderr)
        return 3

    rng = np.random.default_rng(args.seed)
    cases = make_cases(rng, args.trials)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="mma_sp_probe_"))
    work.mkdir(parents=True, exist_ok=True)
    exe, fin, fout = work / "mma_sp_probe", work / "in.bin", work / "out.bin"
    try:
        ordered, log = build(nvcc, args.arch, exe)
    except RuntimeError as exc:
        print(f"mma_sp_probe: BUILD ERROR\n{exc}", file=sys.stderr)
        return 2
    print(f"nvcc: {nvcc}  arch: {args.arch}  instruction: "
          + ("mma.sp::ordered_metadata" if ordered else
             "mma.sp (toolkit lacks ::ordered_metadata; same metadata, ordered)"))

    recs = np.stack([c.record() for c in cases])
    with open(fin, "wb") as f:
        np.array([len(cases)], dtype="<i4").tofile(f)
        recs.tofile(f)
    try:
        r = subprocess.run([str(exe), str(fin), str(fout)], capture_output=True, text=True,
                           timeout=60)
    except subprocess.TimeoutExpired:
        print("mma_sp_probe: RUN ERROR: timed out", file=sys.stderr)
        return 2
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        print(f"mma_sp_probe: RUN ERROR (exit {r.returncode})\n{r.stderr}", file=sys.stderr)
        return 2
    out = np.fromfile(fout, dtype="<f4").reshape(len(cases), 32, 4)

    results: dict[str, list[bool]] = {}
    failures = []
    for case, d_regs in zip(cases, out):
        d = sl.d_from_lane_values(d_regs)
        ok = np.array_equal(d, case.expected())
        results.setdefault(case.name, []).append(ok)
        if not ok:
            failures.append((case, d))
    for name, oks in results.items():
        print(f"{'PASS' if all(oks) else 'FAIL'}  {name}  ({sum(oks)}/{len(oks)} trials exact)")
    if failures:
        case, d = failures[0]
        bad = np.argwhere(d != case.expected())
        print(f"first failure: {case.name}: {len(bad)} of 128 D entries differ, e.g. "
              f"(row, col) {bad[:6].tolist()}; max |diff| "
              f"{np.nanmax(np.abs(d - case.expected())):g}")
        for variant in ALT_VARIANTS:
            hits = []
            for c2, d2 in failures:
                exp = _alt_expected(c2, variant)
                hits.append(exp is not None and np.array_equal(d2, exp))
            print(f"  what-if '{variant}': explains {sum(hits)}/{len(failures)} failures")
        return 1
    print("ALL PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
