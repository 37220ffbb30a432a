"""Loading spec files: plain Python files that declare formats, schedules and Gemms."""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path

from .errors import MarlinDSLError, SourceLocation, SpecError
from .source import collecting_declarations
from .formats import Format
from .schedule import Gemm, Schedule


@dataclass
class Spec:
    """What one spec file declares, in declaration order.

    `formats` also holds the formats that a declared Gemm uses without naming them at the
    top level, so every format a kernel depends on is verified.
    """

    path: Path
    formats: list[Format]
    schedules: list[Schedule]
    gemms: list[Gemm]

    @property
    def stem(self) -> str:
        return self.path.stem


def load_spec(path: str | Path) -> Spec:
    """Execute a spec file and collect the formats declared at its top level.

    Errors name the spec file and line: a declaration's own check carries its location, a
    syntax error or another exception is reported at the spec line that raised it.
    """
    spec_path = Path(path)
    if spec_path.is_dir():  # `compile examples` for `compile examples/*.py`
        raise SpecError(f"spec file {str(spec_path)!r} is a directory; pass the spec files in it: "
                        f"{spec_path / '*.py'}")
    if not spec_path.is_file():
        raise SpecError(f"spec file {str(spec_path)!r} does not exist")
    source = spec_path.read_text(encoding="utf-8")
    filename = str(spec_path)
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as err:
        raise SpecError(f"syntax error: {err.msg}", SourceLocation(filename, err.lineno or 0)) from err
    namespace: dict[str, object] = {"__name__": f"marlin_spec_{spec_path.stem}", "__file__": filename}
    try:
        with collecting_declarations() as made:
            exec(code, namespace)
    except MarlinDSLError:
        raise
    except Exception as err:  # report the failing line of the spec, not a deep frame
        line = _last_line_in(err, filename)
        raise SpecError(f"{type(err).__name__}: {err}", SourceLocation(filename, line)) from err
    # Declarations are what the file made (in a list, a dict or a loop variable too: nothing
    # it declares is dropped) and what its top level names (imported from elsewhere too).
    here = [v for v in made if v.location is not None and v.location.file == filename]
    declared = [*here, *namespace.values()]
    gemms = _unique(v for v in declared if isinstance(v, Gemm))
    formats = _unique([*(v for v in declared if isinstance(v, Format)), *(g.format for g in gemms)])
    schedules = _unique([*(v for v in declared if isinstance(v, Schedule)), *(g.schedule for g in gemms)])
    if not formats:
        raise SpecError(f"spec file {filename!r} declares no Format or Gemm")
    _check_names("gemm", gemms)
    formats = _check_names("format", formats)
    return Spec(spec_path, formats, schedules, gemms)


def _check_names(kind: str, items: list) -> list:
    """Two different declarations of one name would share kernel names and output files; two
    equal formats are one. Returns the items without repeats."""
    first: dict[str, object] = {}
    for item in items:
        seen = first.setdefault(item.name, item)
        if seen is not item and (kind == "gemm" or seen != item):
            where = f" (the first at line {seen.location.line})" if seen.location else ""
            raise SpecError(f"two different {kind}s are named {item.name!r}{where}", item.location)
    return list(first.values())


def _unique(values) -> list:
    """Keep the first of each object (by identity), in order."""
    out: list = []
    for v in values:
        if not any(v is seen for seen in out):
            out.append(v)
    return out


def _last_line_in(err: BaseException, filename: str) -> int:
    lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if f.filename == filename]
    return lines[-1] if lines and lines[-1] is not None else 0
