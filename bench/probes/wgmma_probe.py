"""Check marlin_dsl/machine/cuda/wgmma_layout.py against the GPU (H100, sm_90a).

Builds, with the layout module only, every byte of the shared-memory tiles, every 64-bit matrix
descriptor, A-fragment register, sparse metadata word and C accumulator of random
integer-valued problems (exact in f16, bf16 and f32), runs them through bench/probes/wgmma_probe.cu
(built here with nvcc -arch=sm_90a) and compares the accumulators, mapped back with the
module's D layout, with A @ B + C exactly.  Cases, for f16 and bf16 and N in 8, 64, 128, 256:
- dense wgmma m64nNk16, 4 k-steps (K = 64) accumulating, A and B in shared memory in the
  no-swizzle layout with core matrices K-inner (LBO 128) and M/N-inner (SBO 128), in the
  128-byte swizzle layout (k-steps as +32-byte start addresses inside the 1024-byte atoms),
  and A from registers (B 128B-swizzled); one trial in two with scale-d = 0 on the first step;
- sparse wgmma m64nNk32 (2:4 A), 4 k-steps (K = 128), A in shared memory (no swizzle and
  128B) or registers, selector 0 and 1 (the other selector's threads carry other, valid
  metadata, so a wrong thread mapping cannot pass by accident);
- the tiles loaded by cp.async.bulk + mbarrier instead of st.shared, read back and compared.
On a failure it reports which alternative layouts (D halves, A registers, LBO/SBO, swizzle,
metadata) would explain the GPU's results.  With --bench it also times back-to-back wgmma
m64n256k16 against mma.sync m16n8k16 (TFLOP/s and their ratio).

    python3 bench/probes/wgmma_probe.py --out DIR [--bench] [--nvcc PATH] [--dry-run]

Writes DIR/wgmma_probe.json and prints a table.  Exit status: 0 all PASS, 1 some FAIL,
2 build/run error, 3 no nvcc found.  Needs only numpy.  --dry-run builds the cases, checks the
driver's own model on the CPU and compiles the probe, without running it.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CU = HERE / "wgmma_probe.cu"
sys.path.insert(0, str(HERE))
from mma_sp_probe import find_nvcc  # noqa: E402  (numpy-only sibling probe)


def _load(name: str):
    # By path, so that the probe needs numpy only (not the package's dependencies).
    path = ROOT / "marlin_dsl" / "machine" / "cuda" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"cuda_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


wl = _load("wgmma_layout")
sl = _load("sparse_layout")

WG, STEPS, MAX_ACC, SMEM_IMAGE = 128, 4, 128, 80 * 1024
V_BF16, V_AREG, V_SPARSE, V_SEL1 = 1, 2, 4, 8
CASE_DTYPE = np.dtype([
    ("n", "<i4"), ("variant", "<i4"), ("nsteps", "<i4"), ("scale_d", "<i4"),
    ("load_mode", "<i4"), ("smem_bytes", "<i4"), ("readback", "<i4"), ("pad", "<i4"),
    ("desc_a", "<u8"), ("desc_b", "<u8"), ("a_off", "<i4", (STEPS,)), ("b_off", "<i4", (STEPS,)),
    ("a_regs", "<u4", (STEPS, WG, 4)), ("meta", "<u4", (STEPS, WG)),
    ("c", "<f4", (WG, MAX_ACC)), ("smem", "u1", (SMEM_IMAGE,))])


class Tile:
    """A K-major tile (rows x kelems 16-bit elements) at byte `base` of the image."""

    def __init__(self, kind: str, rows: int, kelems: int, base: int):
        self.kind, self.rows, self.kelems, self.base = kind, rows, kelems, base
        self.size = rows * kelems * 2
        if kind == "interleave-k":      # core matrices K-inner: next 8 of K 128 bytes on
            self.lbo, self.sbo, self.swizzle = 128, kelems // 8 * 128, "none"
        elif kind == "interleave-mn":   # core matrices M/N-inner: next 8 rows 128 bytes on
            self.lbo, self.sbo, self.swizzle = rows // 8 * 128, 128, "none"
        elif kind == "128B":            # LBO unused for K-major swizzled layouts (CUTLASS: 1)
            self.lbo, self.sbo, self.swizzle = 16, 1024, "128B"
        else:
            raise ValueError(kind)

    def offsets(self, r, k):
        """Where the probe writes element (r, k): the layout module's canonical layouts."""
        if self.swizzle == "none":
            return self.base + wl.offset_interleave(r, k, self.lbo, self.sbo)
        return self.base + wl.offset_swizzle128(r, k, self.sbo, k_atom_stride=self.rows * 128)

    def step_offset(self, s: int, kstep: int) -> int:
        """Start address of k-step s: element (0, s * kstep) (row 0 is never swizzled)."""
        return int(self.offsets(np.array([0]), np.array([s * kstep]))[0])

    def descriptor(self) -> int:
        return wl.encode_descriptor(0, self.lbo, self.sbo, self.swizzle)

    def read_addrs(self, s: int, kstep: int, what_if: str = "model"):
        """Addresses the hardware reads for k-step s (rows x kstep), from the descriptor's
        start address, LBO and SBO as the PTX ISA describes them, or as `what_if` says."""
        r, k = np.meshgrid(np.arange(self.rows), np.arange(kstep), indexing="ij")
        start = self.step_offset(s, kstep)
        if self.swizzle == "none":
            lbo, sbo = self.lbo, self.sbo
            if what_if == "LBO/SBO swapped":
                lbo, sbo = sbo, lbo
            return start + (r // 8) * sbo + (2 * k // 16) * lbo + (r % 8) * 16 + (2 * k) % 16
        lin = start + (r // 8) * self.sbo + (r % 8) * 128 + 2 * k
        if what_if == "no swizzle XOR":
            return lin
        if what_if == "64B swizzle":
            return lin ^ (((lin >> 7) & 3) << 4)
        return wl.swizzle128(lin)

    def matrix_from(self, image, dtype, kstep, what_if="model"):
        """The rows x kelems operand the hardware would see, k-step by k-step."""
        blocks = []
        for s in range(self.kelems // kstep):
            off = self.read_addrs(s, kstep, what_if)
            ok = (off >= 0) & (off + 1 < image.size)
            off = np.where(ok, off, 0)
            bits = image[off].astype(np.uint16) | (image[off + 1].astype(np.uint16) << 8)
            blocks.append(np.where(ok, _half_values(bits, dtype), 0.0))
        return np.concatenate(blocks, axis=1)


def _half_values(bits, dtype):
    if dtype == "f16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


class Case:
    def __init__(self, rng, dtype, n, layout, sparse=False, sel=0, scale_d=1, bulk=False):
        self.dtype, self.n, self.layout, self.sparse, self.sel = dtype, n, layout, sparse, sel
        self.scale_d, self.bulk = scale_d, bulk
        self.kstep = 32 if sparse else 16
        self.k = STEPS * self.kstep
        b_kind = "128B" if layout == "regs" else layout
        self.a = (sl.random_2of4(rng, m=64, k=self.k, allow_fewer=bool(rng.integers(2)))
                  if sparse else rng.integers(-4, 5, size=(64, self.k)).astype(np.float64))
        self.b = rng.integers(-4, 5, size=(self.k, n)).astype(np.float64)
        self.c = rng.integers(-16, 17, size=(64, n)).astype(np.float64)
        a_k = self.k // 2 if sparse else self.k
        self.a_stored = self.a
        if sparse:
            self.a_stored, self.pos = sl.compress_2of4(self.a)
        self.a_tile = Tile("128B" if layout == "regs" else layout, 64, a_k, 0)
        self.b_tile = Tile(b_kind, n, self.k, -(-self.a_tile.size // 1024) * 1024)
        self.image = np.zeros(SMEM_IMAGE, dtype=np.uint8)
        nbytes = self.b_tile.base + self.b_tile.size
        if layout != "regs":
            r, k = np.meshgrid(np.arange(64), np.arange(a_k), indexing="ij")
            wl.smem_image(self.a_stored, self.a_tile.offsets(r, k), dtype, SMEM_IMAGE, self.image)
        else:
            nbytes -= self.b_tile.base   # B alone, at the start of the image
            self.b_tile.base = 0
        r, k = np.meshgrid(np.arange(n), np.arange(self.k), indexing="ij")
        wl.smem_image(self.b.T, self.b_tile.offsets(r, k), dtype, SMEM_IMAGE, self.image)
        self.nbytes = nbytes
        # per step: A fragment values (16 columns of the stored A) and metadata words
        self.a_lane = np.stack([wl.a_lane_values(self.a_stored[:, 16 * s:16 * s + 16])
                                for s in range(STEPS)])
        self.meta = np.zeros((STEPS, WG), dtype=np.uint32)
        if sparse:
            for s in range(STEPS):
                other = np.sort(np.argsort(rng.random((64, 8, 4)), axis=-1)[..., :2], axis=-1)
                self.meta[s] = (wl.pack_sparse_metadata(self.pos[:, 8 * s:8 * s + 8], sel)
                                | wl.pack_sparse_metadata(other, 1 - sel))

    @property
    def name(self) -> str:
        kind = f"sparse m64n{self.n}k32 sel={self.sel}" if self.sparse else f"dense m64n{self.n}k16"
        a = "A:regs B:128B" if self.layout == "regs" else f"A,B:{self.layout}"
        return f"{kind} {self.dtype} {a}" + (" cp.async.bulk" if self.bulk else "")

    def record(self):
        rec = np.zeros((), dtype=CASE_DTYPE)
        rec["n"], rec["nsteps"], rec["scale_d"] = self.n, STEPS, self.scale_d
        rec["variant"] = ((V_BF16 if self.dtype == "bf16" else 0) | (V_SPARSE if self.sparse else 0)
                          | (V_AREG if self.layout == "regs" else 0) | (V_SEL1 if self.sel else 0))
        rec["load_mode"] = rec["readback"] = int(self.bulk)
        rec["smem_bytes"] = -(-self.nbytes // 16) * 16
        rec["desc_a"], rec["desc_b"] = self.a_tile.descriptor(), self.b_tile.descriptor()
        ka = 16  # stored A columns per step (the compressed 16 for sparse)
        rec["a_off"] = [self.a_tile.step_offset(s, ka) for s in range(STEPS)]
        rec["b_off"] = [self.b_tile.step_offset(s, self.kstep) for s in range(STEPS)]
        rec["a_regs"] = np.stack([wl.pack_b32(v, self.dtype) for v in self.a_lane])
        rec["meta"] = self.meta
        rec["c"][:, : self.n // 2] = wl.c_lane_values(self.c).astype(np.float32)
        rec["smem"] = self.image
        return rec

    def expected(self):
        return self.a @ self.b + (self.c if self.scale_d else 0.0)

    def model(self, what_if: str = "model"):
        """D as the hardware would compute it if it read the operands as `what_if` says."""
        if self.layout == "regs":
            rows, ks = _alt_a_coords(what_if)
            a_seen = np.zeros((64, self.a_stored.shape[1]))
            for s in range(STEPS):
                blk = np.zeros((64, 16))
                blk[rows, ks] = self.a_lane[s]
                a_seen[:, 16 * s:16 * s + 16] = blk
        else:
            a_seen = self.a_tile.matrix_from(self.image, self.dtype, 16, what_if)
        b_seen = self.b_tile.matrix_from(self.image, self.dtype, self.kstep, what_if).T
        if self.sparse:
            pos = np.concatenate([_alt_unpack(self.meta[s], self.sel, what_if)
                                  for s in range(STEPS)], axis=1)
            if pos is None or np.any(pos[..., 0] == pos[..., 1]):
                return None
            a_seen = sl.decompress_2of4(a_seen, pos)
        return a_seen @ b_seen + (self.c if self.scale_d else 0.0)


def _alt_a_coords(what_if):
    rows, ks = wl.a_reg_coords()
    if what_if == "A regs 1 and 2 swapped":
        e = np.arange(8)
        reg = e >> 1
        swapped = np.where(reg == 1, 2, np.where(reg == 2, 1, reg))
        idx = 2 * swapped + (e & 1)
        return rows[:, idx], ks[:, idx]
    if what_if == "A halves swapped":
        return rows[:, [1, 0, 3, 2, 5, 4, 7, 6]], ks[:, [1, 0, 3, 2, 5, 4, 7, 6]]
    return rows, ks


def _alt_unpack(meta, sel, what_if):
    threads, bits, r, j, s = wl.sparse_metadata_fields(sel)
    w, rr = r >> 4, r & 15
    if what_if == "meta nibbles reversed in each half":
        bits = 16 * ((rr >> 3) & 1) + 4 * (3 - (j & 3)) + 2 * s
    elif what_if == "meta lane holds a full row":
        threads = 32 * w + 4 * (rr & 7) + 2 * sel + (rr >> 3)
        bits = 4 * j + 2 * s
    elif what_if == "meta slots swapped":
        bits = 16 * ((rr >> 3) & 1) + 4 * (j & 3) + 2 * (1 - s)
    elif what_if == "meta pair roles swapped":
        threads = 32 * w + 4 * (rr & 7) + 2 * sel + (1 - (j >> 2))
    pos = np.zeros((64, 8, 2), dtype=np.int64)
    pos[r, j, s] = (meta.astype(np.uint64)[threads] >> bits.astype(np.uint64)) & 3
    return pos


D_WHAT_IFS = ("D halves swapped",)
WHAT_IFS = ("LBO/SBO swapped", "no swizzle XOR", "64B swizzle", "A regs 1 and 2 swapped",
            "A halves swapped", "meta nibbles reversed in each half", "meta lane holds a full row",
            "meta slots swapped", "meta pair roles swapped")


def d_from_regs(regs, n, what_if="model"):
    if what_if != "D halves swapped":
        return wl.d_from_lane_values(regs, n)
    rows, cols = wl.d_coords(n)
    i = np.arange(n // 2)
    j = (i & ~3) | ((i & 1) << 1) | ((i >> 1) & 1)
    d = np.full((64, n), np.nan)
    d[rows, cols] = np.asarray(regs, dtype=np.float64)[:, j]
    return d


def make_cases(rng, trials):
    cases = []
    for dtype in ("f16", "bf16"):
        for n in (8, 64, 128, 256):
            for layout in ("interleave-k", "interleave-mn", "128B", "regs"):
                cases += [Case(rng, dtype, n, layout, scale_d=int(t % 2 == 0))
                          for t in range(trials)]
            for layout in ("interleave-k", "128B", "regs"):
                for sel in (0, 1):
                    cases += [Case(rng, dtype, n, layout, True, sel) for _ in range(trials)]
    for dtype, n, layout, sparse in (("f16", 256, "128B", False),
                                     ("bf16", 64, "interleave-k", False),
                                     ("f16", 128, "128B", True)):
        cases += [Case(rng, dtype, n, layout, sparse, bulk=True) for _ in range(trials)]
    return cases


def build(nvcc, out: Path) -> str:
    cmd = [nvcc, "-arch=sm_90a", "-O2", "-o", str(out), str(CU)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(" ".join(cmd) + "\n" + r.stdout + r.stderr)
    return " ".join(cmd)


class RunError(RuntimeError):
    """The probe binary failed (CUDA error, trap, timeout)."""


def run_cases(exe: Path, work: Path, cases: list, report: dict, timeout: int):
    """Run the cases through the probe; returns (accumulators [n, 128, 128], readback)."""
    fin, fout, frb = work / "in.bin", work / "out.bin", work / "readback.bin"
    with open(fin, "wb") as f:
        np.array([len(cases), CASE_DTYPE.itemsize], dtype="<i4").tofile(f)
        np.stack([c.record() for c in cases]).tofile(f)
    try:
        r = subprocess.run([str(exe), str(fin), str(fout), str(frb)], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise RunError(f"timed out after {timeout} s") from exc
    sys.stdout.write(r.stdout)
    report.setdefault("device", r.stdout.splitlines()[0] if r.stdout else "")
    if r.returncode != 0:
        raise RunError(f"exit {r.returncode}: {r.stderr.strip()}")
    out = np.fromfile(fout, dtype="<f4").reshape(len(cases), WG, MAX_ACC)
    return out, np.fromfile(frb, dtype=np.uint8).reshape(len(cases), SMEM_IMAGE)


def run_bench(exe: Path, iters: int) -> list[dict]:
    r = subprocess.run([str(exe), "--bench", str(iters)], capture_output=True, text=True,
                       timeout=300)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        raise RuntimeError(f"bench exit {r.returncode}: {r.stderr}")
    rows = []
    for line in r.stdout.splitlines():
        if line.startswith("BENCH "):
            rows.append({k: (v if k in ("kind", "name") else float(v))
                         for k, v in re.findall(r"(\w+)=(\S+)", line)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--nvcc", help="nvcc to use (default: PATH, then /usr/local/cuda/bin/nvcc)")
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--bench", action="store_true", help="also time wgmma against mma.sync")
    ap.add_argument("--iters", type=int, default=20000, help="bench loop iterations")
    ap.add_argument("--dry-run", action="store_true", help="build and self-check; do not run")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"results": [], "failures": [], "what_ifs": {}, "bench": []}

    def finish(code: int) -> int:
        report["exit"] = code
        (args.out / "wgmma_probe.json").write_text(json.dumps(report, indent=1))
        return code

    cases = make_cases(np.random.default_rng(args.seed), args.trials)
    bad = [c.name for c in cases if not np.array_equal(c.model(), c.expected())]
    if bad:  # the driver's own model must reproduce A @ B + C before the GPU is asked
        print(f"wgmma_probe: SELF-CHECK ERROR: model != A @ B + C for {bad[:3]}", file=sys.stderr)
        return finish(2)
    nvcc = find_nvcc(args.nvcc)
    if nvcc is None:
        print("wgmma_probe: no nvcc found; pass --nvcc /path/to/nvcc", file=sys.stderr)
        return finish(3)
    work = Path(tempfile.mkdtemp(prefix="wgmma_probe_"))
    exe = work / "wgmma_probe"
    try:
        report["build"] = build(nvcc, exe)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"wgmma_probe: BUILD ERROR\n{exc}", file=sys.stderr)
        return finish(2)
    print(f"built: {report['build']}  ({len(cases)} cases)")
    if args.dry_run:
        print("dry run: cases self-checked, probe compiled; not run")
        return finish(0)

    try:
        out, rb = run_cases(exe, work, cases, report, timeout=120)
        run_errors: dict[str, str] = {}
    except RunError as exc:
        # One faulting instruction kills the context: run each case kind in its own process,
        # so that the others still report and the faulting ones are named.
        print(f"wgmma_probe: RUN ERROR ({exc}); running each case kind alone", file=sys.stderr)
        out = np.full((len(cases), WG, MAX_ACC), np.nan, dtype=np.float32)
        rb = np.zeros((len(cases), SMEM_IMAGE), dtype=np.uint8)
        run_errors = {}
        for name in dict.fromkeys(c.name for c in cases):
            idx = [i for i, c in enumerate(cases) if c.name == name]
            try:
                out[idx], rb[idx] = run_cases(exe, work, [cases[i] for i in idx], report, 30)
            except RunError as sub:
                run_errors[name] = str(sub)
        report["run_errors"] = run_errors

    groups: dict[str, list[bool]] = {}
    failures = []
    for case, regs, back in zip(cases, out, rb):
        d = d_from_regs(regs, case.n)
        ok = bool(np.array_equal(d, case.expected()))
        if case.bulk:
            nb = -(-case.nbytes // 16) * 16
            same = bool(np.array_equal(back[:nb], case.image[:nb]))
            groups.setdefault("cp.async.bulk + mbarrier readback", []).append(same)
        groups.setdefault(case.name, []).append(ok)
        if not ok and case.name not in run_errors:
            failures.append((case, regs, d))
    for name, oks in groups.items():
        report["results"].append({"name": name, "pass": all(oks), "ok": sum(oks),
                                  "trials": len(oks)})
    for case, regs, d in failures[:20]:
        diff = np.argwhere(d != case.expected())
        report["failures"].append({"name": case.name, "wrong": int(len(diff)),
                                   "examples": diff[:6].tolist()})
    if failures:
        for what_if in D_WHAT_IFS + WHAT_IFS:
            hits = 0
            for case, regs, d in failures:
                if what_if in D_WHAT_IFS:
                    exp, got = case.expected(), d_from_regs(regs, case.n, what_if)
                else:
                    exp, got = case.model(what_if), d
                hits += int(exp is not None and np.array_equal(got, exp))
            report["what_ifs"][what_if] = hits
    status = 0 if all(r["pass"] for r in report["results"]) else 1
    if run_errors:
        status = 2

    if args.bench:
        try:
            report["bench"] = run_bench(exe, args.iters)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"wgmma_probe: BENCH ERROR: {exc}", file=sys.stderr)
            status = 2

    print(f"\n{'result':6} {'ok':>7}  case")
    for row in report["results"]:
        verdict = "PASS" if row["pass"] else "FAIL"
        print(f"{verdict:6} {row['ok']:>3}/{row['trials']:<3}  {row['name']}")
    for name, err in run_errors.items():
        print(f"RUN ERROR {name}: {err.strip().splitlines()[-1] if err.strip() else '?'}")
    for f in report["failures"][:5]:
        print(f"first failures: {f['name']}: {f['wrong']} of 64xN entries wrong, "
              f"e.g. {f['examples']}")
    for what_if, hits in report["what_ifs"].items():
        print(f"  what-if '{what_if}': explains {hits}/{len(failures)} failing trials")
    if report["bench"]:
        best = {k: max((b["tflops"] for b in report["bench"] if b["kind"] == k), default=0.0)
                for k in ("wgmma", "mma_sync")}
        report["bench_best_tflops"] = best
        ratio = best["mma_sync"] / best["wgmma"] if best["wgmma"] else float("nan")
        report["bench_ratio_mma_sync_over_wgmma"] = ratio
        print(f"\n{'kind':9} {'TFLOP/s':>8}  config")
        for b in report["bench"]:
            print(f"{b['kind']:9} {b['tflops']:8.1f}  {b['name']} grid={int(b['grid'])} "
                  f"threads={int(b['threads'])} ms={b['ms']:.3f}")
        print(f"best: wgmma {best['wgmma']:.1f}, mma.sync {best['mma_sync']:.1f} TFLOP/s; "
              f"mma.sync / wgmma = {ratio:.2f}")
    print("ALL PASS" if status == 0 else ("SOME FAIL" if status == 1 else "ERROR"))
    return finish(status)


if __name__ == "__main__":
    sys.exit(main())
