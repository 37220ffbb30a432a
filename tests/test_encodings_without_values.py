"""An encoding with no finite non-zero value (every code 0, -0 or NaN) cannot represent any
weight: it is refused where it is declared, with a located FormatError, not deep in
quantisation with numpy's "zero-size array" ValueError (found by tests/test_fuzz.py)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import marlin_dsl as md
from marlin_dsl.checks.format_check import verify_format
from marlin_dsl.errors import FormatError, MarlinDSLError
from marlin_dsl.formats.text import formats_from_text
from marlin_dsl.spec import load_spec

MESSAGE = r"FloatEncoding: float S1E1M0 bias 0 FN \(NaN code\) has no finite non-zero value"


def test_the_fuzz_declaration_is_refused_at_its_spec_line(tmp_path) -> None:
    spec = tmp_path / "spec_nan.py"
    spec.write_text("from marlin_dsl import FloatEncoding, Format, GroupScale\n"
                    "\n"
                    "f0 = Format('f0', FloatEncoding(bits=2, exp_bits=1, man_bits=0, bias=0, specials='fn'), "
                    "GroupScale(32, dtype='f16'))\n")
    with pytest.raises(FormatError, match=MESSAGE) as err:
        load_spec(spec)
    assert err.value.location is not None
    assert (err.value.location.file, err.value.location.line) == (str(spec), 3)


def test_the_text_form_names_the_element_line() -> None:
    text = ("format f0 {\n"
            "  element float(bits=2, exp_bits=1, man_bits=0, bias=0, specials=fn)\n"
            "}\n")
    with pytest.raises(FormatError, match=MESSAGE) as err:
        formats_from_text(text, "f0.fmt")
    assert (err.value.location.file, err.value.location.line) == ("f0.fmt", 2)


def test_unsigned_too() -> None:
    with pytest.raises(FormatError, match=r"float S0E1M0 bias 0 FN \(NaN code\) has no finite non-zero value"):
        md.FloatEncoding(bits=1, exp_bits=1, man_bits=0, bias=0, signed=False, specials="fn")


def _small_encodings():
    """Every FloatEncoding of up to 4 bits (biases 0..2), every IntEncoding of 1-2 bits, and
    degenerate tables (one non-zero value, all negative, all equal)."""
    for bits, signed, specials in itertools.product(range(1, 5), (True, False), ("none", "fn", "ieee")):
        for exp in range(1, bits + 1):
            man = bits - exp - int(signed)
            for bias in range(3):
                try:
                    yield md.FloatEncoding(bits=bits, exp_bits=exp, man_bits=man, bias=bias,
                                           signed=signed, specials=specials)
                except FormatError:
                    pass
    for bits in (1, 2):
        for offset in range(2 ** bits):
            yield md.IntEncoding(bits, offset=offset)
    for values in ((0.0, 0.0, 0.0, 1.5), (-1.0, -2.0, 0.0, -0.5), (1.0, 1.0, 1.0, 1.0), (-3.0,) * 4):
        yield md.TableEncoding(2, values)


@pytest.mark.parametrize("dtype", ["f16", "e8m0", "e4m3"])
def test_no_declarable_small_encoding_reaches_a_numpy_error(dtype: str) -> None:
    """Every encoding that constructs either verifies or fails with one of our errors."""
    rng = np.random.default_rng(0)
    for i, enc in enumerate(_small_encodings()):
        for extra in ({}, {"bias": md.GroupBias("f16")}):
            try:
                fmt = md.Format(f"e{i}", enc, md.GroupScale(32, dtype), **extra)
            except FormatError:
                continue
            try:
                verify_format(fmt, rng)
            except MarlinDSLError:
                pass
