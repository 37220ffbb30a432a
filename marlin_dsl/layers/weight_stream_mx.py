"""The weight-stream layout (layouts/weight_stream.py, which says what it is) made and undone with MLX
ops, on the device: layers convert a weight once when it arrives, without a host round trip,
and convert back only to save it or hand it out.

`stream_arrays_mx` is bit-identical to the numpy `stream_arrays`, step for step: unpack the
codes, pad to whole vectors and N tiles, apply the K shuffle, cut A tiles, gather each lane's
fragment elements (a take through the target's lane table), and pack pairs into 16-bit halves
of the lane's words, each code's bits where the layout's bit placement puts them. `linear_arrays_mx` runs the same steps backwards with the inverse
permutations (every step is a bijection on the padded matrix; the padding is dropped).
Only small index tables (lane tables, the K shuffle, the sparse metadata fields, their
inverses) come from the host, cached per layout.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import mlx.core as mx
import numpy as np

from ..errors import ShapeError
from ..formats import Format, NMSparsity
from ..layouts.bit_placement import BitPlacement
from ..layouts.weight_stream import VECTOR_WORDS, StreamLayout, stream_layout
from ..machine.target import Target
from .mlx_ops import mx_dtype, pack_bits_mx, unpack_bits_mx


@lru_cache(maxsize=None)
def _layout(fmt: Format, target: Target) -> StreamLayout:
    return stream_layout(fmt, target)


@lru_cache(maxsize=None)
def _tables(fmt: Format, target: Target) -> dict[str, mx.array]:
    """Host-side index tables of the layout as MLX arrays (small; once per layout)."""
    lay = _layout(fmt, target)
    lane_flat = (lay.rows * lay.tile_cols + lay.cols).astype(np.int32)  # [lanes, per_lane]
    inverse = np.empty(lay.tile_rows * lay.tile_cols, np.int32)
    inverse[lane_flat.ravel()] = np.arange(lane_flat.size, dtype=np.int32)
    out = {"lane": mx.array(lane_flat), "lane_inverse": mx.array(inverse)}
    if lay.k_perm is not None:
        out["k_perm"] = mx.array(lay.k_perm.astype(np.int32))
        out["k_perm_inverse"] = mx.array(np.argsort(lay.k_perm).astype(np.int32))
    return out


def _dims(lay: StreamLayout, stored_k: int, n: int) -> tuple[int, int]:
    """(N tiles, K vectors) of a [stored K, N] matrix."""
    return -(-n // lay.tile_rows), -(-stored_k // lay.chunk)


def stream_shapes(fmt: Format, target: Target, k: int, n: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the arrays the layout changes (flat u32 words); others keep fmt.buffers'."""
    lay = _layout(fmt, target)
    stored = fmt.stored_k(k)
    nt, kv = _dims(lay, stored, n)
    shapes = {"qweight": (nt * kv * lay.lanes * lay.code_words,)}
    if lay.has_meta:
        shapes["meta"] = (nt * kv * lay.lanes * lay.meta_words,)
    return shapes


def _check(fmt: Format, shape: tuple[int, int], arrays: Mapping[str, mx.array],
           want: dict[str, tuple[int, ...]], what: str) -> None:
    elems = {spec.name: spec.elem for spec in fmt.buffers(*shape)}
    for name, expected in want.items():
        a = arrays.get(name)
        if not isinstance(a, mx.array) or tuple(a.shape) != expected or a.dtype != mx_dtype(elems[name]):
            got = (f"{tuple(a.shape)} {a.dtype}" if isinstance(a, mx.array) else type(a).__name__)
            raise ShapeError(f"arrays[{name!r}]: expected the {what} layout's {expected} "
                             f"{mx_dtype(elems[name])}, got {got}")


# ----- linear -> weight stream -------------------------------------------------------------------

def stream_arrays_mx(fmt: Format, target: Target, shape: tuple[int, int],
                     arrays: Mapping[str, mx.array]) -> dict[str, mx.array]:
    """The arrays a weight-stream kernel reads (`stream_arrays`, with MLX ops): qweight (and
    2:4 metadata) re-laid as flat u32 words, every other array passed through."""
    k, n = shape
    lay = _layout(fmt, target)
    _check(fmt, shape, arrays, {s.name: tuple(s.shape) for s in fmt.buffers(k, n)
                                if s.name in ("qweight", "meta")}, "linear")
    out = dict(arrays)
    codes = unpack_bits_mx(arrays["qweight"], fmt.element.bits, fmt.packing.word_bits).astype(mx.uint8)
    if lay.scatter is not None:
        fields = unpack_bits_mx(arrays["meta"], fmt.sparsity.meta_bits, fmt.packing.word_bits)
        out["qweight"], out["meta"] = _pack_scatter(lay, _scatter_tables(fmt, target), codes, fields)
        return out
    out["qweight"] = _pack_values(lay, _tables(fmt, target), codes)
    if lay.sparse:
        out["meta"] = _pack_meta(lay, fmt, arrays["meta"], k, n)
    return out


def _pack_values(lay: StreamLayout, tables: dict[str, mx.array], codes: mx.array) -> mx.array:
    ks, n = codes.shape
    nt, kv = _dims(lay, ks, n)
    padded = mx.pad(codes, [(0, kv * lay.chunk - ks), (0, nt * lay.tile_rows - n)])
    if "k_perm" in tables:  # MMA position j of every chunk holds original offset k_perm[j]
        padded = mx.take(padded.reshape(kv, lay.chunk, -1), tables["k_perm"], axis=1)
    # [kv, tiles, cols, nt, rows] -> [nt, kv, tiles, rows * cols]: one A tile = a W^T block.
    tiles = padded.reshape(kv, lay.tiles, lay.tile_cols, nt, lay.tile_rows).transpose(3, 0, 1, 4, 2)
    flat = tiles.reshape(nt, kv, lay.tiles, lay.tile_rows * lay.tile_cols)
    lane_elems = mx.take(flat, tables["lane"], axis=3)  # [nt, kv, tiles, lanes, per_lane]
    pairs = lane_elems.transpose(0, 1, 3, 2, 4).reshape(nt, kv, lay.lanes, VECTOR_WORDS, lay.per_half, 2)
    return _place_pairs(lay, pairs)


def _place_pairs(lay: StreamLayout, pairs: mx.array) -> mx.array:
    """[..., words, slots, lo/hi] codes -> the flat u32 words (the layout's bit placement)."""
    # each code looked up in its slot's table of spread bits (bit_placement.BitPlacement.spread)
    spread, slot_base = _spread_tables(lay.bit_order)
    placed = mx.take(spread, pairs.astype(mx.uint32) + slot_base)  # [..., slot, lo/hi]
    halves = mx.left_shift(placed, mx.array(np.array([0, 16], np.uint32)))
    return mx.sum(halves, axis=(-2, -1)).reshape(-1)  # disjoint bits: the sum is the OR


@lru_cache(maxsize=None)
def _spread_tables(placement: BitPlacement) -> tuple[mx.array, mx.array]:
    """(the placement's spread tables, flat; each slot's first entry [slots, 1])."""
    table = placement.spread()
    base = (np.arange(table.shape[0], dtype=np.uint32) * np.uint32(table.shape[1]))[:, None]
    return mx.array(table.reshape(-1)), mx.array(base)


def _bit_tables(lay: StreamLayout) -> tuple[mx.array, mx.array]:
    """(bit i of a code [bits], its bit in the word [slots, 2, bits]) of the layout's placement."""
    positions = np.asarray(lay.bit_order.positions, np.uint32)  # [slots, bits], within a half
    word_bits = np.stack([positions, positions + 16], axis=1)
    return mx.array(np.arange(lay.bits, dtype=np.uint32)), mx.array(word_bits)


def _positions(fmt: Format, meta: mx.array) -> mx.array:
    """Linear metadata words -> [blocks, n, N] kept positions (uint32)."""
    sp = fmt.sparsity
    assert isinstance(sp, NMSparsity)
    fields = unpack_bits_mx(meta, sp.meta_bits, fmt.packing.word_bits)
    shifts = mx.array((np.arange(sp.n) * sp.index_bits).astype(np.uint32))[None, :, None]
    return mx.bitwise_and(mx.right_shift(fields[:, None, :], shifts), (1 << sp.index_bits) - 1)


@lru_cache(maxsize=None)
def _meta_fields(target: Target, lay_tiles: int, groups_per_tile: int) -> list[dict]:
    """Per K tile of a vector: which metadata word, and for each lane the flat
    (row, group, slot) indices of its fields and their bit offsets (from the target's table)."""
    tiles = []
    for tile in range(lay_tiles):
        f = target.sparse_metadata(tile % 2)
        flat = (f.rows * groups_per_tile + f.groups) * 2 + f.slots
        lanes = {int(lane): (mx.array(flat[f.lanes == lane].astype(np.int32)),
                             mx.array(f.bit_offsets[f.lanes == lane].astype(np.uint32)))
                 for lane in np.unique(f.lanes)}
        tiles.append({"word": tile // 2, "lanes": lanes, "flat": flat, "bits": f.bit_offsets,
                      "field_lanes": f.lanes})
    return tiles


def _pack_meta(lay: StreamLayout, fmt: Format, meta: mx.array, k: int, n: int) -> mx.array:
    positions = _positions(fmt, meta)  # [blocks, 2, N]
    blocks = positions.shape[0]
    gpt = lay.tile_cols // 2
    nt, kv = -(-n // lay.tile_rows), -(-blocks // (gpt * lay.tiles))
    rows_p, cols_p = kv * lay.tiles * gpt, nt * lay.tile_rows
    padded = mx.pad(positions, [(0, rows_p - blocks), (0, 0), (0, cols_p - n)])
    outside = (mx.arange(rows_p)[:, None, None] >= blocks) | (mx.arange(cols_p)[None, None, :] >= n)
    slot = mx.arange(2)[None, :, None].astype(mx.uint32)
    padded = mx.where(outside, slot, padded)  # padding: the ordered pair (0, 1)
    # [kv, tiles, groups, slot, nt, rows] -> [nt, kv, tiles, rows * groups * slot]
    tiled = padded.reshape(kv, lay.tiles, gpt, 2, nt, lay.tile_rows).transpose(4, 0, 1, 5, 2, 3)
    tiled = tiled.reshape(nt, kv, lay.tiles, lay.tile_rows * gpt * 2)
    words = [[mx.zeros((nt, kv), mx.uint32) for _ in range(lay.lanes)] for _ in range(lay.meta_words)]
    for tile, spec in enumerate(_meta_fields(lay.sparse_target, lay.tiles, gpt)):
        fields = tiled[:, :, tile]
        for lane, (flat, bits) in spec["lanes"].items():
            value = mx.sum(mx.left_shift(mx.take(fields, flat, axis=2), bits), axis=2)
            words[spec["word"]][lane] = words[spec["word"]][lane] + value
    stacked = mx.stack([mx.stack(per_word, axis=2) for per_word in words], axis=3)  # [nt, kv, lanes, words]
    return stacked.reshape(-1)


# ----- weight stream -> linear -------------------------------------------------------------------

def linear_arrays_mx(fmt: Format, target: Target, shape: tuple[int, int],
                     arrays: Mapping[str, mx.array]) -> dict[str, mx.array]:
    """`stream_arrays_mx`'s exact inverse: the format's linear arrays, padding dropped."""
    k, n = shape
    lay = _layout(fmt, target)
    _check(fmt, shape, arrays, stream_shapes(fmt, target, k, n), "weight-stream")
    out = dict(arrays)
    if lay.scatter is not None:
        codes, fields = _unpack_scatter(lay, _scatter_tables(fmt, target), arrays["qweight"], arrays["meta"],
                                        k // fmt.sparsity.block_k, n)
        out["qweight"] = pack_bits_mx(codes, fmt.element.bits, fmt.packing.word_bits)
        out["meta"] = pack_bits_mx(fields, fmt.sparsity.meta_bits, fmt.packing.word_bits)
        return out
    codes = _unpack_values(lay, _tables(fmt, target), arrays["qweight"], fmt.stored_k(k), n)
    out["qweight"] = pack_bits_mx(codes, fmt.element.bits, fmt.packing.word_bits)
    if lay.sparse:
        out["meta"] = _unpack_meta(lay, fmt, arrays["meta"], k, n)
    return out


def _unpack_values(lay: StreamLayout, tables: dict[str, mx.array], words: mx.array, ks: int, n: int) -> mx.array:
    nt, kv = _dims(lay, ks, n)
    pairs = _pairs_of(lay, words.reshape(nt, kv, lay.lanes, VECTOR_WORDS))  # [nt, kv, lanes, words, per_half, 2]
    lane_elems = pairs.reshape(nt, kv, lay.lanes, lay.tiles, lay.per_lane).transpose(0, 1, 3, 2, 4)
    flat = lane_elems.reshape(nt, kv, lay.tiles, lay.lanes * lay.per_lane)
    tiles = mx.take(flat, tables["lane_inverse"], axis=3)  # [nt, kv, tiles, rows * cols]
    tiles = tiles.reshape(nt, kv, lay.tiles, lay.tile_rows, lay.tile_cols).transpose(1, 2, 4, 0, 3)
    padded = tiles.reshape(kv * lay.chunk, nt * lay.tile_rows)
    if "k_perm_inverse" in tables:
        padded = mx.take(padded.reshape(kv, lay.chunk, -1), tables["k_perm_inverse"], axis=1)
        padded = padded.reshape(kv * lay.chunk, -1)
    return padded[:ks, :n]


def _pairs_of(lay: StreamLayout, words: mx.array) -> mx.array:
    """`_place_pairs`' inverse: u32 words [...] -> codes [..., slots, lo/hi] (uint8)."""
    code_bits, word_bits = _bit_tables(lay)
    bits = mx.bitwise_and(mx.right_shift(words[..., None, None, None], word_bits), 1)  # [..., slot, lo/hi, bit]
    return mx.sum(mx.left_shift(bits, code_bits), axis=-1).astype(mx.uint8)


def _unpack_meta(lay: StreamLayout, fmt: Format, words: mx.array, k: int, n: int) -> mx.array:
    sp = fmt.sparsity
    assert isinstance(sp, NMSparsity)
    blocks = k // sp.block_k
    gpt = lay.tile_cols // 2
    nt, kv = -(-n // lay.tile_rows), -(-blocks // (gpt * lay.tiles))
    w = words.reshape(nt, kv, lay.lanes, lay.meta_words)
    per_tile = []
    for spec in _meta_fields(lay.sparse_target, lay.tiles, gpt):
        lane_words = mx.take(w[..., spec["word"]], mx.array(spec["field_lanes"].astype(np.int32)), axis=2)
        fields = mx.bitwise_and(mx.right_shift(lane_words, mx.array(spec["bits"].astype(np.uint32))), 3)
        inverse = np.empty(len(spec["flat"]), np.int32)
        inverse[spec["flat"]] = np.arange(len(spec["flat"]), dtype=np.int32)
        per_tile.append(mx.take(fields, mx.array(inverse), axis=2))  # [nt, kv, rows * groups * 2]
    tiled = mx.stack(per_tile, axis=2).reshape(nt, kv, lay.tiles, lay.tile_rows, gpt, 2)
    padded = tiled.transpose(1, 2, 4, 5, 0, 3).reshape(kv * lay.tiles * gpt, 2, nt * lay.tile_rows)
    positions = padded[:blocks, :, :n]
    fields = positions[:, 0] + mx.left_shift(positions[:, 1], sp.index_bits)  # sum(p_i << i*index_bits)
    return pack_bits_mx(fields, sp.meta_bits, fmt.packing.word_bits)


# ----- the scattered N:M layout (layouts/sparse_scatter.py) ----------------------------------------

@lru_cache(maxsize=None)
def _scatter_tables(fmt: Format, target: Target) -> dict[str, np.ndarray]:
    """Flat gather indices of the scattered layout within one (K vector, N tile): of each
    (lane, kept pair, half)'s code in [blocks, kept unit, position in chunk, row] (a
    bijection), and of each (lane, field, low/high block)'s field in [blocks, row] (every
    block once; a one-block field names its block twice); and, for the way back, where each
    code and each block's field first sits among them."""
    lay = _layout(fmt, target)
    plan, sp, rows = lay.scatter, fmt.sparsity, lay.tile_rows
    blk, unit, sub, row, f_blk, f_row = plan.lane_index()
    codes = ((blk * sp.n + unit) * sp.chunk + sub) * rows + row  # [lanes, pairs, 2]
    fields = f_blk * rows + f_row  # [lanes, fields, 2]
    codes, fields = codes.reshape(-1), fields.reshape(-1)
    _, first_field = np.unique(fields, return_index=True)  # sorted by target: [blocks * rows]
    return {"codes": codes.astype(np.int32), "fields": fields.astype(np.int32),
            "codes_inverse": np.argsort(codes).astype(np.int32), "fields_inverse": first_field.astype(np.int32)}


def _pack_scatter(lay: StreamLayout, index: dict[str, np.ndarray], codes: mx.array,
                  fields: mx.array) -> tuple[mx.array, mx.array]:
    """`ScatterPlan.pack` with MLX ops: [stored K, N] codes and [blocks, N] fields -> flat
    (qweight, meta) u32, bit-identical."""
    plan, sp = lay.scatter, lay.scatter.sp
    blocks, n = fields.shape
    nt, kv = plan.dims(blocks, n, lay.tile_rows)
    bpv, rows = plan.blocks_per_vector, lay.tile_rows
    grid = mx.pad(codes.reshape(blocks, sp.n * sp.chunk, n), [(0, kv * bpv - blocks), (0, 0), (0, nt * rows - n)])
    grid = grid.reshape(kv, bpv * sp.n * sp.chunk, nt, rows).transpose(0, 2, 1, 3).reshape(kv, nt, -1)
    lanes = mx.take(grid, mx.array(index["codes"]), axis=2)  # [kv, nt, lanes * pairs * 2]
    pairs = lanes.reshape(kv, nt, plan.lanes, plan.code_words, plan.per_half, 2).transpose(1, 0, 2, 3, 4, 5)
    qweight = _place_pairs(lay, pairs)
    fgrid = mx.pad(fields.astype(mx.uint32), [(0, kv * bpv - blocks), (0, nt * rows - n)])
    fgrid = fgrid.reshape(kv, bpv, nt, rows).transpose(0, 2, 1, 3).reshape(kv, nt, -1)
    per = mx.take(fgrid, mx.array(index["fields"]), axis=2).reshape(kv, nt, plan.lanes, len(plan.fields), 2)
    double = np.array([f.double for f in plan.fields])
    value = per[..., 0] + mx.left_shift(per[..., 1], sp.meta_bits) * mx.array(double.astype(np.uint32))
    shifted = mx.left_shift(value, mx.array(np.array([f.shift for f in plan.fields], np.uint32)))
    word_of = np.array([f.word for f in plan.fields])
    words = [mx.sum(mx.take(shifted, mx.array(np.flatnonzero(word_of == w).astype(np.int32)), axis=-1), axis=-1)
             for w in range(plan.meta_words)]  # each word's fields: disjoint bits, so the sum is the OR
    meta = mx.stack(words, axis=-1).transpose(1, 0, 2, 3)  # [nt, kv, lanes, meta_words]
    return qweight, meta.reshape(-1)


def _unpack_scatter(lay: StreamLayout, index: dict[str, np.ndarray], qweight: mx.array, meta: mx.array,
                    blocks: int, n: int) -> tuple[mx.array, mx.array]:
    """`_pack_scatter`'s inverse: ([stored K, N] codes, [blocks, N] fields), padding dropped."""
    plan, sp = lay.scatter, lay.scatter.sp
    nt, kv = plan.dims(blocks, n, lay.tile_rows)
    bpv, rows = plan.blocks_per_vector, lay.tile_rows
    pairs = _pairs_of(lay, qweight.reshape(nt, kv, plan.lanes, plan.code_words))
    flat = pairs.transpose(1, 0, 2, 3, 4, 5).reshape(kv, nt, -1)  # [kv, nt, lanes * pairs * 2]
    grid = mx.take(flat, mx.array(index["codes_inverse"]), axis=2)
    grid = grid.reshape(kv, nt, bpv * sp.n * sp.chunk, rows).transpose(0, 2, 1, 3)
    codes = grid.reshape(kv * bpv, sp.n * sp.chunk, nt * rows)[:blocks, :, :n].reshape(-1, n)
    words = meta.reshape(nt, kv, plan.lanes, plan.meta_words).transpose(1, 0, 2, 3)
    word_of = mx.array(np.array([f.word for f in plan.fields], np.int32))
    shift = mx.array(np.array([f.shift for f in plan.fields], np.uint32))
    value = mx.right_shift(mx.take(words, word_of, axis=3), shift)  # [kv, nt, lanes, fields]
    low = mx.bitwise_and(value, (1 << sp.meta_bits) - 1)
    high = mx.bitwise_and(mx.right_shift(value, sp.meta_bits), (1 << sp.meta_bits) - 1)
    per = mx.stack([low, high], axis=-1).reshape(kv, nt, -1)  # a one-block field's high copy is unused
    fgrid = mx.take(per, mx.array(index["fields_inverse"]), axis=2).reshape(kv, nt, bpv, rows).transpose(0, 2, 1, 3)
    fields = fgrid.reshape(kv * bpv, nt * rows)[:blocks, :n]
    return codes, fields


__all__ = ["linear_arrays_mx", "stream_arrays_mx", "stream_shapes"]
