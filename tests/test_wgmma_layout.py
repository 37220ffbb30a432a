"""Self-consistency of the numpy model of Hopper's wgmma operands
(marlin_dsl/machine/cuda/wgmma_layout.py), and of the records bench/probes/wgmma_probe.py sends to the
GPU: an emulator here reads them back with the PTX ISA's rules written out independently.
The model against real hardware is bench/probes/wgmma_probe.py's job."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from marlin_dsl.machine import CUDA
from marlin_dsl.machine.cuda import sparse_layout as sl
from marlin_dsl.machine.cuda import wgmma_layout as wl

from wgmma_emulator import emulate as _emulate, swap_lbo_sbo as _swap_lbo_sbo

ROOT = Path(__file__).resolve().parents[1]


def _coverage(rows, cols, shape):
    count = np.zeros(shape, dtype=np.int64)
    np.add.at(count, (np.ravel(rows), np.ravel(cols)), 1)
    return count


def test_a_registers_cover_the_tile_once_and_match_mma_m16n8k16_per_warp():
    rows, ks = wl.a_reg_coords()
    assert rows.shape == ks.shape == (128, 8)
    assert np.all(_coverage(rows, ks, (64, 16)) == 1)
    a_rows, a_cols = CUDA.lane_elements("a", 16, 16)   # the mma.sync m16n8k16 A table
    for w in range(4):
        assert np.array_equal(rows[32 * w:32 * w + 32], a_rows + 16 * w)
        assert np.array_equal(ks[32 * w:32 * w + 32], a_cols)


@pytest.mark.parametrize("n", [8, 64, 128, 256])
def test_accumulators_cover_d_once_and_match_mma_c_per_warp(n):
    rows, cols = wl.d_coords(n)
    assert rows.shape == (128, n // 2)
    assert np.all(_coverage(rows, cols, (64, n)) == 1)
    c_rows, c_cols = CUDA.lane_elements("c", 16, 8)    # the m16n8 f32 accumulator table
    for w in range(4):
        for blk in range(n // 8):
            sel = slice(4 * blk, 4 * blk + 4)
            assert np.array_equal(rows[32 * w:32 * w + 32, sel], c_rows + 16 * w)
            assert np.array_equal(cols[32 * w:32 * w + 32, sel], c_cols + 8 * blk)
    c = np.arange(64 * n, dtype=np.float64).reshape(64, n)
    assert np.array_equal(wl.d_from_lane_values(wl.c_lane_values(c), n), c)


def test_bad_n_is_refused():
    with pytest.raises(ValueError):
        wl.d_coords(12)


def test_descriptor_fields_sit_at_the_documented_bits():
    assert wl.encode_descriptor(16, 0, 0) == 1
    assert wl.encode_descriptor(0, 16, 0) == 1 << 16
    assert wl.encode_descriptor(0, 0, 16) == 1 << 32
    assert wl.encode_descriptor(0, 0, 0, base_offset=1) == 1 << 49
    assert wl.encode_descriptor(0, 0, 0, "128B") == 1 << 62
    assert wl.encode_descriptor(0, 0, 0, "32B") == 3 << 62
    top = (1 << 18) - 16
    d = wl.encode_descriptor(top, top, top, "64B", 7)
    assert d == (0x3FFF | 0x3FFF << 16 | 0x3FFF << 32 | 7 << 49 | 2 << 62)
    assert wl.decode_descriptor(d) == {"start_addr": top, "lbo": top, "sbo": top,
                                       "base_offset": 7, "swizzle": "64B"}
    for bad in ({"start_addr": 8, "lbo": 0, "sbo": 0}, {"start_addr": 0, "lbo": 1 << 18, "sbo": 0},
                {"start_addr": -16, "lbo": 0, "sbo": 0}):
        with pytest.raises(ValueError):
            wl.encode_descriptor(**bad)
    with pytest.raises(ValueError):
        wl.encode_descriptor(0, 0, 0, "16B")


def test_swizzle128_is_an_involution_inside_each_1024_byte_atom():
    a = np.arange(4 * 1024)
    s = wl.swizzle128(a)
    assert np.array_equal(wl.swizzle128(s), a)
    assert np.array_equal(s // 1024, a // 1024)
    assert np.array_equal(s % 16, a % 16)            # 16-byte chunks move whole
    assert np.array_equal((s >> 7), (a >> 7))        # ... inside their 128-byte row
    row0 = (a % 1024) < 128
    assert np.array_equal(s[row0], a[row0])          # row 0 of an atom is not moved
    assert np.array_equal((s >> 4) & 7, ((a >> 4) & 7) ^ ((a >> 7) & 7))


@pytest.mark.parametrize("rows,kelems", [(64, 16), (64, 64), (256, 64), (8, 128)])
def test_smem_layouts_are_bijections_onto_the_tile(rows, kelems):
    r, k = np.meshgrid(np.arange(rows), np.arange(kelems), indexing="ij")
    size = rows * kelems * 2
    for off in (wl.offset_interleave(r, k, 128, kelems // 8 * 128),
                wl.offset_interleave(r, k, rows // 8 * 128, 128)):
        assert np.array_equal(np.sort(off.ravel()), np.arange(0, size, 2))
    if kelems % 64 == 0:
        off = wl.offset_swizzle128(r, k, 1024, k_atom_stride=rows * 128)
        assert np.array_equal(np.sort(off.ravel()), np.arange(0, size, 2))
    # a core matrix of the no-swizzle layout: 8 rows x 16 bytes, contiguous
    off = wl.offset_interleave(r[:8, :8], k[:8, :8], 128, 4096)
    assert np.array_equal(off.ravel(), np.arange(0, 128, 2))


def test_smem_image_refuses_collisions():
    r, k = np.meshgrid(np.arange(8), np.arange(16), indexing="ij")
    with pytest.raises(ValueError):
        wl.smem_image(np.ones((8, 16)), wl.offset_interleave(r, k, 0, 0), "f16", 4096)


@pytest.mark.parametrize("sel", [0, 1])
def test_sparse_metadata_matches_mma_sp_per_warp(sel):
    threads, bits, rows, groups, slots = wl.sparse_metadata_fields(sel)
    assert len(threads) == 64 * 8 * 2
    assert len(set(zip(threads.tolist(), bits.tolist()))) == len(threads)   # no field twice
    ref = {(l, b): (r, j, s) for l, b, r, j, s in zip(*sl.metadata_fields(sel))}
    for t, b, r, j, s in zip(threads, bits, rows, groups, slots):
        w = t // 32
        assert r // 16 == w
        assert ref[(t % 32, b)] == (r - 16 * w, j, s)
    assert np.array_equal(wl.sparse_metadata_threads(sel),
                          np.concatenate([sl.metadata_lanes(sel) + 32 * w for w in range(4)]))


def test_sparse_metadata_pack_round_trip():
    rng = np.random.default_rng(0)
    pos = np.sort(np.argsort(rng.random((64, 8, 4)), axis=-1)[..., :2], axis=-1)
    for sel in (0, 1):
        meta = wl.pack_sparse_metadata(pos, sel)
        threads, bits, rows, groups, slots = wl.sparse_metadata_fields(sel)
        got = (meta[threads].astype(np.uint64) >> bits.astype(np.uint64)) & 3
        assert np.array_equal(got, pos[rows, groups, slots])
        idle = np.setdiff1d(np.arange(128), wl.sparse_metadata_threads(sel))
        assert np.all(meta[idle] == 0)
    with pytest.raises(ValueError):
        wl.pack_sparse_metadata(pos[..., ::-1], 0)


def test_b32_packing_matches_sparse_layout():
    rng = np.random.default_rng(1)
    vals = rng.integers(-8, 9, size=(32, 8)).astype(np.float64)
    for dtype in ("f16", "bf16"):
        assert np.array_equal(wl.pack_b32(vals, dtype), sl.to_b32_registers(vals, dtype))


# --- the probe's records, read back with the PTX ISA's rules --------------------------------

def _probe():
    spec = importlib.util.spec_from_file_location("wgmma_probe", ROOT / "bench" / "probes" / "wgmma_probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_probe_records_read_back_with_ptx_rules_give_a_b_plus_c():
    probe = _probe()
    cases = probe.make_cases(np.random.default_rng(5), 1)
    assert len({c.name for c in cases}) == len(cases)
    for case in cases:
        rec = case.record()
        assert rec.dtype.itemsize == probe.CASE_DTYPE.itemsize
        regs = _emulate(rec, case.dtype)
        assert np.array_equal(probe.d_from_regs(regs, case.n), case.expected()), case.name


def test_probe_what_if_explains_a_swapped_lbo_sbo():
    probe = _probe()
    case = probe.Case(np.random.default_rng(7), "f16", 64, "interleave-k")
    rec = case.record()
    _swap_lbo_sbo(rec)
    got = probe.d_from_regs(_emulate(rec, "f16"), 64)
    assert not np.array_equal(got, case.expected())
    assert np.array_equal(got, case.model("LBO/SBO swapped"))


_FAKE_GPU = '''
import sys
import numpy as np
sys.path.insert(0, {tests!r})
sys.path.insert(0, {bench!r})
from wgmma_emulator import emulate as _emulate, swap_lbo_sbo as _swap_lbo_sbo
import wgmma_probe as probe
if sys.argv[1] == "--bench":
    print("device: fake (sm_90)")
    print("BENCH kind=wgmma name=x grid=132 threads=256 iters=1 ms=1.0 tflops=600.0")
    print("BENCH kind=mma_sync name=y grid=528 threads=128 iters=1 ms=1.0 tflops=360.0")
    sys.exit(0)
head = np.fromfile(sys.argv[1], dtype="<i4", count=2)
assert head[1] == probe.CASE_DTYPE.itemsize
recs = np.fromfile(sys.argv[1], dtype=probe.CASE_DTYPE, offset=8)
if {crash} and np.any((recs["variant"] & 6) == 6):
    sys.exit("probe kernel N=8 failed: an illegal instruction was encountered")
out = np.zeros((len(recs), 128, 128), dtype=np.float32)
for i, rec in enumerate(recs):
    if {swap}:
        _swap_lbo_sbo(rec)
    out[i] = _emulate(rec, "bf16" if rec["variant"] & 1 else "f16")
print("device: fake (sm_90)")
out.tofile(sys.argv[2])
recs["smem"].tofile(sys.argv[3])
'''


@pytest.mark.parametrize("swap,crash", [(False, False), (True, False), (False, True)])
def test_probe_driver_end_to_end_on_an_emulated_gpu(tmp_path, monkeypatch, capsys, swap, crash):
    import json
    import sys

    probe = _probe()
    exe = tmp_path / "fake_gpu"
    script = _FAKE_GPU.format(tests=str(ROOT / "tests"), bench=str(ROOT / "bench" / "probes"), swap=swap,
                              crash=crash)
    (tmp_path / "fake_gpu.py").write_text(script)
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "fake_gpu.py"} "$@"\n')
    exe.chmod(0o755)
    make = probe.make_cases   # N = 8 and the bulk-copy cases keep the test short
    monkeypatch.setattr(probe, "make_cases", lambda rng, trials: [
        c for c in make(rng, trials) if c.n == 8 or c.bulk])
    monkeypatch.setattr(probe, "find_nvcc", lambda explicit: "nvcc")
    monkeypatch.setattr(probe, "build", lambda nvcc, out: (out.write_bytes(exe.read_bytes()),
                                                            out.chmod(0o755), "fake build")[2])
    code = probe.main(["--out", str(tmp_path), "--trials", "1", "--bench"])
    text = capsys.readouterr().out
    report = json.loads((tmp_path / "wgmma_probe.json").read_text())
    assert report["bench_ratio_mma_sync_over_wgmma"] == pytest.approx(0.6)
    if crash:   # sparse with A in registers "faults": those kinds are named, the rest pass
        assert code == 2
        assert set(report["run_errors"]) == {r["name"] for r in report["results"]
                                             if "sparse" in r["name"] and "regs" in r["name"]}
        assert all(r["pass"] for r in report["results"] if r["name"] not in report["run_errors"])
        return
    if not swap:
        assert code == 0 and "ALL PASS" in text and not report["failures"]
        assert any(r["name"] == "cp.async.bulk + mbarrier readback" and r["pass"]
                   for r in report["results"])
        return
    assert code == 1 and "SOME FAIL" in text
    failing = [r for r in report["results"] if not r["pass"]]
    assert failing and all("interleave" in r["name"] for r in failing)
    n_fail = sum(r["trials"] - r["ok"] for r in failing)
    assert report["what_ifs"]["LBO/SBO swapped"] == n_fail
