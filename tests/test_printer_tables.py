"""The printers are tables from op to emitter (targets/c_printer.py holds the shared C-family
entries); a target's legal ops are its table's keys, and `verify_legal` refuses any other op,
naming it, where it is and the target, before a line is printed."""
from __future__ import annotations

import pytest

from marlin_dsl.targets.cuda import printer as cuda
from marlin_dsl.targets.metal import printer as metal
from marlin_dsl.targets.c_printer import CPrinter
from marlin_dsl.errors import CompileError
from marlin_dsl.ir.ops import OPS
from marlin_dsl.ir.text import parse_kernel
from marlin_dsl.ir.verify import verify_legal

#: Ops a target deliberately cannot print (everything else in OPS it must).
ILLEGAL = {
    "metal": {"async_copy", "async_commit", "async_wait", "mma_sp",
              # warp shuffles: only CUDA's 2:4 activation loads use them (Metal's 2:4 scatters)
              "shfl_xor",
              # the warpgroup MMA (sm_90a)
              "wgmma", "wgmma_fence", "wgmma_commit", "wgmma_wait",
              # warp specialisation (mbarriers: sm_90's split-phase barriers)
              "warp_roles", "mbarrier_init", "mbarrier_arrive", "mbarrier_wait"},
    "cuda": set(),
}
PRINTERS = {"metal": metal._Printer, "cuda": cuda._Printer}


@pytest.mark.parametrize("target", sorted(PRINTERS))
def test_every_op_is_printable_or_listed_illegal(target: str) -> None:
    table = PRINTERS[target].EMITTERS
    assert set(table) <= set(OPS), f"{target} prints ops the IR does not have: {set(table) - set(OPS)}"
    assert not set(table) & ILLEGAL[target]
    assert set(table) | ILLEGAL[target] == set(OPS), \
        f"{target}: neither printable nor listed illegal: {set(OPS) - set(table) - ILLEGAL[target]}"
    for op_name, emitter in table.items():
        assert callable(emitter), (target, op_name)


def test_shared_entries_come_from_the_base_table() -> None:
    for printer in PRINTERS.values():
        for op_name, emitter in CPrinter.EMITTERS.items():
            assert printer.EMITTERS[op_name] is emitter, op_name


# A loop whose body starts an asynchronous copy: CUDA prints it, Metal has no such op.
_ASYNC = """kernel @k {
  attrs {target=metal}
  threads 32
  warp_size 32
  grid [1, 1, 1]
  buffer @x : f16 read
  buffer @y : f16 write
  shared @s : f16[64]
  body {
    %c0 = const[value=0]() : u32
    %c1 = const[value=1]() : u32
    %c2 = const[value=2]() : u32
    for(%c0, %c2, %c1) {
    ^(%i: u32):
      async_copy[dst="s", size=2, src="x"](%c0, %i)
      yield()
    }
    %v = load[buffer="s"](%c0) : f16
    store[buffer="y"](%c0, %v)
  }
}
"""


def test_metal_refuses_an_illegal_op_before_printing(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = parse_kernel(_ASYNC, check=False)

    def no_printing(*args: object, **kwargs: object) -> None:
        raise AssertionError("the printer started on a kernel with an illegal op")

    monkeypatch.setattr(metal._Printer, "__init__", no_printing)
    with pytest.raises(CompileError) as e:
        metal.print_metal(kernel)
    message = str(e.value)
    assert "async_copy" in message and "metal" in message and "kernel k" in message
    assert "op 3, region 0, op 0" in message  # the loop is the body's fourth op


def test_verify_legal_names_the_op_and_its_result() -> None:
    kernel = parse_kernel(_ASYNC, check=False)
    with pytest.raises(CompileError, match=r"op 4 \(load -> %v\): op load is not legal on toy"):
        verify_legal(kernel, {"const", "for", "async_copy", "yield"}, "toy")
    verify_legal(kernel, set(cuda._Printer.EMITTERS), "cuda")  # all legal on CUDA
