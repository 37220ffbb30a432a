"""The ecosystem's checkpoint formats, declared with the storage vocabulary (records.py,
words.py, layout.py): GGUF's block types (llama.cpp's ggml-common.h block structs and
gguf-py's `quants.py`), GPTQ v1 / v2 (AutoGPTQ, GPTQModel), AWQ GEMM (AutoAWQ) and
bitsandbytes 4-bit. Each is plain data; examples/checkpoint_formats.py declares some of them
again in a spec file, and a test holds the two equal.
"""
from __future__ import annotations

from typing import Callable, Literal

import numpy as np

from ...errors import FormatError
from ...source import suspended_declarations
from ..encodings import IntEncoding, TableEncoding
from ..format import Format
from ..scaling import GroupBias, GroupScale, SuperBlockScale, ZeroPoint
from .layout import CheckpointFormat, GroupIndex, Packed, Plain, QuantizedScales, Records
from .records import Bits, Record, Scalar, plane, run
from .words import Words

# ----- GGUF ------------------------------------------------------------------------------------

#: 16 bytes of nibbles: byte j's low nibble is element j, its high nibble element 16 + j.
_NIBBLES_32 = (16, 2), (1, 0)
#: llama.cpp's 12 bytes of eight 6-bit scales and eight 6-bit mins (get_scale_min_k4), at `at`.
def _k_scales(at: int) -> tuple[Bits, Bits]:
    scales = Bits("scales", 8, (run(at, range(0, 4), 0, 6), run(at + 8, range(4, 8), 0, 4),
                                run(at, range(4, 8), 6, 2, to=4)))
    mins = Bits("mins", 8, (run(at + 4, range(0, 4), 0, 6), run(at + 8, range(4, 8), 4, 4),
                            run(at + 4, range(4, 8), 6, 2, to=4)))
    return scales, mins


def _gguf_q4_0() -> CheckpointFormat:
    rec = Record(32, 18, (Scalar("d", "f16", 0), Bits("qs", 32, (plane(2, 16, 4, *_NIBBLES_32),))))
    fmt = Format("gguf_q4_0", IntEncoding(4, offset=8), GroupScale(32), doc="GGUF Q4_0: (q - 8) * d")
    return CheckpointFormat("gguf_q4_0", fmt, (Records("weight", rec, (("d", "scales"), ("qs", "codes"))),))


def _gguf_q4_1() -> CheckpointFormat:
    rec = Record(32, 20, (Scalar("d", "f16", 0), Scalar("m", "f16", 2),
                          Bits("qs", 32, (plane(4, 16, 4, *_NIBBLES_32),))))
    fmt = Format("gguf_q4_1", IntEncoding(4), GroupScale(32), bias=GroupBias("f16"), doc="GGUF Q4_1: q * d + m")
    return CheckpointFormat("gguf_q4_1", fmt,
                            (Records("weight", rec, (("d", "scales"), ("m", "biases"), ("qs", "codes"))),))


def _gguf_q5_0() -> CheckpointFormat:
    rec = Record(32, 22, (Scalar("d", "f16", 0),
                          Bits("q", 32, (plane(6, 16, 4, *_NIBBLES_32), plane(2, 4, 1, to=4)))))
    fmt = Format("gguf_q5_0", IntEncoding(5, offset=16), GroupScale(32), doc="GGUF Q5_0: (q - 16) * d")
    return CheckpointFormat("gguf_q5_0", fmt, (Records("weight", rec, (("d", "scales"), ("q", "codes"))),))


def _gguf_q5_1() -> CheckpointFormat:
    rec = Record(32, 24, (Scalar("d", "f16", 0), Scalar("m", "f16", 2),
                          Bits("q", 32, (plane(8, 16, 4, *_NIBBLES_32), plane(4, 4, 1, to=4)))))
    fmt = Format("gguf_q5_1", IntEncoding(5), GroupScale(32), bias=GroupBias("f16"), doc="GGUF Q5_1: q * d + m")
    return CheckpointFormat("gguf_q5_1", fmt,
                            (Records("weight", rec, (("d", "scales"), ("m", "biases"), ("q", "codes"))),))


def _gguf_q8_0() -> CheckpointFormat:
    rec = Record(32, 34, (Scalar("d", "f16", 0), Bits("qs", 32, (plane(2, 32, 8),), signed=True)))
    fmt = Format("gguf_q8_0", IntEncoding(8, offset=128), GroupScale(32), doc="GGUF Q8_0: int8 q * d")
    return CheckpointFormat("gguf_q8_0", fmt, (Records("weight", rec, (("d", "scales"), ("qs", "codes"))),))


_K_INTO = (("d", "super_scales"), ("dmin", "super_mins"), ("scales", "scales"), ("mins", "mins"), ("q", "codes"))


def _gguf_q4_k() -> CheckpointFormat:
    rec = Record(256, 144, (Scalar("d", "f16", 0), Scalar("dmin", "f16", 2), *_k_scales(4),
                            Bits("q", 256, (plane(16, 128, 4, (4, 32, 2), (0, 2, 1)),))))
    fmt = Format("gguf_q4_k", IntEncoding(4), SuperBlockScale(32, 256),
                 doc="GGUF Q4_K: q * (d * sc) - dmin * m, 6-bit sc and m per 32, f16 d and dmin per 256")
    return CheckpointFormat("gguf_q4_k", fmt, (Records("weight", rec, _K_INTO),))


def _gguf_q5_k() -> CheckpointFormat:
    rec = Record(256, 176, (Scalar("d", "f16", 0), Scalar("dmin", "f16", 2), *_k_scales(4),
                            Bits("q", 256, (plane(48, 128, 4, (4, 32, 2), (0, 2, 1)),
                                            plane(16, 32, 1, (32, 8), (1, 0), to=4)))))
    fmt = Format("gguf_q5_k", IntEncoding(5), SuperBlockScale(32, 256),
                 doc="GGUF Q5_K: q * (d * sc) - dmin * m, 6-bit sc and m per 32, f16 d and dmin per 256")
    return CheckpointFormat("gguf_q5_k", fmt, (Records("weight", rec, _K_INTO),))


def _gguf_q6_k() -> CheckpointFormat:
    rec = Record(256, 210, (Bits("q", 256, (plane(0, 128, 4, (2, 64, 2), (0, 2, 1)),
                                            plane(128, 64, 2, (2, 32, 4), (0, 2, 1), to=4))),
                            Bits("scales", 16, (plane(192, 16, 8),)), Scalar("d", "f16", 208)))
    fmt = Format("gguf_q6_k", IntEncoding(6, offset=32),
                 SuperBlockScale(16, 256, sub_dtype="i8", mins="none", sub_max=127),
                 doc="GGUF Q6_K: (q - 32) * (d * sc), int8 sc per 16, f16 d per 256")
    return CheckpointFormat("gguf_q6_k", fmt,
                            (Records("weight", rec, (("d", "super_scales"), ("scales", "scales"), ("q", "codes"))),))


#: GGUF's tensor types (gguf.GGMLQuantizationType names) -> their checkpoint formats.
GGUF_TYPES: dict[str, Callable[[], CheckpointFormat]] = {
    "Q4_0": _gguf_q4_0, "Q4_1": _gguf_q4_1, "Q5_0": _gguf_q5_0, "Q5_1": _gguf_q5_1, "Q8_0": _gguf_q8_0,
    "Q4_K": _gguf_q4_k, "Q5_K": _gguf_q5_k, "Q6_K": _gguf_q6_k,
}


def gguf_format(type_name: str) -> CheckpointFormat:
    """The checkpoint format of a GGUF tensor type ("Q4_K", ...)."""
    if type_name not in GGUF_TYPES:
        raise FormatError(f"GGUF tensor type {type_name!r} has no marlin-dsl format (known: "
                          f"{sorted(GGUF_TYPES)}, and F16 / BF16 / F32 as float weights)")
    with suspended_declarations():
        return GGUF_TYPES[type_name]()


# ----- GPTQ, AWQ -------------------------------------------------------------------------------

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _group(group_size: int) -> int | Literal["K"]:
    return "K" if group_size in (-1, 0) else group_size


def gptq(bits: int = 4, group_size: int = 128, version: Literal[1, 2] = 1) -> CheckpointFormat:
    """GPTQ (AutoGPTQ v1: zero points stored minus 1; GPTQModel's v2: as they are): qweight
    int32 [K*bits/32, N] along K, qzeros int32 [K/G, N*bits/32] along N, scales f16 [K/G, N],
    g_idx int32 [K] (act-order: any map with G rows a group). Symmetric and asymmetric
    checkpoints store the same tensors."""
    if bits not in (2, 4, 8) or version not in (1, 2):
        raise FormatError(f"gptq: bits must be 2, 4 or 8 and version 1 or 2, got bits={bits!r}, version={version!r}")
    offset = 1 if version == 1 else 0
    # A v1 zero point reaches 2**bits, beyond u8 for 8-bit codes: f16 holds it exactly.
    zero = "u8" if (1 << bits) - 1 + offset <= 255 else "f16"
    g = _group(group_size)
    tag = f"gptq_v{version}_{bits}bit_g{'K' if g == 'K' else g}"
    with suspended_declarations():
        fmt = Format(tag, IntEncoding(bits), GroupScale(g), ZeroPoint(zero), doc=f"GPTQ v{version}, {bits}-bit")
        return CheckpointFormat(tag, fmt, (
            Packed("qweight", "codes", Words(bits, "i32", "K")),
            Packed("qzeros", "zeros", Words(bits, "i32", "N", offset=offset)),
            Plain("scales", "scales"),
            GroupIndex("g_idx"),
        ))


def awq(bits: int = 4, group_size: int = 128) -> CheckpointFormat:
    """AWQ GEMM (AutoAWQ's WQLinear_GEMM): qweight int32 [K, N/8] and qzeros int32 [K/G, N/8]
    packed along N in AWQ_ORDER, scales f16 [K/G, N]; value = (q - z) * s."""
    if bits != 4:
        raise FormatError(f"awq: AutoAWQ's GEMM layout packs 4-bit codes, got bits={bits!r}")
    words = Words(4, "i32", "N", order=AWQ_ORDER)
    tag = f"awq_4bit_g{group_size}"
    with suspended_declarations():
        fmt = Format(tag, IntEncoding(4), GroupScale(group_size), ZeroPoint("u8"), doc="AWQ GEMM, 4-bit")
        return CheckpointFormat(tag, fmt, (Packed("qweight", "codes", words), Packed("qzeros", "zeros", words),
                                           Plain("scales", "scales")))


# ----- bitsandbytes ----------------------------------------------------------------------------

_NF4_DECIMALS = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                 -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                 0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)
#: bitsandbytes' FP4 (get_4bit_type "fp4": 0, 0.0625, 8, 12, 4, 6, 2, 3 and their negatives,
#: divided by 12), as the float32 constants of its CUDA dequantisation.
_FP4_DECIMALS = (0.0, 0.005208333333, 0.6666666667, 1.0, 0.3333333333, 0.5, 0.1666666667, 0.25)
#: bitsandbytes' tables hold float32 values: the decimals rounded once to f32.
BNB_NF4 = tuple(float(v) for v in np.float32(_NF4_DECIMALS))
BNB_FP4 = tuple(float(v) for v in np.float32(_FP4_DECIMALS + tuple(-v for v in _FP4_DECIMALS)))


def bnb(quant_type: Literal["nf4", "fp4"] = "nf4", blocksize: int = 64,
        double_quant: bool = False) -> CheckpointFormat:
    """bitsandbytes 4-bit: `weight` the bytes of the flattened [N, K] codes (the first code
    of a byte in its high nibble), `absmax` f32 per `blocksize` codes of a row (K a multiple of
    the block); with double quantisation `absmax` is uint8 codes into `nested_quant_map`
    times `nested_absmax` per 256, plus `nested_offset`."""
    if quant_type not in ("nf4", "fp4"):
        raise FormatError(f"bnb: quant_type must be 'nf4' or 'fp4', got {quant_type!r}")
    table = BNB_NF4 if quant_type == "nf4" else BNB_FP4
    tag = f"bnb_{quant_type}_b{blocksize}" + ("_dq" if double_quant else "")
    scales: Plain | QuantizedScales = (
        QuantizedScales("scales", "absmax", "nested_quant_map", "nested_absmax", "nested_offset") if double_quant
        else Plain("absmax", "scales", transposed=True, flat=True))
    with suspended_declarations():
        fmt = Format(tag, TableEncoding(4, table), GroupScale(blocksize, "f32", zero="allowed"),
                     doc=f"bitsandbytes {quant_type}, block {blocksize}" + (", double quantised" if double_quant else ""))
        return CheckpointFormat(tag, fmt, (
            Packed("weight", "codes", Words(4, "u8", "K", order=(1, 0), transposed=True, flat=True)), scales))


__all__ = ["AWQ_ORDER", "BNB_FP4", "BNB_NF4", "GGUF_TYPES", "awq", "bnb", "gguf_format", "gptq"]
