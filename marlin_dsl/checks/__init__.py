"""Checks on random data: a format's self-checks (`format_check`: pack, unpack, validate and
dequantise agree) and a compiled kernel against the float64 reference (`kernel_check`).

The face imports nothing: the two checks sit at different stages (a format's self-check below
the schedules, the kernel check above the compiler), and importing one must not load the other.
"""
