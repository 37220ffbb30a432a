"""PyTorch's own kernels, the peers our kernels are held to, timed under Nsight Compute as ours
are (bench/ncu_profile.py, bench/probes/decode_sweep.py): every kernel replayed on a flushed
L2, clocks left alone, each subject bracketed by a marker kernel (CuPy) so the rows are
attributed without relying on kernel names.

Subjects, per weight shape [K, N] and M rows of activations (f16 unless said):
- `torch_fp16`: cuBLAS, `torch.nn.functional.linear(x, W)` with W [N, K];
- `torch_bf16`: the same in bf16 (W and x rounded to bf16);
- `torch_cusparselt_2of4`: cuSPARSELt, W with two of every four K values kept (the largest
  magnitudes, ties to the lower index: `mask_2of4`) through
  `torch.sparse.to_sparse_semi_structured`, x padded to at least 16 rows (its minimum);
- `torch_tinygemm_int4`: `torch._weight_int4pack_mm` (bf16 activations, group 128), codes
  packed two a byte, the even K index in the high nibble (`pack_int4_pairs`), scales and zeros
  bf16 [K/128, N, 2] (w = (q - 8) * scale + zero).

Each subject's output is checked first against a float64 reference of what it computes
(relative Frobenius error, recorded per row): a wrong API reading shows up there, not as a
fast time. Run it in its own process (PyTorch beside MLX in one process is not what either
library expects), in the same device call as our kernels' run:

    PYTHONPATH=$PWD python3 bench/torch_peers.py --out $OUT/peers [--shapes 4096x4096,...] [--ms 1,16,2048]

Writes `torch_peers.json` (rows: K, N, M, subject, time_ns, dram_read_bytes, ..., rel_error;
device, torch version, date) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402

MARKER = "mdsl_marker"
SUBJECTS = ("torch_fp16", "torch_bf16", "torch_cusparselt_2of4", "torch_tinygemm_int4")
#: cuSPARSELt's fewest activation rows (GPU.md: x needs at least 16 rows)
CUSPARSELT_MIN_M = 16
#: rows checked against the float64 reference (all of them up to this; a 2048-row float64
#: product per subject and shape would cost minutes of a device call)
CHECK_ROWS = 64
TINYGEMM_GROUP = 128


def mask_2of4(w: np.ndarray) -> np.ndarray:
    """bool [N, K]: the two largest magnitudes of every four consecutive K values of W [N, K],
    ties to the lower index (K a multiple of 4)."""
    n, k = w.shape
    groups = np.abs(w).reshape(n, k // 4, 4)
    # a stable sort of -|w| ranks ties by index: the first two ranks are kept
    order = np.argsort(-groups, axis=-1, kind="stable")
    keep = np.zeros(groups.shape, bool)
    np.put_along_axis(keep, order[..., :2], True, axis=-1)
    return keep.reshape(n, k)


def pack_int4_pairs(codes: np.ndarray) -> np.ndarray:
    """uint8 [N, K/2] from codes [N, K] in 0..15: the even K index in the high nibble (the order
    `torch._convert_weight_to_int4pack` takes its uint8 input in)."""
    c = codes.astype(np.uint8)
    return (c[:, 0::2] << 4) | c[:, 1::2]


def tinygemm_reference(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray) -> np.ndarray:
    """W [N, K] float64 of tinygemm's int4: (q - 8) * scale + zero per group of 128 along K
    (`scales`, `zeros` [K/128, N])."""
    n, k = codes.shape
    g = np.repeat(np.arange(k // TINYGEMM_GROUP), TINYGEMM_GROUP)
    return (codes.astype(np.float64) - 8) * scales.T[:, g] + zeros.T[:, g]


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-300))


def subjects(args):  # noqa: ANN201
    """[(label, launch)] for every shape, M and subject; each label carries its subject's
    relative error against the float64 reference (checked before anything is timed)."""
    import torch
    import torch.nn.functional as F

    dev = "cuda"
    rng = np.random.default_rng(args.seed)
    out = []
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        w = rng.standard_normal((n, k)).astype(np.float16)
        w_t = torch.from_numpy(w).to(dev)
        w_bf = w_t.to(torch.bfloat16)
        w_bf64 = w_bf.float().cpu().numpy().astype(np.float64)
        keep = mask_2of4(w)
        w_sparse = np.where(keep, w, 0).astype(np.float16)
        s_t = torch.sparse.to_sparse_semi_structured(torch.from_numpy(w_sparse).to(dev))
        codes = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
        scales = (rng.random((k // TINYGEMM_GROUP, n)) * 0.02 + 0.005).astype(np.float32)
        zeros = np.zeros_like(scales)
        packed = torch._convert_weight_to_int4pack(torch.from_numpy(pack_int4_pairs(codes)).to(dev), 8)
        sz = torch.from_numpy(np.stack([scales, zeros], axis=-1)).to(dev).to(torch.bfloat16)
        # the reference takes the scales as the kernel reads them (rounded to bf16)
        w_int4 = tinygemm_reference(codes, sz[..., 0].float().cpu().numpy(), sz[..., 1].float().cpu().numpy())
        for m in [int(v) for v in args.ms.split(",")]:
            x = rng.standard_normal((m, k)).astype(np.float16)
            x_t = torch.from_numpy(x).to(dev)
            x_sp = torch.nn.functional.pad(x_t, (0, 0, 0, max(0, CUSPARSELT_MIN_M - m)))
            x_bf = x_t.to(torch.bfloat16)
            rows = min(m, CHECK_ROWS)
            x64, xbf64 = x[:rows].astype(np.float64), x_bf[:rows].float().cpu().numpy().astype(np.float64)
            base = {"K": k, "N": n, "M": m}
            cases = {
                "torch_fp16": (lambda x_t=x_t, w_t=w_t: F.linear(x_t, w_t), x64 @ w.astype(np.float64).T),
                "torch_bf16": (lambda x_bf=x_bf, w_bf=w_bf: F.linear(x_bf, w_bf), xbf64 @ w_bf64.T),
                "torch_cusparselt_2of4": (lambda x_sp=x_sp, s_t=s_t: F.linear(x_sp, s_t), x64 @ w_sparse.astype(np.float64).T),
                "torch_tinygemm_int4": (lambda x_bf=x_bf, packed=packed, sz=sz: torch._weight_int4pack_mm(x_bf, packed, TINYGEMM_GROUP, sz),
                                        xbf64 @ w_int4.T),
            }
            for subject, (launch, ref) in cases.items():
                if subject not in args.subjects.split(","):
                    continue
                got = launch()[:rows].float().cpu().numpy().astype(np.float64)
                out.append(({**base, "subject": subject, "rel_error": rel_error(got, ref)}, launch))
    return out


def drive(args) -> None:
    """The process ncu profiles: each subject warmed, then launched once between markers."""
    import cupy as cp
    import torch

    marker = cp.RawKernel(r'extern "C" __global__ void mdsl_marker(int* p) { if (p) p[0] = 1; }', MARKER)
    labels = []
    for label, launch in subjects(args):
        for _ in range(2):
            launch()
        torch.cuda.synchronize()
        marker((1,), (32,), (0,))
        cp.cuda.runtime.deviceSynchronize()
        launch()
        torch.cuda.synchronize()
        marker((1,), (32,), (0,))
        cp.cuda.runtime.deviceSynchronize()
        labels.append(label)
    Path(args.labels).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                             "labels": labels}))


def ncu_command(args) -> list[str]:
    return ["ncu", "--csv", "--page", "raw", "--clock-control", "none", "--cache-control", "all",
            "--metrics", "gpu__time_duration.sum,dram__bytes_read.sum", "--log-file", str(args.out / "ncu.csv"),
            sys.executable, __file__, "drive", "--labels", args.labels, "--shapes", args.shapes,
            "--ms", args.ms, "--seed", str(args.seed), "--subjects", args.subjects]


def table(rows: list[dict]) -> str:
    """One line per row: shape, M, subject, time, the reference check."""
    lines = [f"{'K x N':12} {'M':>5} {'subject':24} {'us':>8} {'rel err':>9}"]
    for r in rows:
        lines.append(f"{r['K']}x{r['N']:<7} {r['M']:>5} {r['subject']:24} {r['time_ns'] / 1e3:8.1f} "
                     f"{r['rel_error']:9.2e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", nargs="?", default="profile", choices=("profile", "drive"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--labels", default="/tmp/torch_peers_labels.json")
    ap.add_argument("--shapes", default="4096x4096,4096x14336,14336x4096", help="KxN,...")
    ap.add_argument("--ms", default="1,16,2048")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--subjects", default=",".join(SUBJECTS), help=f"some of {','.join(SUBJECTS)}")
    args = ap.parse_args(argv)
    unknown = set(args.subjects.split(",")) - set(SUBJECTS)
    if unknown:
        ap.error(f"--subjects: unknown {sorted(unknown)}; known: {', '.join(SUBJECTS)}")
    if args.mode == "drive":
        drive(args)
        return 0
    if args.out is None:
        ap.error("--out is required")
    from ncu_profile import parse

    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    proc = subprocess.run(ncu_command(args), capture_output=True, text=True, env=dict(os.environ))
    print(proc.stdout[-2000:], proc.stderr[-2000:])
    if proc.returncode:
        return proc.returncode
    driven = json.loads(Path(args.labels).read_text())
    rows = parse((args.out / "ncu.csv").read_text(), driven["labels"])
    (args.out / "torch_peers.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d"), "device": driven["device"], "torch": driven["torch"],
         "tool": "ncu --clock-control none --cache-control all", "rows": rows}, indent=1))
    print(table(rows))
    print(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
