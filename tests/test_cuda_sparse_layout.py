"""Self-consistency of the numpy model of mma.sp::ordered_metadata m16n8k32 f16/bf16
(marlin_dsl/machine/cuda/sparse_layout.py).  The model against real hardware is
bench/probes/mma_sp_probe.py's job."""
from __future__ import annotations

import numpy as np
import pytest

from marlin_dsl.machine.cuda import sparse_layout as sl


def _coverage(rows, cols, shape):
    count = np.zeros(shape, dtype=np.int64)
    np.add.at(count, (rows.ravel(), cols.ravel()), 1)
    return count


def test_shapes_and_constants():
    assert sl.SPARSE_K == 32
    for fn in (sl.a_compressed_coords, sl.b_coords):
        r, c = fn()
        assert r.shape == c.shape == (32, 8)
    r, c = sl.c_coords()
    assert r.shape == c.shape == (32, 4)


def test_a_covers_compressed_tile_once():
    rows, cols = sl.a_compressed_coords()
    assert np.all(_coverage(rows, cols, (16, 16)) == 1)


def test_a_matches_dense_m16n8k16_formula():
    # 9.7.14.5.8: row = g for a_i, i in {0,1,4,5}, else g+8; col = 2t + (i&1) (+8 for i >= 4)
    rows, cols = sl.a_compressed_coords()
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(8):
            assert rows[lane, i] == (g if (i < 2 or 4 <= i < 6) else g + 8)
            assert cols[lane, i] == 2 * t + (i & 1) + (8 if i >= 4 else 0)
            # 9.7.14.6.2.2: logical chunk firstcol = 4t (i < 4) or 4t + 16 (i >= 4)
            assert 4 * (cols[lane, i] // 2) == 4 * t + (16 if i >= 4 else 0)


def test_b_covers_once_and_formula():
    ks, ns = sl.b_coords()
    assert np.all(_coverage(ks, ns, (32, 8)) == 1)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(8):
            assert ks[lane, i] == 2 * t + (i & 1) + 8 * (i >> 1)
            assert ns[lane, i] == g


def test_c_covers_once_and_formula():
    rows, cols = sl.c_coords()
    assert np.all(_coverage(rows, cols, (16, 8)) == 1)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        assert rows[lane].tolist() == [g, g, g + 8, g + 8]
        assert cols[lane].tolist() == [2 * t, 2 * t + 1, 2 * t, 2 * t + 1]


@pytest.mark.parametrize("selector", [0, 1])
def test_metadata_fields_table(selector):
    lanes, bits, rows, groups, slots = sl.metadata_fields(selector)
    assert lanes.shape == (256,)
    # every (row, group, slot) exactly once
    key = rows * 16 + groups * 2 + slots
    assert sorted(key.tolist()) == list(range(256))
    # only the selector's thread pair of each quad, all 32 bits of each used lane exactly once
    used = sl.metadata_lanes(selector)
    assert sorted(set(lanes.tolist())) == used.tolist()
    assert set((used & 3).tolist()) == {2 * selector, 2 * selector + 1}
    for lane in used:
        assert sorted(bits[lanes == lane].tolist()) == list(range(0, 32, 2))
    # the documented closed form
    assert np.all(lanes == 4 * (rows & 7) + 2 * selector + (groups >> 2))
    assert np.all(bits == 16 * (rows >> 3) + 4 * (groups & 3) + 2 * slots)
    # a lane holds rows g and g+8 of one 16-column half
    for lane in used:
        sel = lanes == lane
        assert set(rows[sel].tolist()) == {lane >> 2, (lane >> 2) + 8}
        assert set(groups[sel].tolist()) == set(range(4 * (lane & 1), 4 * (lane & 1) + 4))


def test_bad_selector():
    with pytest.raises(ValueError):
        sl.metadata_fields(2)
    with pytest.raises(ValueError):
        sl.pack_metadata(np.tile([0, 1], (16, 8, 1)), 3)


def _random_positions(rng):
    choice = np.sort(np.argsort(rng.random((16, 8, 4)), axis=-1)[..., :2], axis=-1)
    return choice.astype(np.int64)


@pytest.mark.parametrize("selector", [0, 1])
def test_pack_unpack_round_trip(selector):
    rng = np.random.default_rng(10 + selector)
    for _ in range(20):
        pos = _random_positions(rng)
        meta = sl.pack_metadata(pos, selector)
        assert meta.dtype == np.uint32 and meta.shape == (32,)
        ignored = np.setdiff1d(np.arange(32), sl.metadata_lanes(selector))
        assert np.all(meta[ignored] == 0)
        assert np.array_equal(sl.unpack_metadata(meta, selector), pos)
        # every nibble of a used lane is one of the ISA's meaningful ordered values
        for lane in sl.metadata_lanes(selector):
            nibbles = [(int(meta[lane]) >> (4 * i)) & 0xF for i in range(8)]
            assert set(nibbles) <= set(sl.ORDERED_NIBBLES)


def test_pack_known_word():
    # row 0 and row 8, groups 0..3: indices (0,1),(0,2),(1,2),(2,3) -> nibbles 4,8,9,e
    pos = np.tile(np.array([0, 1]), (16, 8, 1))
    pos[0, :4] = [[0, 1], [0, 2], [1, 2], [2, 3]]
    pos[8, 4:] = [[0, 3], [1, 3], [0, 1], [0, 2]]
    meta = sl.pack_metadata(pos, 0)
    assert meta[0] == 0x4444E984          # low half row 0 groups 0..3, high half row 8
    assert meta[1] == 0x8_4_D_C_4444       # low half row 0 groups 4..7, high half row 8
    meta1 = sl.pack_metadata(pos, 1)
    assert meta1[2] == meta[0] and meta1[3] == meta[1] and meta1[0] == meta1[1] == 0


def test_pack_rejects_unordered():
    pos = np.tile(np.array([0, 1]), (16, 8, 1))
    pos[3, 5] = [2, 1]
    with pytest.raises(ValueError):
        sl.pack_metadata(pos, 0)
    pos[3, 5] = [2, 2]
    with pytest.raises(ValueError):
        sl.pack_metadata(pos, 1)
    # unpack refuses unordered words too (undefined behaviour on the hardware)
    with pytest.raises(ValueError):
        sl.unpack_metadata(np.zeros(32, dtype=np.uint32), 0)


def test_pair_packing():
    rng = np.random.default_rng(3)
    p0, p1 = _random_positions(rng), _random_positions(rng)
    meta = sl.pack_metadata_pair(p0, p1)
    assert np.array_equal(sl.unpack_metadata(meta, 0), p0)
    assert np.array_equal(sl.unpack_metadata(meta, 1), p1)
    assert np.array_equal(meta, sl.pack_metadata(p0, 0) | sl.pack_metadata(p1, 1))
    assert np.all(sl.pack_metadata(p0, 0) & sl.pack_metadata(p1, 1) == 0)


def test_compress_2of4_basic_and_ties():
    a = np.zeros((16, 32))
    a[0, 0:4] = [0, 5, 0, 7]          # two nonzeros
    a[1, 4:8] = [0, 0, 0, 3]          # one nonzero at 3 -> (0, 3)
    a[2, 8:12] = [2, 0, 0, 0]         # one nonzero at 0 -> (0, 1)
    a[3, 0:4] = [0, 0, 9, 0]          # one nonzero at 2 -> (0, 2)
    vals, pos = sl.compress_2of4(a)
    assert vals.shape == (16, 16) and pos.shape == (16, 8, 2)
    assert pos[0, 0].tolist() == [1, 3] and vals[0, 0:2].tolist() == [5, 7]
    assert pos[1, 1].tolist() == [0, 3] and vals[1, 2:4].tolist() == [0, 3]
    assert pos[2, 2].tolist() == [0, 1] and vals[2, 4:6].tolist() == [2, 0]
    assert pos[3, 0].tolist() == [0, 2] and vals[3, 0:2].tolist() == [0, 9]
    assert pos[5, 3].tolist() == [0, 1]           # all-zero group
    assert np.all(pos[..., 0] < pos[..., 1])
    assert np.array_equal(sl.decompress_2of4(vals, pos), a)
    with pytest.raises(ValueError):
        bad = a.copy()
        bad[4, 0:4] = [1, 1, 1, 0]
        sl.compress_2of4(bad)


def test_compress_general_shape():
    rng = np.random.default_rng(5)
    a = sl.random_2of4(rng, m=48, k=64)
    vals, pos = sl.compress_2of4(a)
    assert vals.shape == (48, 32) and pos.shape == (48, 16, 2)
    assert np.array_equal(sl.decompress_2of4(vals, pos), a)


@pytest.mark.parametrize("selector", [0, 1])
@pytest.mark.parametrize("allow_fewer", [False, True])
def test_reference_equals_dense_product(selector, allow_fewer):
    rng = np.random.default_rng(100 + selector + 2 * allow_fewer)
    for _ in range(10):
        a = sl.random_2of4(rng, allow_fewer=allow_fewer)
        b = rng.integers(-4, 5, size=(32, 8)).astype(np.float64)
        c = rng.integers(-8, 9, size=(16, 8)).astype(np.float64)
        vals, pos = sl.compress_2of4(a)
        meta = sl.pack_metadata(pos, selector)
        # garbage (other valid metadata) in the lanes the selector ignores changes nothing
        other = sl.pack_metadata(_random_positions(rng), 1 - selector)
        d = sl.mma_sp_reference(sl.a_lane_values(vals), meta | other, sl.b_lane_values(b),
                                selector, c=c)
        assert np.array_equal(d, a @ b + c)
        assert np.array_equal(sl.mma_sp_reference(sl.a_lane_values(vals), meta,
                                                  sl.b_lane_values(b), selector), a @ b)


def test_reference_pair_two_tiles():
    rng = np.random.default_rng(7)
    a0, a1 = sl.random_2of4(rng), sl.random_2of4(rng)
    b = rng.integers(-4, 5, size=(32, 8)).astype(np.float64)
    v0, p0 = sl.compress_2of4(a0)
    v1, p1 = sl.compress_2of4(a1)
    meta = sl.pack_metadata_pair(p0, p1)
    bl = sl.b_lane_values(b)
    assert np.array_equal(sl.mma_sp_reference(sl.a_lane_values(v0), meta, bl, 0), a0 @ b)
    assert np.array_equal(sl.mma_sp_reference(sl.a_lane_values(v1), meta, bl, 1), a1 @ b)


def test_lane_value_round_trips():
    rng = np.random.default_rng(9)
    c = rng.integers(-8, 9, size=(16, 8)).astype(np.float64)
    assert np.array_equal(sl.d_from_lane_values(sl.c_lane_values(c)), c)
    ac = rng.integers(-4, 5, size=(16, 16)).astype(np.float64)
    rows, cols = sl.a_compressed_coords()
    back = np.zeros((16, 16))
    back[rows, cols] = sl.a_lane_values(ac)
    assert np.array_equal(back, ac)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_b32_register_packing(dtype):
    rng = np.random.default_rng(11)
    vals = rng.integers(-200, 201, size=(32, 8)).astype(np.float64)
    regs = sl.to_b32_registers(vals, dtype)
    assert regs.shape == (32, 4) and regs.dtype == np.uint32
    assert np.array_equal(sl.from_b32_registers(regs, dtype), vals)
    one = np.zeros((32, 8))
    one[0, 0], one[0, 1] = 1.0, 2.0
    r = sl.to_b32_registers(one, dtype)
    lo, hi = (0x3C00, 0x4000) if dtype == "f16" else (0x3F80, 0x4000)
    assert r[0, 0] == lo | (hi << 16)          # element 2r in the low half
