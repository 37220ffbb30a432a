"""Op traits are declared once, in the op table (ir/ops.py), and the passes read them there:
commutativity (fold, cse) and the pipe class of the interleave pass's latency model."""
from __future__ import annotations

from pathlib import Path

from marlin_dsl.ir.ops import OPS

PASSES = Path(__file__).resolve().parent.parent / "marlin_dsl" / "passes"


def test_commutative_ops() -> None:
    assert {n for n, d in OPS.items() if d.commutative} == {"add", "mul", "min", "max", "and", "or",
                                                           "xor", "eq", "ne"}


def test_pipe_classes() -> None:
    alu = {n for n, d in OPS.items() if d.pipe == "alu"}
    assert {"add", "sub", "fma", "select", "cast", "lt", "shr"} <= alu
    assert not alu & {"load", "store", "mma", "table", "const", "bitcast"}
    assert OPS["table"].pipe == "memory"


def test_passes_keep_no_op_name_lists_of_their_own() -> None:
    for name in ("fold.py", "cse.py", "interleave.py"):
        text = (PASSES / name).read_text()
        assert "COMMUTATIVE" not in text and "_ALU" not in text, name


def test_pure_and_evaluate_traits() -> None:
    pure = {n for n, d in OPS.items() if d.pure}
    assert {"add", "const", "index", "scalar", "cast", "select", "table", "mma", "frag_zero"} <= pure
    assert not pure & {"load", "store", "barrier", "fence", "for", "if", "switch", "yield", "async_copy"}
    evaluated = {n for n, d in OPS.items() if d.evaluate is not None}
    assert {"add", "div", "shl", "fma", "lt", "select", "cast", "bitcast", "table"} <= evaluated <= pure
    assert OPS["const"].pipe == "free" and OPS["bitcast"].pipe == "int"
    assert {n for n, d in OPS.items() if d.operand_typed} == {"lt", "le", "gt", "ge", "eq", "ne"}


def test_fold_and_interleave_read_the_table_not_op_names() -> None:
    fold = (PASSES / "fold.py").read_text()
    assert '("index", "scalar")' not in fold and "Fraction" not in fold  # evaluate decides
    interleave = (PASSES / "interleave.py").read_text()
    for name in ('"const"', '"bitcast"', '"lt"'):
        assert name not in interleave, name
