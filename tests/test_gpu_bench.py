"""`marlin-dsl bench` (marlin_dsl.benchmarks).

CPU only: the table, bench.json and the floor arithmetic on fake timings (a fake runner in place
of MLX on the GPU), the timing loops on a fake clock, the clear error without a GPU, and the
argument parsing. On a GPU (MLX's CUDA or Metal backend) the `gpu` test runs `--quick`.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from marlin_dsl import BUILTIN_FORMATS, MarlinDSLError
from marlin_dsl import benchmarks as gb
from marlin_dsl.cli import bench_settings, build_parser, main, parse_shape

ROOT = Path(__file__).resolve().parent.parent

BW = 2.0e12  # fake copy bandwidth, bytes/s
FAKE_BYTES = {"fp16": None, "mlx_q4": 9_437_184, "fp4": 8_650_752, "fp4_2of4": 6_553_600}


def _gpu_available() -> bool:
    try:
        gb.gpu_backend()
        return True
    except MarlinDSLError:
        return False


GPU = _gpu_available()


# ----- a fake runner ---------------------------------------------------------------------------

class FakeSubject:
    def __init__(self, kind: str, fmt: str, pipeline: str, k: int, n: int, kernel_us, rel=1e-4,
                 fail_at: int | None = None) -> None:
        self.kind, self.format, self.pipeline, self.k, self.n = kind, fmt, pipeline, k, n
        self.weight_bytes = k * n * 2 if kind == "fp16" else FAKE_BYTES.get(kind, FAKE_BYTES.get(fmt, 1 << 20))
        self.kernel_us = kernel_us  # M -> us
        self.rel, self.fail_at = rel, fail_at
        self.measured: list[int] = []

    def measure(self, m: int) -> gb.Measurement:
        self.measured.append(m)
        if m == self.fail_at:
            raise RuntimeError("launch failed: too many resources requested")
        t = self.kernel_us(m) * 1e-6
        return gb.Measurement(kernel_s=t, e2e_s=t + 50e-6, launches=50, copies=4, rel_error=self.rel,
                              kernel_samples_s=[t] * 3, e2e_samples_s=[t + 50e-6] * 6, queue_s=5e-6,
                              first_launch_s=2e-3, e2e_prepared_s=t + 20e-6)


class FakeRunner:
    """Kernel times: fp16 30 us, qmm 20 us, ours 100 us (+ 10 us per pipeline index) at M <= 64."""

    def __init__(self, broken: tuple[str, str] | None = None, fail_m: int | None = None, launch_floor_us=8.0):
        self.broken, self.fail_m, self.launch_floor_us = broken, fail_m, launch_floor_us
        self.ended = 0
        self.subjects: list[FakeSubject] = []

    def environment(self) -> dict:
        return {"device_name": "Fake GPU 80GB", "device": "Device(gpu, 0)", "backend": "cuda", "mlx": "0.32.4",
                "date": "2026-11-22T12:00:00+00:00", "launch_floor_us": self.launch_floor_us}

    def copy_bandwidth(self) -> dict:
        return {"bytes_per_s": BW, "samples_s": [0.01, 0.01]}

    def baselines(self, k, n):
        subs = [FakeSubject("fp16", gb.FP16_FORMAT, gb.FP16, k, n, lambda m: 30.0),
                FakeSubject("mlx_q4", gb.QMM_FORMAT, gb.QMM, k, n, lambda m: 20.0)]
        self.subjects += subs
        return subs

    def marlin(self, fmt, pipeline, k, n):
        if (fmt, pipeline) == self.broken:
            raise RuntimeError("nvrtc: error: identifier undefined")
        idx = gb.PIPELINES.index(pipeline)
        sub = FakeSubject("marlin", fmt, pipeline, k, n, lambda m, idx=idx: 100.0 + 10 * idx + m,
                          fail_at=self.fail_m if pipeline == "striped" else None)
        self.subjects.append(sub)
        return sub

    def end_shape(self):
        self.ended += 1


def _run(tmp_path, runner=None, **kw):
    lines: list[str] = []
    settings = dict(formats=["fp4", "fp4_2of4"], pipelines=["double_buffered", "striped"],
                    shapes_kn=[(256, 512), (512, 256)], ms=[1, 16], repeats=3, out_dir=tmp_path)
    settings.update(kw)
    doc = gb.run_bench(log=lambda *a: lines.append(" ".join(map(str, a))), runner=runner or FakeRunner(),
                       plot=False, **settings)
    return doc, "\n".join(lines)


# ----- floor arithmetic, rows, JSON, table -------------------------------------------------------

def test_floor_bytes_and_floor_us():
    # weights once + x [M, K] + y [M, N] in float16
    assert gb.floor_bytes(1_000_000, 16, 256, 512) == 1_000_000 + 16 * 256 * 2 + 16 * 512 * 2
    assert gb.floor_us(3_000_000, 3e12) == pytest.approx(1.0)
    # 4096 x 4096 fp16 weights at M = 1 on a 3 TB/s device: ~11.2 us
    assert gb.floor_us(gb.floor_bytes(4096 * 4096 * 2, 1, 4096, 4096), 3e12) == pytest.approx(11.19, abs=0.01)


def test_copies_rotate_past_l2():
    assert gb.copies_for(4096 * 4096 * 2) == 4  # 33.5 MB fp16: 4 copies are 134 MB
    assert gb.copies_for(8_650_752) == 16  # 4-bit 4096 x 4096: 16 copies
    assert gb.copies_for(1) == gb.MAX_COPIES and gb.copies_for(10**12) == gb.MIN_COPIES
    for nbytes in (8_650_752, 30_000_000, 117_440_512):
        assert gb.copies_for(nbytes) * nbytes >= gb.ROTATE_BYTES


def test_run_bench_rows_floor_and_ratios(tmp_path):
    runner = FakeRunner()
    doc, log = _run(tmp_path, runner)
    rows = doc["rows"]
    assert len(rows) == 2 * 2 * (2 + 2 * 2)  # shapes x M x (2 baselines + formats x pipelines)
    assert runner.ended == 2 and doc["failed"] == 0 and doc["errors"] == []
    for r in rows:
        fb = r["weight_bytes"] + r["M"] * r["K"] * 2 + r["M"] * r["N"] * 2
        assert r["floor_bytes"] == fb
        assert r["floor_us"] == pytest.approx(fb / BW * 1e6)
        assert r["pct_floor_bw"] == pytest.approx(100 * r["floor_us"] / r["kernel_us"])
        assert r["vs_qmm"] == pytest.approx(20.0 / r["kernel_us"])
        assert r["vs_fp16"] == pytest.approx(30.0 / r["kernel_us"])
        assert r["e2e_us"] == pytest.approx(r["kernel_us"] + 50) and r["ok"] is True
    ours = next(r for r in rows if r["kernel"] == "fp4/striped" and r["M"] == 16 and r["K"] == 256)
    assert ours["kernel_us"] == pytest.approx(100 + 20 + 16)
    assert ours["floor_bytes"] == 8_650_752 + 16 * 256 * 2 + 16 * 512 * 2
    assert ours["launches"] == 50 and ours["copies"] == 4 and ours["kernel_samples_us"] == [136.0] * 3
    assert ours["queue_us"] == 5.0 and ours["e2e_prepared_us"] == pytest.approx(156.0)
    fp16 = next(r for r in rows if r["kind"] == "fp16" and r["M"] == 1 and r["K"] == 512)
    assert fp16["weight_bytes"] == 512 * 256 * 2 and fp16["vs_fp16"] == pytest.approx(1.0)
    # rows come sorted: shape (as given), M, fp16, qmm, then ours
    keys = [(r["K"], r["M"], r["kind"]) for r in rows]
    assert keys[:3] == [(256, 1, "fp16"), (256, 1, "mlx_q4"), (256, 1, "marlin")]
    assert [r["K"] for r in rows] == [256] * 12 + [512] * 12
    assert "K=256 N=512" in log


def test_bench_json_has_environment_definitions_and_rows(tmp_path):
    doc, log = _run(tmp_path)
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(doc["rows"]))
    env = saved["environment"]
    assert env["device_name"] == "Fake GPU 80GB" and env["mlx"] == "0.32.4" and env["date"].startswith("2026-11-22")
    assert env["copy_bandwidth_gb_s"] == pytest.approx(BW / 1e9)
    assert saved["copy_bandwidth"]["bytes_per_s"] == BW
    s = saved["settings"]
    assert s["formats"] == ["fp4", "fp4_2of4"] and s["ms"] == [1, 16] and s["shapes_kn"] == [[256, 512], [512, 256]]
    assert s["repeats"] == 3 and s["batch_launches"] == 50
    # every number a row carries is defined
    for key in ("kernel_us", "e2e_us", "floor_us", "pct_floor_bw", "vs_qmm", "vs_fp16", "rel_error",
                "weight_bytes", "host_bound", "queue_us", "e2e_prepared_us", "launch_floor_us"):
        assert key in saved["definitions"], key
    assert "median" in saved["definitions"]["kernel_us"] and "L2" in saved["definitions"]["kernel_us"]
    assert "mx.eval" in saved["definitions"]["e2e_us"]
    assert not (tmp_path / "bench.png").exists()  # plot=False
    assert f"wrote {tmp_path / 'bench.json'}" in log


def test_table_has_the_columns_and_one_line_per_row(tmp_path):
    doc, log = _run(tmp_path)
    table = gb.format_table(doc["rows"])
    lines = table.splitlines()
    for head in ("format", "pipeline", "K", "N", "M", "kernel us", "e2e us", "floor us", "% floor bw",
                 "vs mx.qmm", "vs fp16"):
        assert head in lines[0]
    assert len(lines) == 2 + len(doc["rows"])
    row = next(l for l in lines if l.startswith("fp4 ") and " striped " in l and l.split()[4] == "16"
               and l.split()[2] == "256")
    cells = row.split()
    assert cells[:5] == ["fp4", "striped", "256", "512", "16"]
    assert cells[5] == "136.0" and cells[6] == "186.0"
    floor = (8_650_752 + 16 * 256 * 2 + 16 * 512 * 2) / BW * 1e6
    assert cells[7] == f"{floor:.2f}" and cells[8] == f"{100 * floor / 136:.1f}"
    assert cells[9] == f"{20 / 136:.2f}x" and cells[10] == f"{30 / 136:.2f}x" and cells[11:] == ["ok", "1e-04"]
    assert table in log  # the run prints the table last


def test_host_bound_rows_are_marked(tmp_path):
    doc, _ = _run(tmp_path, FakeRunner(launch_floor_us=15.0))  # qmm (20 us) < 1.5 x 15 us
    qmm = [r for r in doc["rows"] if r["kind"] == "mlx_q4"]
    assert qmm and all(r["host_bound"] for r in qmm)
    assert not any(r["host_bound"] for r in doc["rows"] if r["kind"] != "mlx_q4")
    line = next(l for l in gb.format_table(doc["rows"]).splitlines() if l.startswith(gb.QMM_FORMAT))
    assert "20.0*" in line


def test_errors_are_recorded_and_the_run_goes_on(tmp_path):
    runner = FakeRunner(broken=("fp4_2of4", "double_buffered"), fail_m=16)
    doc, log = _run(tmp_path, runner)
    errors = doc["errors"]
    assert {e["kernel"] for e in errors} == {"fp4_2of4/double_buffered", "fp4/striped", "fp4_2of4/striped"}
    broken = [r for r in doc["rows"] if r["kernel"] == "fp4_2of4/double_buffered"]
    assert len(broken) == 2 and all("nvrtc" in r["error"] and r["M"] is None for r in broken)  # one per shape
    failed = [r for r in doc["rows"] if r.get("error") and r["M"] == 16]
    assert len(failed) == 4 and all("too many resources" in r["error"] for r in failed)
    ok = [r for r in doc["rows"] if not r.get("error")]
    assert len(ok) == 2 * 2 * (2 + 3) - 4 and all(r["floor_us"] > 0 for r in ok)
    assert doc["failed"] == len(doc["rows"]) - len(ok)
    table = gb.format_table(doc["rows"])
    assert table.count("ERROR") == len(doc["rows"]) - len(ok)
    assert "ERROR fp4_2of4/double_buffered" in log


def test_a_failed_check_fails_the_row(tmp_path):
    class Wrong(FakeRunner):
        def marlin(self, fmt, pipeline, k, n):
            sub = super().marlin(fmt, pipeline, k, n)
            sub.rel = 0.5 if fmt == "fp4" else 1e-4
            return sub

    doc, _ = _run(tmp_path, Wrong())
    bad = [r for r in doc["rows"] if r["ok"] is False]
    assert bad and {r["format"] for r in bad} == {"fp4"} and doc["failed"] == len(bad)
    assert "FAIL 5e-01" in gb.format_table(doc["rows"])


def test_run_bench_rejects_unknown_names(tmp_path):
    with pytest.raises(MarlinDSLError, match="unknown format 'fp5'"):
        _run(tmp_path, formats=["fp5"])
    with pytest.raises(MarlinDSLError, match="unknown pipeline 'tiled'"):
        _run(tmp_path, pipelines=["tiled"])
    with pytest.raises(MarlinDSLError, match="repeats"):
        _run(tmp_path, repeats=0)


def test_defaults_cover_every_format_pipeline_and_shape(tmp_path):
    runner = FakeRunner()
    doc = gb.run_bench(runner=runner, log=lambda *a: None, plot=False, out_dir=None)
    assert doc["settings"]["formats"] == list(BUILTIN_FORMATS)
    assert doc["settings"]["pipelines"] == list(gb.DEFAULT_PIPELINES)
    assert [tuple(s) for s in doc["settings"]["shapes_kn"]] == list(gb.DEFAULT_SHAPES)
    assert doc["settings"]["ms"] == list(gb.DEFAULT_MS) == [1, 16, 64, 256, 2048]
    assert gb.DEFAULT_SHAPES == ((4096, 4096), (4096, 14336), (14336, 4096))
    assert len(doc["rows"]) == 3 * 5 * (2 + len(BUILTIN_FORMATS) * len(gb.DEFAULT_PIPELINES))
    assert not (tmp_path / "bench.json").exists()


def test_best_pipeline_per_format():
    rows = []
    for pl, base in (("double_buffered", 100), ("fused_dequant", 90), ("striped", 50)):
        for m in (1, 16, 2048):
            t = base * (40 if (pl == "striped" and m == 2048) else 1)
            rows.append({"kind": "marlin", "format": "fp4", "pipeline": pl, "K": 1, "N": 2, "M": m, "kernel_us": t})
    rows.append({"kind": "marlin", "format": "int4", "pipeline": "striped", "K": 1, "N": 2, "M": 1, "kernel_us": 1.0})
    rows.append({"kind": "marlin", "format": "int4", "pipeline": "double_buffered", "K": 1, "N": 2, "M": 1,
                 "kernel_us": 9.0})
    rows.append({"kind": "marlin", "format": "int4", "pipeline": "double_buffered", "K": 1, "N": 2, "M": 16,
                 "kernel_us": 9.0})
    best = gb.best_pipelines(rows)
    assert best[(1, 2, "fp4")] == "fused_dequant"  # geometric mean over M
    assert best[(1, 2, "int4")] == "double_buffered"  # measured at more Ms wins


# ----- the plot ----------------------------------------------------------------------------------

def test_without_matplotlib_the_run_writes_json_and_says_how_to_plot(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    lines: list[str] = []
    gb.run_bench(["fp4"], ["striped"], [(256, 512)], [1], 1, tmp_path, lambda *a: lines.append(" ".join(a)),
                 runner=FakeRunner())
    assert (tmp_path / "bench.json").exists() and not (tmp_path / "bench.png").exists()
    assert any("matplotlib is not importable" in l and "bench/plot_bench.py" in l for l in lines)


def test_plot_from_json(tmp_path):
    pytest.importorskip("matplotlib")
    doc, _ = _run(tmp_path)
    png = gb.plot_bench(doc, tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "plot_bench.py"), str(tmp_path / "bench.json")],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_run_bench_plots_when_matplotlib_is_there(tmp_path):
    pytest.importorskip("matplotlib")
    lines: list[str] = []
    gb.run_bench(["fp4"], ["striped"], [(256, 512)], [1, 16], 1, tmp_path, lambda *a: lines.append(" ".join(a)),
                 runner=FakeRunner())
    assert (tmp_path / "bench.png").exists() and f"wrote {tmp_path / 'bench.png'}" in lines


# ----- the timing loops on a fake clock ----------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeMX:
    """eval advances the clock by the cost of the launches it evaluates (once each)."""

    def __init__(self, clock: FakeClock):
        self.clock = clock
        self.evaluated = 0
        self.syncs = 0

    def eval(self, *arrays):
        for a in arrays:
            if not a["done"]:
                self.clock.now += a["cost"]
                a["done"] = True
                self.evaluated += 1

    def synchronize(self):
        self.syncs += 1


def _launcher(cost, clock, queue_cost=0.0, used=None):
    def launch(i):
        clock.now += queue_cost
        if used is not None:
            used.append(i)
        return {"cost": cost(i) if callable(cost) else cost, "done": False}
    return launch


def test_kernel_time_batches_of_fast_launches():
    clock = FakeClock()
    mx, used = FakeMX(clock), []
    timed = gb.kernel_time(mx, _launcher(100e-6, clock, queue_cost=3e-6, used=used), repeats=5, clock=clock)
    assert timed.per_launch_s == pytest.approx(100e-6)
    assert timed.launches == gb.BATCH_LAUNCHES and len(timed.samples_s) == 5
    assert timed.queue_s == pytest.approx(3e-6)  # not part of the timed batches
    assert timed.estimate_s == pytest.approx(100e-6)
    assert mx.evaluated == 3 + 6 * 50  # first, two singles, warm-up batch + 5 timed batches
    assert used == list(range(len(used)))  # the weight-copy index keeps rotating across batches


def test_kernel_time_cuts_batches_of_slow_launches():
    clock = FakeClock()
    timed = gb.kernel_time(FakeMX(clock), _launcher(20e-3, clock), repeats=3, clock=clock)
    assert timed.launches == gb.MIN_BATCH_LAUNCHES and timed.per_launch_s == pytest.approx(20e-3)
    clock = FakeClock()
    timed = gb.kernel_time(FakeMX(clock), _launcher(2e-3, clock), repeats=3, clock=clock)
    assert timed.launches == 25  # 50 ms batches


def test_kernel_time_first_launch_and_median():
    clock = FakeClock()
    costs = iter([1.5] + [1e-4] * 2 + [1e-4] * 50 + [1e-4] * 50 + [5e-4] * 50 + [1e-4] * 50)
    timed = gb.kernel_time(FakeMX(clock), _launcher(lambda i: next(costs), clock), repeats=3, clock=clock)
    assert timed.first_s == pytest.approx(1.5)  # JIT compilation lands here, not in the samples
    assert timed.per_launch_s == pytest.approx(1e-4)  # the median ignores the slow batch
    assert sorted(timed.samples_s) == pytest.approx([1e-4, 1e-4, 5e-4])


def test_e2e_time_single_calls():
    clock = FakeClock()
    mx = FakeMX(clock)
    median, samples, first = gb.e2e_time(mx, _launcher(1e-3, clock, queue_cost=0.5e-3), repeats=5,
                                         estimate_s=1e-3, clock=clock)
    assert median == pytest.approx(1.5e-3) and len(samples) == 10 and first["done"]
    _, samples, _ = gb.e2e_time(FakeMX(clock), _launcher(0.2, clock), repeats=5, estimate_s=0.2, clock=clock)
    assert len(samples) == 3


# ----- no GPU: a clear error ---------------------------------------------------------------------

class _NoGPU:
    __version__ = "0.32.4"

    class cuda:
        @staticmethod
        def is_available():
            return False

    class metal:
        @staticmethod
        def is_available():
            return False

    @staticmethod
    def default_device():
        return "Device(cpu, 0)"


def test_gpu_backend_names_what_the_machine_has():
    with pytest.raises(MarlinDSLError) as err:
        gb.gpu_backend(_NoGPU())
    msg = str(err.value)
    assert msg.startswith("marlin-dsl bench needs MLX's CUDA (or Metal) GPU backend; this machine has ")
    assert "MLX 0.32.4" in msg and "Device(cpu, 0)" in msg

    class Cuda(_NoGPU):
        class cuda:
            @staticmethod
            def is_available():
                return True

    class Metal(_NoGPU):
        class metal:
            @staticmethod
            def is_available():
                return True

    assert gb.gpu_backend(Cuda()) == "cuda" and gb.gpu_backend(Metal()) == "metal"


def test_gpu_backend_without_mlx(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlx.core", None)
    with pytest.raises(MarlinDSLError, match=r"^marlin-dsl bench needs MLX's CUDA \(or Metal\) GPU backend; "
                                             r"this machine has no importable MLX"):
        gb.gpu_backend()


@pytest.mark.skipif(GPU, reason="this machine has a GPU backend")
def test_cli_bench_without_gpu_is_a_clear_error(tmp_path, capsys):
    out = tmp_path / "results"
    assert main(["bench", "--quick", "--out", str(out)]) == 4  # environment (docs/CLI.md)
    err = capsys.readouterr().err
    assert err.startswith("marlin-dsl: error: marlin-dsl bench needs MLX's CUDA (or Metal) GPU backend; "
                          "this machine has ")
    assert not out.exists()  # nothing written
    with pytest.raises(MarlinDSLError, match="needs MLX's CUDA"):
        gb.MLXRunner()


@pytest.mark.skipif(GPU, reason="this machine has a GPU backend")
def test_cli_bench_without_gpu_as_a_command(tmp_path):
    done = subprocess.run([sys.executable, "-m", "marlin_dsl.cli", "bench", "--quick", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 4 and "needs MLX's CUDA (or Metal) GPU backend" in done.stderr
    assert "Traceback" not in done.stderr


# ----- argument parsing --------------------------------------------------------------------------

def test_parse_shape():
    assert parse_shape("4096x14336") == (4096, 14336)
    assert parse_shape("14336X4096") == (14336, 4096)
    for bad in ("4096", "4096x", "ax4", "0x4096", "4096x4096x2"):
        with pytest.raises(Exception):
            parse_shape(bad)


def test_bench_arguments():
    args = build_parser().parse_args(["bench", "--formats", "int4", "nf4", "--pipelines", "striped",
                                      "--shapes", "4096x4096", "8192x1024", "--m", "1", "7",
                                      "--repeats", "9", "--out", "res"])
    s = bench_settings(args)
    assert s == {"formats": ["int4", "nf4"], "pipelines": ["striped"], "shapes_kn": [(4096, 4096), (8192, 1024)],
                 "ms": [1, 7], "repeats": 9, "out_dir": Path("res")}
    defaults = bench_settings(build_parser().parse_args(["bench"]))
    assert defaults == {"formats": None, "pipelines": None, "shapes_kn": None, "ms": None,
                        "repeats": gb.DEFAULT_REPEATS, "out_dir": Path("marlin-bench")}
    assert args.func.__name__ == "cmd_bench"


def test_quick_fills_in_what_is_not_given():
    quick = bench_settings(build_parser().parse_args(["bench", "--quick"]))
    assert quick["shapes_kn"] == [(4096, 4096)] and quick["ms"] == [1, 16]
    assert quick["formats"] == ["fp4", "fp4_2of4"] and quick["pipelines"] is None and quick["repeats"] == 3
    mixed = bench_settings(build_parser().parse_args(["bench", "--quick", "--formats", "nf4", "--m", "64"]))
    assert mixed["formats"] == ["nf4"] and mixed["ms"] == [64] and mixed["shapes_kn"] == [(4096, 4096)]


@pytest.mark.parametrize("argv", [["bench", "--formats", "fp5"], ["bench", "--pipelines", "tiled"],
                                  ["bench", "--shapes", "4096"], ["bench", "--m", "0"],
                                  ["bench", "--repeats", "-1"], ["bench", "--m", "x"]])
def test_bad_bench_arguments_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert "usage: marlin-dsl bench" in capsys.readouterr().err


def test_help_lists_bench(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--help"])
    out = capsys.readouterr().out
    for opt in ("--formats", "--pipelines", "--shapes", "--m", "--repeats", "--out", "--quick"):
        assert opt in out


# ----- on a GPU ----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="marlin-dsl bench needs MLX's CUDA (or Metal) GPU backend; "
                                    "this machine has none")
def test_bench_quick_on_gpu(tmp_path):
    out = tmp_path / "bench"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-m", "marlin_dsl.cli", "bench", "--quick", "--repeats", "2",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, (done.stdout[-4000:], done.stderr[-4000:])
    doc = json.loads((out / "bench.json").read_text())
    rows = doc["rows"]
    assert doc["failed"] == 0 and doc["errors"] == []
    kinds = {(r["kind"], r["format"], r["pipeline"]) for r in rows}
    assert ("fp16", gb.FP16_FORMAT, gb.FP16) in kinds and ("mlx_q4", gb.QMM_FORMAT, gb.QMM) in kinds
    assert {(f, p) for k, f, p in kinds if k == "marlin"} == {(f, p) for f in gb.QUICK_FORMATS
                                                             for p in gb.DEFAULT_PIPELINES}
    assert {r["M"] for r in rows} == set(gb.QUICK_MS) and {(r["K"], r["N"]) for r in rows} == set(gb.QUICK_SHAPES)
    for r in rows:
        assert r["ok"] and r["kernel_us"] > 0 and r["e2e_us"] > 0 and math.isfinite(r["floor_us"])
    assert doc["environment"]["device_name"] and doc["copy_bandwidth"]["bytes_per_s"] > 1e11
    assert "kernel us" in done.stdout
