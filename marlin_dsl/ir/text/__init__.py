"""Textual form of the kernel IR: a canonical printer and a parser for `grammar/ir.lark`.

    kernel @gemm {
      attrs {schedule=db64, tile_m=64}
      threads 128
      warp_size 32
      grid [ceil(N, 64), ceil(M, 64) * 2, 1]
      scalar @M
      buffer @x : f16 read
      body {
        %tid0 = index[kind=tid]() : u32
        %ld0 = load[buffer=@x](%tid0) : f16
        ...
      }
    }

Printing is canonical so that kernels can be diffed and stored as golden files: header lines
in a fixed order (attrs, threads, warp_size, grid, scalars, buffers, shared, tables, body),
attributes in sorted key order, two-space indentation, floats as `repr(float)` (which reads
back exactly, `inf`/`nan` included), strings bare when they read back as an identifier and
quoted (JSON) otherwise, tuples as `[..]`, and `@name` for the `buffer`/`name` attributes.
print -> parse -> print is the identity and parse(print(k)) is structurally equal to k
(`kernels_equal`).

Parsing resolves `%name` uses to `Value`s with the IR's scoping rule (a use sees definitions
earlier in its block or an enclosing block, and the arguments of its regions) and runs the
verifier; errors are `IRParseError`s (`VerifyError`s for well-formed but invalid IR) that
carry the source and line.
"""
from .compare import assert_round_trip, kernel_difference, kernels_equal
from .parser import IRParseError, parse_kernel, parse_kernels
from .printer import attr_value_text, print_kernel, print_kernels

__all__ = ["IRParseError", "assert_round_trip", "attr_value_text", "kernel_difference", "kernels_equal",
           "parse_kernel", "parse_kernels", "print_kernel", "print_kernels"]
