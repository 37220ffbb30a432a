"""The in-kernel decode of one format, derived from its description.

A *decode unit* is one column's slice of `fmt.k_granule` dense K positions: the packed value
words, metadata words or pattern bytes and the one set of scale parameters that covers it. The
emitters below read only the format's data (encoding fields, bit widths, sparsity shape), so
a new format needs no edit here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import CompileError
from ..formats import BlockPatternSparsity, FloatEncoding, Format, IntEncoding, NMSparsity, TableEncoding
from ..ir import F16, F32, U16, U32, Builder, ConstTable, ScalarType, Value
from ..layouts.bit_placement import FLOAT_FIELDS
from .group_params import GroupParams, GroupValues, parameter_tables

Store = Callable[[Value, Value], None]  # (dense offset within the unit, value) -> emits a store

#: (exponent bias, mantissa bits, width) of the float types values are decoded into.
_FLOAT_LAYOUT = FLOAT_FIELDS


@dataclass
class UnitInputs:
    """Where a decode unit's data lives: value-word row, column, and the unit's dense K start."""

    word_row: Value  # first qweight row of the unit
    col: Value  # global column n
    dense_k: Value  # first dense K position of the unit
    pred: Value  # the unit exists (column < N and K position < K)


def encoding_tables(fmt: Format, prefix: str) -> list[ConstTable]:
    """Constant tables the decode needs: value tables (of the codes and of parameters stored
    as codes) and block-pattern (count, offsets)."""
    from ..formats import pattern_table

    tables = parameter_tables(fmt, prefix)
    if isinstance(fmt.element, TableEncoding):
        tables.append(ConstTable(f"{prefix}values", F32, tuple(float(v) for v in fmt.element.table())))
    if isinstance(fmt.sparsity, BlockPatternSparsity):
        counts, offsets = pattern_table(fmt.sparsity.block_k)
        tables.append(ConstTable(f"{prefix}pattern_count", U32, tuple(int(c) for c in counts)))
        tables.append(ConstTable(f"{prefix}pattern_offsets", U32, tuple(int(o) for o in offsets.ravel())))
    return tables


def float_code_bits(b: Builder, code: Value, enc: FloatEncoding, t_man: int, width: int) -> Value:
    """The bits of a float of `width` bits (t_man mantissa bits) holding the code's exponent
    and mantissa fields under its own and its sign at the top, still to be rescaled by
    2**(target_bias - bias). (Pairs of codes in the halves of a word: `pair_decode`.)"""
    magnitude_bits = enc.exp_bits + enc.man_bits
    magnitude = b.binary("and", code, (1 << magnitude_bits) - 1, hint="mag")
    bits = b.binary("shl", magnitude, t_man - enc.man_bits, hint="mag")
    if enc.signed:
        sign = b.binary("and", code, 1 << magnitude_bits, hint="sgn")
        sign = b.binary("shl", sign, width - 1 - magnitude_bits, hint="sgn")
        bits = b.binary("or", bits, sign, hint="mag")
    return bits


class UnitDecoder:
    """Emits the decode of one unit for a format into a Builder."""

    def __init__(self, b: Builder, fmt: Format, activation: ScalarType, prefix: str = "") -> None:
        self.b, self.fmt, self.act = b, fmt, activation
        self.params = GroupParams(b, fmt, activation, prefix)
        self.ctype = self.params.ctype
        self.prefix = prefix
        bits, word = fmt.element.bits, fmt.packing.word_bits
        if word != 32:
            raise CompileError(f"format {fmt.name!r}: kernels read 32-bit words, not {word}-bit",
                               fmt.location)
        self.bits = bits
        self.span = fmt.k_granule  # dense K positions per unit
        self.stored = fmt.stored_k(self.span)  # codes stored per unit
        self.value_words = self.stored * bits // 32
        sp = fmt.sparsity
        self.meta_words = (self.span // sp.block_k) * sp.meta_bits // 32 if isinstance(sp, NMSparsity) else 0

    # ----- bit fields --------------------------------------------------------------------

    def field(self, words: list[Value], index: int, bits: int) -> Value:
        """Field `index` of width `bits` from a bit stream held in `words` (LSB first)."""
        b = self.b
        word, shift = divmod(index * bits, 32)
        value = b.binary("shr", words[word], shift, hint="sh") if shift else words[word]
        if shift + bits > 32:  # the field straddles two words
            high = b.binary("shl", words[word + 1], 32 - shift, hint="sh")
            value = b.binary("or", value, high, hint="f")
        return b.binary("and", value, (1 << bits) - 1, hint="code") if shift + bits != 32 else value

    # ----- element decode and dequantisation ---------------------------------------------

    def decode(self, code: Value) -> Value:
        """code (u32) -> table[code] in the compute type, from the encoding's fields."""
        b, enc, ctype = self.b, self.fmt.element, self.ctype
        if isinstance(enc, FloatEncoding):
            return self._decode_float(code, enc)
        if isinstance(enc, IntEncoding):
            if ctype == F16 and enc.bits <= 10:
                # Magic number: 0x6400 | n is the f16 1024 + n; subtract 1024 + offset.
                bits16 = b.cast(b.binary("or", code, 0x6400, hint="mag"), U16, hint="mag")
                magic = b.bitcast(bits16, F16, hint="mag")
                return b.binary("sub", magic, b.const(1024.0 + enc.offset, F16), hint="t")
            value = b.cast(code, F32, hint="t")
            return b.binary("sub", value, b.const(float(enc.offset), F32), hint="t") if enc.offset else value
        if isinstance(enc, TableEncoding):
            return b.value("table", [code], F32, {"name": f"{self.prefix}values"}, hint="t")
        raise CompileError(f"format {self.fmt.name!r}: no in-kernel decode for {type(enc).__name__}",
                           self.fmt.location)

    def _decode_float(self, code: Value, enc: FloatEncoding) -> Value:
        """Place exponent and mantissa bits under the target float's, then rescale by
        2**(target_bias - bias): exact for normals and subnormals alike."""
        b, ctype = self.b, self.ctype
        t_bias, t_man, width = _FLOAT_LAYOUT[ctype.name]
        top = 5 if ctype == F16 else 8
        # At the target's own exponent width the all-ones exponent would decode as inf/NaN:
        # right only where the encoding says so too (specials="ieee").
        if enc.exp_bits > top or (enc.exp_bits == top and enc.specials != "ieee") or enc.man_bits > t_man:
            raise CompileError(f"format {self.fmt.name!r}: {enc.describe()} does not fit in {ctype}",
                               self.fmt.location)
        bits = float_code_bits(b, code, enc, t_man, width)
        holder = U16 if width == 16 else U32
        raw = b.bitcast(b.cast(bits, holder, hint="mag") if holder != U32 else bits, ctype, hint="raw")
        return b.binary("mul", raw, b.const(float(2.0 ** (t_bias - enc.bias)), ctype), hint="t")

    def dequant(self, code: Value, params: GroupValues) -> Value:
        """The scale scheme applied to table[code] (for a GroupScale (t - zero) * scale +
        bias), rounded to the activation type."""
        v = self.params.apply(self.decode(code), params)
        return v if self.ctype == self.act else self.b.cast(v, self.act, hint="w")

    # ----- one unit ------------------------------------------------------------------------

    def load_group_params(self, inp: UnitInputs, n_cols: Value) -> GroupValues:
        """The unit's scale parameters in the compute type (0 where it is absent)."""
        group = self.params.group_of(inp.dense_k)
        return self.params.load_at(group, inp.col, n_cols, inp.pred)

    def load_words(self, buffer: str, first_row: Value, count: int, n_cols: Value, col: Value,
                   pred: Value) -> list[Value]:
        b = self.b
        words = []
        for w in range(count):
            row = b.binary("add", first_row, w, hint="row") if w else first_row
            idx = b.binary("add", b.binary("mul", row, n_cols, hint="wi"), col, hint="wi")
            words.append(b.load(buffer, idx, U32, pred, hint="word"))
        return words

    def emit_unit(self, inp: UnitInputs, n_cols: Value, store: Store) -> None:
        """Decode one unit and call `store(offset, value)` for its dense positions."""
        params = self.load_group_params(inp, n_cols)
        sp = self.fmt.sparsity
        if isinstance(sp, BlockPatternSparsity):
            self._emit_block_pattern(inp, n_cols, params, store, sp)
            return
        words = self.load_words("qweight", inp.word_row, self.value_words, n_cols, inp.col, inp.pred)
        values = [self.dequant(self.field(words, i, self.bits), params) for i in range(self.stored)]
        if isinstance(sp, NMSparsity):
            self._scatter(inp, n_cols, values, store, sp)
        else:
            for i, v in enumerate(values):
                store(self.b.const(i), v)

    def _scatter(self, inp: UnitInputs, n_cols: Value, values: list[Value], store: Store,
                 sp: NMSparsity) -> None:
        """Seed 000 §5: decode each block's metadata and scatter its kept values into the
        dense positions, in registers (selects), before anything reaches memory."""
        b = self.b
        blocks = self.span // sp.block_k
        meta_row = b.binary("mul", b.binary("div", inp.dense_k, self.span, hint="mu"),
                            self.meta_words, hint="mrow")
        meta = self.load_words("meta", meta_row, self.meta_words, n_cols, inp.col, inp.pred)
        zero = b.const(0.0, self.act)
        for blk in range(blocks):
            field = self.field(meta, blk, sp.meta_bits)
            positions = []
            for i in range(sp.n):
                pos = b.binary("shr", field, i * sp.index_bits, hint="pos") if i else field
                positions.append(b.binary("and", pos, (1 << sp.index_bits) - 1, hint="pos"))
            for chunk_pos in range(sp.m):
                hits = [b.binary("eq", p, chunk_pos, hint="hit") for p in positions]
                for inner in range(sp.chunk):
                    value = zero
                    for i in reversed(range(sp.n)):
                        kept = values[(blk * sp.n + i) * sp.chunk + inner]
                        value = b.select(hits[i], kept, value, hint="sc")
                    store(b.const(blk * sp.block_k + chunk_pos * sp.chunk + inner), value)

    def _emit_block_pattern(self, inp: UnitInputs, n_cols: Value, params: GroupValues,
                            store: Store, sp: BlockPatternSparsity) -> None:
        """Seed 003: per pattern block, look up (count, offsets); zero-fill, then decode only
        the `count` listed positions. The loop is marked for the specialise pass, which
        dispatches on count into unrolled copies."""
        b = self.b
        if 32 % self.bits:
            raise CompileError(f"format {self.fmt.name!r}: block patterns need a code width "
                               "dividing 32", self.fmt.location)
        per_word = 32 // self.bits
        zero_value = b.const(0.0, self.act)
        for off in range(self.span):
            store(b.const(off), zero_value)
        n_blocks_cols = b.binary("div", b.binary("add", n_cols, sp.block_n - 1, hint="nb"),
                                 sp.block_n, hint="nb")
        pcol = b.binary("div", inp.col, sp.block_n, hint="pc")
        patterns, counts = [], []
        for blk in range(self.span // sp.block_k):
            prow = b.binary("add", b.binary("div", inp.dense_k, sp.block_k, hint="pr"), blk, hint="pr")
            pidx = b.binary("add", b.binary("mul", prow, n_blocks_cols, hint="pi"), pcol, hint="pi")
            pattern = b.cast(b.load("patterns", pidx, ScalarType("u8"), inp.pred, hint="pat"), U32, hint="pat")
            patterns.append(pattern)
            counts.append(b.value("table", [pattern], U32, {"name": f"{self.prefix}pattern_count"}, hint="cnt"))
        # Skip the weight words entirely when every pattern of the unit is empty.
        any_set = patterns[0]
        for pattern in patterns[1:]:
            any_set = b.binary("or", any_set, pattern, hint="any")
        needed = b.binary("and", inp.pred, b.binary("ne", any_set, 0, hint="any"), hint="need")
        words = self.load_words("qweight", inp.word_row, self.value_words, n_cols, inp.col, needed)
        for blk, (pattern, count) in enumerate(zip(patterns, counts)):
            base = b.binary("mul", pattern, sp.block_k, hint="pb")
            first_field = blk * sp.block_k
            iv = b.fresh("i", U32)
            loop = b.op("for", [b.const(0), count, b.const(1)], [], {"specialise": sp.block_k})
            with b.region([iv]) as body:
                loop.regions.append(body)
                off = b.value("table", [b.binary("add", base, iv, hint="oi")], U32,
                              {"name": f"{self.prefix}pattern_offsets"}, hint="off")
                field_index = b.binary("add", off, first_field, hint="fi") if first_field else off
                word = self._dynamic_word(words, field_index, per_word)
                shift = b.binary("mul", b.binary("rem", field_index, per_word, hint="fs"), self.bits, hint="fs")
                code = b.binary("and", b.binary("shr", word, shift, hint="sh"), (1 << self.bits) - 1, hint="code")
                store(field_index, self.dequant(code, params))
                b.yield_()

    def _dynamic_word(self, words: list[Value], field_index: Value, per_word: int) -> Value:
        b = self.b
        if len(words) == 1:
            return words[0]
        which = b.binary("div", field_index, per_word, hint="wsel")
        chosen = words[-1]
        for w in reversed(range(len(words) - 1)):
            chosen = b.select(b.binary("eq", which, w, hint="wsel"), words[w], chosen, hint="wsel")
        return chosen


