"""IR types: scalars, short vectors and warp-level MMA fragments."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

SCALAR_NAMES = ("bool", "u8", "u16", "u32", "i32", "f16", "bf16", "f32")

#: numpy dtype used to *hold* each scalar type in the interpreter (bf16 is held in float32
#: and rounded to bf16 precision by every op that produces one).
HOLDING_DTYPE = {
    "bool": np.dtype(bool), "u8": np.dtype(np.uint8), "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32), "i32": np.dtype(np.int32), "f16": np.dtype(np.float16),
    "bf16": np.dtype(np.float32), "f32": np.dtype(np.float32),
}


class Type:
    """Base of IR types; every type prints as text that `parse_type` reads back."""


@dataclass(frozen=True)
class ScalarType(Type):
    name: str

    def __post_init__(self) -> None:
        if self.name not in SCALAR_NAMES:
            raise ValueError(f"unknown scalar type {self.name!r}; known: {SCALAR_NAMES}")

    def __str__(self) -> str:
        return self.name

    @property
    def is_float(self) -> bool:
        return self.name in ("f16", "bf16", "f32")

    @property
    def is_int(self) -> bool:
        return self.name in ("u8", "u16", "u32", "i32")

    @property
    def bits(self) -> int:
        return {"bool": 1, "u8": 8, "u16": 16, "u32": 32, "i32": 32, "f16": 16, "bf16": 16, "f32": 32}[self.name]

    @property
    def holding_dtype(self) -> np.dtype:
        return HOLDING_DTYPE[self.name]


@dataclass(frozen=True)
class VectorType(Type):
    elem: ScalarType
    size: int

    def __str__(self) -> str:
        return f"vec<{self.elem}, {self.size}>"


@dataclass(frozen=True)
class FragmentType(Type):
    """A warp-collective matrix tile: `role` a (rows x k), b (k x cols) or c (accumulator)."""

    role: str
    elem: ScalarType
    rows: int
    cols: int

    def __post_init__(self) -> None:
        if self.role not in ("a", "b", "c"):
            raise ValueError(f"fragment role must be a, b or c, got {self.role!r}")

    def __str__(self) -> str:
        return f"frag<{self.role}, {self.elem}, {self.rows}x{self.cols}>"


BOOL, U8, U16, U32, I32 = (ScalarType(n) for n in ("bool", "u8", "u16", "u32", "i32"))
F16, BF16, F32 = ScalarType("f16"), ScalarType("bf16"), ScalarType("f32")

_VEC = re.compile(r"^vec<\s*(\w+)\s*,\s*(\d+)\s*>$")
_FRAG = re.compile(r"^frag<\s*([abc])\s*,\s*(\w+)\s*,\s*(\d+)x(\d+)\s*>$")


def parse_type(text: str) -> Type:
    """Inverse of str(type)."""
    text = text.strip()
    if text in SCALAR_NAMES:
        return ScalarType(text)
    if m := _VEC.match(text):
        return VectorType(ScalarType(m.group(1)), int(m.group(2)))
    if m := _FRAG.match(text):
        return FragmentType(m.group(1), ScalarType(m.group(2)), int(m.group(3)), int(m.group(4)))
    raise ValueError(f"unknown type {text!r}")
