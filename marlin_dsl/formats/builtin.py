"""The built-in formats. Each is plain data: a new format needs no code beside its description."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Literal

from .encodings import FloatEncoding, IntEncoding, TableEncoding
from .format import Format
from .scaling import GroupScale, ZeroPoint
from .sparsity import BlockPatternSparsity, NMSparsity
from ..source import record_declaration, suspended_declarations

GroupSize = int | Literal["K"]

#: FP4 E2M1, bias 1, sign bit 3 (seed 002): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
#: OCP MX FP4 convention: every code is a number (specials="none": no NaN, no infinity).
E2M1 = FloatEncoding(bits=4, exp_bits=2, man_bits=1, bias=1)
#: Unsigned INT4 (0..15), used with zero points.
UINT4 = IntEncoding(bits=4)
#: Signed INT4 as offset binary: stored = actual + 8 (seed 002).
INT4 = IntEncoding(bits=4, offset=8)
#: NormalFloat4 (QLoRA): quantiles of a standard normal, normalised to [-1, 1].
NF4 = TableEncoding(bits=4, values=(
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
))


def fp4(group_size: GroupSize = 128) -> Format:
    return Format("fp4", E2M1, GroupScale(group_size),
                  doc="dense FP4 E2M1 with fp16 group scales")


def int4(group_size: GroupSize = 128) -> Format:
    return Format("int4", INT4, GroupScale(group_size),
                  doc="dense signed INT4 (offset binary) with fp16 group scales")


def uint4_zp(group_size: GroupSize = 128) -> Format:
    return Format("uint4_zp", UINT4, GroupScale(group_size), ZeroPoint("u8"),
                  doc="dense unsigned INT4 with per-group scales and integer zero points")


def nf4(group_size: GroupSize = 64) -> Format:
    return Format("nf4", NF4, GroupScale(group_size),
                  doc="dense NF4 (value table) with fp16 group scales")


def fp4_2of4(group_size: GroupSize = 128) -> Format:
    return Format("fp4_2of4", E2M1, GroupScale(group_size), sparsity=NMSparsity(2, 4),
                  doc="2:4 structured sparse FP4 (seed 000 layout)")


def int4_2of4(group_size: GroupSize = 128) -> Format:
    return Format("int4_2of4", INT4, GroupScale(group_size), sparsity=NMSparsity(2, 4),
                  doc="2:4 structured sparse signed INT4")


def fp4_blockpattern(group_size: GroupSize = 128) -> Format:
    return Format("fp4_blockpattern", E2M1, GroupScale(group_size),
                  sparsity=BlockPatternSparsity(block_k=8, block_n=32),
                  doc="FP4 with seed 003 block patterns (8 K x 32 columns) for clustered zeros")


BUILTIN_FORMATS: dict[str, Callable[..., Format]] = {
    f.__name__: f for f in (fp4, int4, uint4_zp, nf4, fp4_2of4, int4_2of4, fp4_blockpattern)
}


def builtin_format(name: str, group_size: GroupSize | None = None) -> Format:
    """A built-in format by name, optionally with another group size."""
    if name not in BUILTIN_FORMATS:
        raise KeyError(f"unknown format {name!r}; built-in formats: {sorted(BUILTIN_FORMATS)}")
    factory = BUILTIN_FORMATS[name]
    with suspended_declarations():  # only the format handed back is a spec's declaration
        fmt = factory() if group_size is None else factory(group_size)
        if group_size is not None and group_size != factory().scale.group_size:
            # Another group size is another format: its own name (fp4_g64), so that one spec
            # or model can hold both without a clash of names.
            fmt = replace(fmt, name=f"{name}_g{group_size}")
    record_declaration(fmt)
    return fmt
