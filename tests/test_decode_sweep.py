"""bench/probes/decode_sweep.py, the issue-15 GPU sweep of decode schedules: its dry run here (every
kernel built, printed, nvcc-compiled and checked in the IR interpreter) and its GPU path
(correctness against the float64 reference with poisoned outputs, then timing and the summary)
driven end to end with the interpreter standing in for the GPU launcher, so that the one GPU
run it is written for does not fail on the way."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from marlin_dsl.ir.interpret import run_kernel
from marlin_dsl.kernel_args import gemm_buffers, read_output
from marlin_dsl.targets.cuda.nvcc import find_nvcc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "probes"))
import decode_sweep  # noqa: E402
import decode_sweep_kernels  # noqa: E402

SMALL = ["--formats", "fp4", "--k-warps", "4", "--depth", "1", "--warps-n", "1", "--unroll", "1,2", "--vectors", "1"]


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed here")
def test_dry_run_builds_compiles_and_checks_every_kernel(tmp_path: Path) -> None:
    rc = decode_sweep.main(["--dry-run", "--out", str(tmp_path), "--ms", "1,16", "--shapes", "4096x14336",
                            "--no-sass", *SMALL])
    assert rc == 0
    summary = json.loads((tmp_path / "dry_run.json").read_text())
    names = {k["name"] for k in summary["kernels"]}
    # the grid (k_warps 4, unroll 1 and 2) for M = 1 and 16, and the tuned schedules
    assert {"fp4_m8_n16_kw4_d1_u1_v1", "fp4_m8_n16_kw4_d1_u2_v1", "fp4_m16_n16_kw4_d1_u2_v1"} <= names
    assert {"fp4_m8_n16_kw4_d2_u1_v2", "fp4_m16_n16_kw8_d1_u1_v1"} <= names  # tuned for 4096 x 14336
    tuned = [k for k in summary["kernels"] if k["tuned_for"]]
    assert {k["m"] for k in tuned} == {1, 16} and all(k["tuned_for"] == [[4096, 14336]] for k in tuned)
    assert summary["nvcc_ok"] is True
    assert all(k["interpreter_ok"] and k["interpreter_rel_error"] < 2e-3 for k in summary["kernels"])
    manifest = json.loads((tmp_path / "kernels" / "manifest.json").read_text())
    assert {e["name"] for e in manifest["kernels"]} == names
    for e in manifest["kernels"]:
        assert "mma.sync" in (tmp_path / "kernels" / f"{e['name']}.cu").read_text()
    args = decode_sweep.main.__globals__["argparse"].Namespace(formats="fp4", ms="16")
    loaded = decode_sweep.load_kernels(tmp_path / "kernels", args)  # what the GPU run reads
    assert {c["m"] for c in loaded} == {16} and all(c["source"].threads > 0 for c in loaded)


class InterpreterGemm:
    """Stands in for `CudaGemm` (weights, weight_copies, call with poison): the IR interpreter.
    A candidate loaded from a kernels folder (the --drive process) has no IR: the one seen
    under its name in this process serves."""

    seen: dict[str, object] = {}

    def __init__(self, c: dict, corrupt: bool = False) -> None:
        if "kernel" in c:
            self.seen[c["name"]] = c["kernel"]
        self.kernel, self.corrupt = self.seen[c["name"]], corrupt

    def weights(self, packed):
        return packed

    def weight_copies(self, packed, count: int) -> list:
        return [packed] * count

    def __call__(self, weights, x, poison: bool = True):
        xs = np.array(x.astype(mx.float32), np.float64)
        buffers, scalars = gemm_buffers(self.kernel, weights, xs)  # y poisoned with NaN
        y = read_output(run_kernel(self.kernel, buffers, scalars), *xs.shape[:1], weights.shape[1])
        return mx.array(y.astype(np.float32) + (1.0 if self.corrupt else 0.0))


@pytest.mark.parametrize("corrupt", [False, True])
def test_gpu_path_checks_times_and_summarises(tmp_path: Path, monkeypatch, capsys, corrupt: bool) -> None:
    monkeypatch.setattr(decode_sweep, "launcher_for", lambda c: InterpreterGemm(c, corrupt and "kw4" in c["name"]))
    monkeypatch.setattr(decode_sweep, "copy_baseline", lambda k, n: lambda: mx.array(0))
    rc = decode_sweep.main(["--out", str(tmp_path), "--ms", "1", "--shapes", "256x48", "--timer", "wall",
                            "--batch", "1", "--repeats", "1", "--copies", "2", *SMALL])
    result = json.loads((tmp_path / "decode_sweep.json").read_text())
    kernels = {k["name"]: k for k in result["kernels"]}
    timed = {r["kernel"] for r in result["rows"] if r["subject"] == "fp4"}
    assert {r["subject"] for r in result["rows"]} >= {"copy", "mlx_q4"}
    for k in kernels.values():  # every timed shape and the N tail, M = 1 and 3, checked
        assert {(c["M"], c["N"]) for c in k["checks"]} == {(1, 48), (3, 48), (1, 88), (3, 88)}
    out = capsys.readouterr().out
    if corrupt:  # a wrong kernel fails, is not timed, and the run says so
        assert rc == 1 and result["failed"] == ["fp4_m8_n16_kw4_d1_u1_v1", "fp4_m8_n16_kw4_d1_u2_v1"]
        assert timed == {"fp4_m8_n16_kw16_d2_u1_v2"} and "FAIL fp4_m8_n16_kw4_d1_u1_v1" in out
    else:
        assert rc == 0 and not result["failed"] and timed == set(kernels)
        assert all(c["rel_error"] < 2e-3 for k in kernels.values() for c in k["checks"])
    assert "256x48" in out and "kernels correct" in out


def test_ncu_path_drives_itself_and_reads_the_log(tmp_path: Path, monkeypatch, capsys) -> None:
    """The ncu timer: the command it runs re-enters the script in --drive mode (run here in
    process, the interpreter as launcher and no marker kernels), which brackets every subject;
    a log as ncu writes it (marker, kernel, marker per subject) is read back by subject."""
    monkeypatch.setattr(decode_sweep, "launcher_for", lambda c: InterpreterGemm(c))
    monkeypatch.setattr(decode_sweep, "copy_baseline", lambda k, n: lambda: mx.array(0))
    monkeypatch.setattr(decode_sweep, "marker_launch", lambda: lambda: None)
    monkeypatch.setattr(decode_sweep.shutil, "which", lambda name: f"/usr/bin/{name}")
    commands = []

    def fake_ncu(cmd, **_):
        done = type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()
        if cmd[0] != "ncu":  # nvidia-smi, for the device's name
            return done
        commands.append(cmd)
        assert cmd[0] == "ncu" and "--cache-control" in cmd and cmd[cmd.index("--cache-control") + 1] == "all"
        child = cmd[cmd.index(decode_sweep.__file__) + 1:]
        assert decode_sweep.main(child) == 0  # the --drive process
        labels = json.loads(Path(child[child.index("--labels") + 1]).read_text())
        lines = ['"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum"', '"","","nsecond","byte"']
        for i, label in enumerate(labels):
            name = label.get("kernel", label["subject"])
            lines += [f'"{3 * i}","mdsl_marker","1000","0"', f'"{3 * i + 1}","{name}","{2000 + i}","4096"',
                      f'"{3 * i + 2}","mdsl_marker","1000","0"']
        (tmp_path / "ncu.csv").write_text("==PROF== preamble\n" + "\n".join(lines) + "\n")
        return done

    monkeypatch.setattr(decode_sweep.subprocess, "run", fake_ncu)
    rc = decode_sweep.main(["--out", str(tmp_path), "--ms", "1", "--shapes", "256x48", "--timer", "ncu",
                            "--labels", str(tmp_path / "labels.json"), *SMALL])
    assert rc == 0 and len(commands) == 1
    result = json.loads((tmp_path / "decode_sweep.json").read_text())
    rows = {r.get("kernel", r["subject"]): r for r in result["rows"]}
    assert {"copy", "mlx_q4", "fp4_m8_n16_kw4_d1_u1_v1"} <= set(rows)
    assert all(r["time_ns"] >= 2000 and r["kernels"] == [r.get("kernel", r["subject"])] for r in rows.values())
    assert rows["fp4_m8_n16_kw4_d1_u1_v1"]["pct_of_copy_bw"] is not None
    assert "256x48" in capsys.readouterr().out


def test_example_formats_gpu_script_runs_its_checks_on_mlx_ops(tmp_path) -> None:
    """bench/probes/example_formats_gpu.py's logic on the CPU (MLX ops stand in for the kernels): every
    row passes the error model's checks and names a schedule; without poisoning it refuses."""
    script = Path(__file__).resolve().parent.parent / "bench" / "probes" / "example_formats_gpu.py"
    env = {**os.environ, "MARLIN_DSL_POISON": "1"}
    args = [sys.executable, str(script), "--formats", "int3_zp", "nf4_pairwise_4of8", "--shapes", "320x72",
            "--ms", "1,3", "--out", str(tmp_path)]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert len(rows) == 2 * 2 * 2 and all(r["ok"] and r["schedule"] for r in rows)
    env.pop("MARLIN_DSL_POISON")
    refused = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert refused.returncode == 2 and "MARLIN_DSL_POISON" in refused.stdout


def test_ring_and_probe_variants_are_built(tmp_path: Path) -> None:
    """`--stages` adds ring kernels (WeightStream(stages)) to the grid, `--probe` copies of every
    kernel with its printed text mutated (l1na: weight loads that bypass L1; xpf2: activations
    prefetched two steps ahead); the GPU checks run them against the reference like the rest."""
    rc = decode_sweep.main(["--dry-run", "--out", str(tmp_path), "--ms", "16", "--shapes", "4096x14336",
                            "--no-sass", "--stages", "0,3", "--probe", "l1na,xpf2", "--formats", "fp4", "--k-warps", "4",
                            "--depth", "1", "--warps-n", "1", "--unroll", "1", "--vectors", "1"])
    assert rc == 0
    names = {k["name"] for k in json.loads((tmp_path / "dry_run.json").read_text())["kernels"]}
    assert {"fp4_m16_n16_kw4_d1_u1_v1", "fp4_m16_n16_kw4_d1_u1_v1_s3", "fp4_m16_n16_kw4_d1_u1_v1_l1na"} <= names
    assert "fp4_m16_n16_kw4_d1_u1_v1_s3_l1na" not in names  # the ring reads its words from shared memory
    ring = (tmp_path / "kernels" / "fp4_m16_n16_kw4_d1_u1_v1_s3.cu").read_text()
    assert "cp_async<16>(&w_ring[" in ring and "cp_async_wait<2>()" in ring
    probe = (tmp_path / "kernels" / "fp4_m16_n16_kw4_d1_u1_v1_l1na.cu").read_text()
    assert "ld.global.nc.L1::no_allocate.v4.u32" in probe and decode_sweep_kernels.WEIGHT_LOAD not in probe.split("custom_kernel")[-1]
    prefetch = (tmp_path / "kernels" / "fp4_m16_n16_kw4_d1_u1_v1_xpf2.cu").read_text()
    assert prefetch.count("mdsl_probe_pf(x, ") == 2  # after each of the step's 2 activation loads (M = 16)
    assert "+ 512u, v_M0 * v_K0)" in prefetch  # 2 steps of 4 K warps x 64 positions ahead
    with pytest.raises(SystemExit, match="unknown variant"):
        decode_sweep_kernels.probe_variants([], ["l2"])


def test_lookahead_and_small_m_tile_variants_are_built(tmp_path: Path) -> None:
    """`--x-ahead 0,1` adds kernels with WeightStream(x_ahead=1) (`_xa1`), `--tile-m 8` runs
    M = 16 as two 8-row tiles (`_at16`, named apart from the M = 1 kernel of the same tiles);
    the tuned 2:4 schedules carry x_ahead (and at M = 16 x_shuffle) into their names."""
    rc = decode_sweep.main(["--dry-run", "--out", str(tmp_path), "--ms", "1,16", "--shapes", "4096x4096",
                            "--no-sass", "--no-interpret", "--formats", "fp4_2of4", "--k-warps", "8", "--depth", "2",
                            "--warps-n", "1", "--unroll", "1", "--vectors", "1", "--x-ahead", "0,1",
                            "--tile-m", "8", "--n-tiles", "2"])
    assert rc == 0
    kernels = {k["name"]: k for k in json.loads((tmp_path / "dry_run.json").read_text())["kernels"]}
    assert {"fp4_2of4_m8_n32t2_kw8_d2_u1_v1", "fp4_2of4_m8_n32t2_kw8_d2_u1_v1_xa1",
            "fp4_2of4_m8_n32t2_kw8_d2_u1_v1_at16", "fp4_2of4_m8_n32t2_kw8_d2_u1_v1_xa1_at16"} <= set(kernels)
    assert kernels["fp4_2of4_m8_n32t2_kw8_d2_u1_v1_xa1_at16"]["m"] == 16
    assert kernels["fp4_2of4_m8_n32t2_kw8_d2_u1_v1_xa1"]["x_ahead"] == 1
    tuned = [k for k in kernels.values() if k["tuned_for"]]
    assert tuned and all(k["x_ahead"] == 1 and k["name"].endswith(("_xa1", "_xa1_xs4")) for k in tuned)
    assert {k["x_shuffle"] for k in tuned if k["m"] == 16} == {4}  # M = 16: loads shared by shuffles
