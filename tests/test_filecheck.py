"""The FileCheck of the IR tests (tests/filecheck.py) passes what it should and, above all, fails
what it should: a test harness that cannot fail checks nothing."""
from __future__ import annotations

import pytest

from filecheck import FileCheckError, compile_pattern, filecheck, parse_directives

OUT = """\
kernel @a {
  body {
    %c0 = const[value=5]() : u32
    %t0 = mul(%c0, %tid0) : u32
    store[buffer=@y](%tid0, %t0)
  }
}

kernel @b {
  body {
    %s0 = add(%x0, %x1) : f32
  }
}
"""


def checks(*lines: str) -> str:
    return "\n".join(f"// {line}" for line in lines)


# ----- what passes --------------------------------------------------------------------------------

def test_checks_in_order_pass():
    filecheck(OUT, checks("CHECK: kernel @a", "CHECK: const[value=5]", "CHECK: store", "CHECK: kernel @b"))


def test_next_same_and_empty_pass():
    filecheck(OUT, checks("CHECK: %c0 = const", "CHECK-SAME: : u32", "CHECK-NEXT: mul(",
                          "CHECK-NEXT: store", "CHECK: }", "CHECK-NEXT: }", "CHECK-EMPTY:", "CHECK-NEXT: kernel @b"))


def test_not_between_matches_passes():
    filecheck(OUT, checks("CHECK: kernel @a", "CHECK-NOT: add(", "CHECK: store", "CHECK: add("))


def test_variables_bind_and_are_reused():
    filecheck(OUT, checks("CHECK: [[C:%[a-z0-9]+]] = const[value=5]", "CHECK-NEXT: [[T:%t[0-9]+]] = mul([[C]],",
                          "CHECK-NEXT: store[buffer=@y](%tid0, [[T]])"))


def test_regex_blocks_and_blank_runs():
    filecheck(OUT, checks("CHECK: const[value={{[0-9]+}}]()   :  u32"))


def test_labels_cut_regions():
    filecheck(OUT, checks("CHECK-LABEL: kernel @a", "CHECK-NOT: add(", "CHECK-LABEL: kernel @b", "CHECK: add("))


def test_other_prefixes_are_separate():
    text = checks("FOLD: const[value=5]", "CHECK: kernel @b")
    filecheck(OUT, text, "FOLD")
    filecheck(OUT, text)
    assert [d.kind for d in parse_directives(checks("CHECK: a", "CHECK-NEXT: b", "NOTCHECK: c"))] == ["CHECK", "NEXT"]


# ----- what fails ---------------------------------------------------------------------------------

def test_an_absent_check_fails():
    with pytest.raises(FileCheckError, match=r"check line 2: CHECK: 'const\[value=6\]': not found"):
        filecheck(OUT, checks("CHECK: kernel @a", "CHECK: const[value=6]"))


def test_checks_out_of_order_fail():
    with pytest.raises(FileCheckError, match="not found"):
        filecheck(OUT, checks("CHECK: store", "CHECK: const[value=5]"))


def test_a_next_that_is_not_on_the_next_line_fails():
    with pytest.raises(FileCheckError, match=r"CHECK-NEXT: 'store': not found on the line after the previous "
                                             r"match: .*mul.*\(it occurs later, on output line 5\)"):
        filecheck(OUT, checks("CHECK: const[value=5]", "CHECK-NEXT: store"))


def test_a_same_on_another_line_fails():
    with pytest.raises(FileCheckError, match="CHECK-SAME: 'mul': not found on the same line"):
        filecheck(OUT, checks("CHECK: const[value=5]", "CHECK-SAME: mul"))


def test_a_not_that_appears_fails():
    with pytest.raises(FileCheckError, match=r"CHECK-NOT: 'mul\(': found on output line 4"):
        filecheck(OUT, checks("CHECK: const", "CHECK-NOT: mul(", "CHECK: store"))


def test_a_trailing_not_covers_the_rest():
    with pytest.raises(FileCheckError, match="CHECK-NOT: 'add': found on output line 11"):
        filecheck(OUT, checks("CHECK: kernel @a", "CHECK-NOT: add"))


def test_a_not_covers_exactly_the_text_between_its_neighbours():
    # store's line: `store[buffer=@y](%tid0, %t0)`; the NOT range is `[buffer=@y](%tid0, `
    filecheck(OUT, checks("CHECK: store", "CHECK-NOT: %t0", "CHECK: %t0)"))
    with pytest.raises(FileCheckError, match="CHECK-NOT: '%tid0': found on output line 5"):
        filecheck(OUT, checks("CHECK: store", "CHECK-NOT: %tid0", "CHECK: %t0)"))


def test_a_not_does_not_leak_across_a_label():
    filecheck(OUT, checks("CHECK-LABEL: kernel @a", "CHECK-NOT: add", "CHECK-LABEL: kernel @b"))
    with pytest.raises(FileCheckError, match="CHECK-NOT: 'add': found"):
        filecheck(OUT, checks("CHECK-LABEL: kernel @b", "CHECK-NOT: add"))


def test_a_check_cannot_match_past_its_label_region():
    with pytest.raises(FileCheckError, match="'add\\(': not found"):
        filecheck(OUT, checks("CHECK-LABEL: kernel @a", "CHECK: add(", "CHECK-LABEL: kernel @b"))


def test_a_missing_label_fails():
    with pytest.raises(FileCheckError, match="label not found"):
        filecheck(OUT, checks("CHECK-LABEL: kernel @c"))


def test_a_variable_must_match_its_binding():
    with pytest.raises(FileCheckError, match="not found on the line after"):
        filecheck(OUT, checks("CHECK: [[C:%[a-z0-9]+]] = const", "CHECK-NEXT: mul(%tid0, [[C]])"))
    with pytest.raises(FileCheckError, match=r"\[\[X\]\] is used before it is defined"):
        compile_pattern("add([[X]])", {})


def test_a_non_empty_line_fails_check_empty():
    with pytest.raises(FileCheckError, match="is not empty"):
        filecheck(OUT, checks("CHECK: store", "CHECK-EMPTY:"))


def test_malformed_directives_fail():
    with pytest.raises(FileCheckError, match="no CHECK: directives"):
        filecheck(OUT, "// RUN: print")
    with pytest.raises(FileCheckError, match="unknown directive CHECK-NEXTT"):
        filecheck(OUT, checks("CHECK-NEXTT: a"))
    with pytest.raises(FileCheckError, match="empty pattern"):
        filecheck(OUT, checks("CHECK:   "))
    with pytest.raises(FileCheckError, match="cannot be NEXT or SAME"):
        filecheck(OUT, checks("CHECK-NEXT: kernel"))
