"""Dequantisation built from MLX ops, derived from the format description.

`dequantize_mx` is the MLX twin of `marlin_dsl.dequantize` (the float64 numpy reference): the
same derivation from a `Format` (bit fields of the packing, N:M metadata, the encoding's value
table, group scales and zero points), expressed as MLX array ops so that it runs lazily on any
MLX device. It is the "mlx" backend of `marlin_dsl.nn.quantized_linear` (dequantise, then
matmul), which lets a model using `MarlinLinear` run where no kernel of ours does.

Nothing here branches on a format's name; every constant comes from the description.

Exactness: the value table is rounded to float32 and (t - z) * s is computed in float32. For
float and integer encodings every step is exact (table values and zero points are small
integers or short dyadic fractions, scales are fp16, bf16 or 8-bit codes), so the result is
the float64 reference rounded to float32, bit for bit. For value tables (NF4) and f32 scales
the rounded table entry and the product are two roundings: within one float32 ulp of the
reference. Formats with a bias (MLX's affine mode) follow MLX's own arithmetic instead: where
scales and biases share a float type T, t * s and then + b are each rounded to T, exactly as
`mx.dequantize` computes, so the two agree bit for bit; the float64 reference is the exact
value, within those two roundings of it.
"""
from __future__ import annotations

from typing import Mapping

import mlx.core as mx
import numpy as np

from ..errors import ShapeError
from ..formats import BlockPatternSparsity, Format, NMSparsity, STORAGE_TYPES, StorageType
from ..formats.bitstream import fields_per_group

#: Element names of `BufferSpec.elem` -> the MLX dtypes the arrays must have.
_MX_DTYPES: dict[str, mx.Dtype] = {
    "u8": mx.uint8, "u16": mx.uint16, "u32": mx.uint32,
    **{name: getattr(mx, t.mlx_dtype) for name, t in STORAGE_TYPES.items()},
}


def mx_dtype(elem: str) -> mx.Dtype:
    """The MLX dtype of a buffer's element type (`BufferSpec.elem`)."""
    return _MX_DTYPES[elem]


def check_mx_arrays(fmt: Format, shape: tuple[int, int], arrays: Mapping[str, mx.array],
                    argument: str = "arrays") -> None:
    """Raise ShapeError unless `arrays` are exactly the buffers of `fmt` for a [K, N] weight,
    each an MLX array of the listed shape and dtype. Values are not inspected: that would
    force an evaluation (a device sync) on every call; `marlin_dsl.validate` checks them once
    when packed weights are loaded."""
    k, n = shape
    specs = fmt.buffers(k, n)
    expected = [s.name for s in specs]
    if sorted(arrays) != sorted(expected):
        raise ShapeError(f"{argument}: format {fmt.name!r} expects arrays {expected}, "
                         f"got {sorted(arrays)}")
    for spec in specs:
        array = arrays[spec.name]
        if not isinstance(array, mx.array):
            raise ShapeError(f"{argument}[{spec.name!r}]: expected an mlx.core.array, "
                             f"got {type(array).__name__}")
        if tuple(array.shape) != tuple(spec.shape):
            raise ShapeError(f"{argument}[{spec.name!r}]: expected shape {spec.shape}, "
                             f"got {tuple(array.shape)}")
        if array.dtype != mx_dtype(spec.elem):
            raise ShapeError(f"{argument}[{spec.name!r}]: expected dtype "
                             f"{mx_dtype(spec.elem)}, got {array.dtype}")


def _u32(values: np.ndarray | int) -> mx.array:
    return mx.array(np.asarray(values, dtype=np.uint32))


def unpack_bits_mx(words: mx.array, bits: int, word_bits: int) -> mx.array:
    """MLX twin of `formats.bitstream.unpack_bits`: [W, N] words -> [W*word_bits/bits, N]
    uint32 fields of an LSB-first bit stream along axis 0.

    Fields repeat with a period of `fields_per_group` fields (a whole number of words), so
    the word index and shift of each field in a period are host constants; a field that
    straddles two words ORs in the low bits of the next word. All arithmetic is in uint32
    (words of 8 or 16 bits are widened first), where shifts below 32 are well defined; the
    final mask drops whatever lies above the field.
    """
    per_group = fields_per_group(bits, word_bits)
    words_per_group = per_group * bits // word_bits
    rows, cols = words.shape
    grouped = words.astype(mx.uint32).reshape(rows // words_per_group, words_per_group, cols)
    word, shift = np.divmod(np.arange(per_group) * bits, word_bits)
    if words_per_group == 1:
        low = grouped  # [G, 1, N] broadcasts against the per-field shifts below
    else:
        low = mx.take(grouped, mx.array(word.astype(np.int32)), axis=1)
    value = mx.right_shift(low, _u32(shift)[None, :, None])
    straddles = shift + bits > word_bits
    if straddles.any():
        next_word = np.minimum(word + 1, words_per_group - 1).astype(np.int32)
        high = mx.take(grouped, mx.array(next_word), axis=1)
        # Fields that do not straddle shift by 0 here and are then discarded by the select.
        high = mx.left_shift(high, _u32(np.where(straddles, word_bits - shift, 0))[None, :, None])
        value = mx.bitwise_or(value, mx.where(mx.array(straddles)[None, :, None], high, _u32(0)))
    mask = _u32((1 << bits) - 1)  # bits <= 32, so the mask fits uint32
    return mx.bitwise_and(value, mask).reshape(rows // words_per_group * per_group, cols)


def pack_bits_mx(fields: mx.array, bits: int, word_bits: int) -> mx.array:
    """MLX twin of `formats.bitstream.pack_bits`: [L, N] fields (each < 2**bits) -> the
    [L*bits/word_bits, N] words of their LSB-first bit stream along axis 0, in the word type.

    Fields of one word group (a whole number of words) are shifted into place in uint32 and
    summed per word (their bits are disjoint, so the sum is their OR); a field that straddles
    two words gives its low bits to one and its high bits to the next."""
    per_group = fields_per_group(bits, word_bits)
    words_per_group = per_group * bits // word_bits
    rows, cols = fields.shape
    grouped = fields.astype(mx.uint32).reshape(rows // per_group, per_group, cols)
    word, shift = np.divmod(np.arange(per_group) * bits, word_bits)
    full = (1 << word_bits) - 1
    low = mx.bitwise_and(mx.left_shift(grouped, _u32(shift)[None, :, None]), _u32(full))
    out = []
    for w in range(words_per_group):
        mine = np.nonzero(word == w)[0]
        part = mx.sum(low[:, int(mine[0]):int(mine[-1]) + 1], axis=1)
        spill = np.nonzero((word == w - 1) & (shift + bits > word_bits))[0]
        if spill.size:  # the high bits of the field that straddles into this word
            i = int(spill[0])
            part = part + mx.right_shift(grouped[:, i], _u32(word_bits - int(shift[i])))
        out.append(part)
    words = mx.stack(out, axis=1).reshape(rows // per_group * words_per_group, cols)
    return words.astype(mx_dtype({8: "u8", 16: "u16", 32: "u32"}[word_bits]))


def _nm_scatter(fmt: Format, sp: NMSparsity, stored: mx.array, meta: mx.array,
                k: int) -> tuple[mx.array, mx.array]:
    """Stored codes [K*n/m, N] and metadata words -> dense codes [K, N] and the keep mask.

    A block's metadata field lists its kept chunk positions p_0 < ... < p_{n-1}. Instead of a
    scatter, each dense slot j gathers stored chunk #{i : p_i < j} (the number of kept chunks
    before it) and is kept iff some p_i == j; slots that are not kept get an arbitrary stored
    code, which the keep mask later replaces by 0.0.
    """
    n_cols = stored.shape[1]
    blocks = k // sp.block_k
    fields = unpack_bits_mx(meta, sp.meta_bits, fmt.packing.word_bits)  # [B, N]
    shifts = _u32(np.arange(sp.n) * sp.index_bits)[None, :, None]
    positions = mx.bitwise_and(mx.right_shift(fields[:, None, :], shifts),
                               _u32((1 << sp.index_bits) - 1))  # [B, n, N]
    slots = _u32(np.arange(sp.m))[None, None, :, None]  # [1, 1, m, 1]
    p = positions[:, :, None, :]  # [B, n, 1, N]
    source = mx.minimum(mx.sum((p < slots).astype(mx.int32), axis=1), sp.n - 1)  # [B, m, N]
    keep = mx.any(p == slots, axis=1)  # [B, m, N]
    chunks = stored.reshape(blocks, sp.n, sp.chunk, n_cols)
    index = mx.broadcast_to(source[:, :, None, :], (blocks, sp.m, sp.chunk, n_cols))
    dense = mx.take_along_axis(chunks, index, axis=1).reshape(k, n_cols)
    keep = mx.broadcast_to(keep[:, :, None, :], (blocks, sp.m, sp.chunk, n_cols)).reshape(k, n_cols)
    return dense, keep


def dequantize_mx(fmt: Format, shape: tuple[int, int], arrays: Mapping[str, mx.array]) -> mx.array:
    """[K, N] float32 weights from packed MLX arrays (named as `fmt.buffers(K, N)` lists them).

    value = (table[code] - zero) * scale with the scale and zero point of group k // G, and
    0.0 at positions an N:M format does not store; the MLX-op form of `marlin_dsl.dequantize`
    (see the module docstring for how exactly the two agree). Block patterns only say where
    a kernel may skip work, so, as in the reference, they do not enter the values.
    """
    k, n = (int(d) for d in shape)
    check_mx_arrays(fmt, (k, n), arrays)
    codes = unpack_bits_mx(arrays["qweight"], fmt.element.bits, fmt.packing.word_bits)
    keep = None
    sp = fmt.sparsity
    if isinstance(sp, NMSparsity):
        codes, keep = _nm_scatter(fmt, sp, codes, arrays["meta"], k)
    else:
        assert sp is None or isinstance(sp, BlockPatternSparsity)
    table = mx.array(fmt.element.table().astype(np.float32))
    g = fmt.group_size_for(k)
    values = mx.take(table, codes).reshape(k // g, g, n)
    params = {name: parameter_mx(storage, arrays[name])[:, None, :]
              for name, storage in fmt.parameters().items()}
    a = fmt.scaling.affine(params)
    if a.zero is not None:
        values = values - a.zero.astype(mx.float32)
    if a.bias is not None and a.bias.dtype == a.scale.dtype:
        t = a.scale.dtype  # MLX's affine arithmetic: each step rounded to T
        values = ((values.astype(t) * a.scale) + a.bias).astype(mx.float32)
    else:
        values = values * a.scale.astype(mx.float32)
        if a.bias is not None:
            values = values + a.bias.astype(mx.float32)
    values = values.reshape(k, n)
    if keep is not None:
        values = mx.where(keep, values, mx.array(0.0, dtype=mx.float32))
    return values


def parameter_mx(storage: StorageType, stored: mx.array) -> mx.array:
    """A per-group parameter array as MLX floats: plain float types as they are, 8-bit codes
    (E8M0, E4M3) through their float32 value table (NaN where a code is invalid), integers
    (u8 zero points and two-level sub-scales) as float32. Not as they are: MLX promotes
    uint8 times float16 (or bfloat16) to the 16-bit type, so a u8 sub-scale times an f16
    column scale would be rounded to f16 (and overflow past 65504) where the reference and
    the kernels form the product exactly, in f32 (8 + 11 significant bits fit its 24)."""
    if storage.table is None:
        return stored.astype(mx.float32) if storage.mlx_dtype.startswith(("uint", "int")) else stored
    return mx.take(mx.array(storage.table.astype(np.float32)), stored.astype(mx.uint32))


def packed_to_mx(arrays: Mapping[str, object], fmt: Format | None = None) -> dict[str, mx.array]:
    """numpy (or MLX) packed arrays -> MLX arrays (a copy for numpy input). Dtypes are kept,
    except that bf16 parameters, which numpy holds as uint16 bits, become bfloat16 (`fmt`
    says which those are; without it uint16 stays uint16)."""
    bf16 = {n for n, t in fmt.parameters().items() if t.name == "bf16"} if fmt else set()
    out = {}
    for name, a in arrays.items():
        if not isinstance(a, mx.array):
            a = mx.array(np.ascontiguousarray(a))
            if name in bf16 and a.dtype == mx.uint16:
                a = a.view(mx.bfloat16)
        out[name] = a
    return out


def packed_to_numpy(arrays: Mapping[str, mx.array]) -> dict[str, np.ndarray]:
    """MLX packed arrays -> numpy (a copy), bfloat16 as its uint16 bits: `packed_to_mx`'s
    inverse, in the representation `marlin_dsl.pack` and `validate` use."""
    return {name: np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)
            for name, a in arrays.items()}
