"""Writing a model directory without ever leaving half of one.

A directory is written into a temporary sibling (`.NAME.partial-*` beside it) and renamed into
place once complete; an error or Ctrl-C on the way removes the temporary and leaves the
destination as it was. A non-empty destination is replaced only when asked (`overwrite`), and
then only if it is a model directory (it has a config.json): the old one is removed after
the new one is in place. Writing into an existing directory instead would keep the old
model's files beside the new ones (a stale `model-00001-of-00002.safetensors` is loaded with
the new shards) and lose the old model before the new one exists.
"""
from __future__ import annotations

import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import UsageError

CONFIG = "config.json"


def check_destination(dst: Path, overwrite: bool, argument: str = "dst",
                      overwrite_flag: str = "overwrite=True") -> None:
    """UsageError unless `dst` can be written: absent or an empty directory, or, with
    `overwrite`, a model directory. The message names `argument` and `overwrite_flag`."""
    if dst.exists() and not dst.is_dir():
        raise UsageError(f"{argument}: {dst} is a file; give a directory path")
    if not dst.is_dir() or not any(dst.iterdir()):
        return
    if not overwrite:
        held = sorted(p.name for p in dst.iterdir())
        shown = ", ".join(held[:4]) + (f", ... ({len(held)} entries)" if len(held) > 4 else "")
        raise UsageError(f"{argument}: {dst} exists and is not empty ({shown}); pass {overwrite_flag} to "
                         "replace it, or choose another directory")
    if not (dst / CONFIG).is_file():
        raise UsageError(f"{argument}: {dst} holds files but no {CONFIG}: not a model directory, so it is "
                         f"not replaced even with {overwrite_flag}; choose another directory")


def check_not_inside(dst: Path, src: Path, argument: str = "dst") -> None:
    """UsageError when writing `dst` would replace `src` or a directory holding it."""
    d, s = dst.resolve(), src.resolve()
    if d == s or d in s.parents:
        raise UsageError(f"{argument}: {dst} is the source directory {src} or holds it; write the "
                         "converted model elsewhere")


@contextmanager
def new_directory(dst: str | Path, overwrite: bool = False, argument: str = "dst",
                  overwrite_flag: str = "overwrite=True") -> Iterator[Path]:
    """Yield an empty temporary directory beside `dst`; when the block ends without an error,
    it becomes `dst` (an old `dst` is removed only then). On any error or interruption the
    temporary is removed and `dst` is left untouched."""
    dst = Path(dst)
    check_destination(dst, overwrite, argument, overwrite_flag)
    dst.parent.mkdir(parents=True, exist_ok=True)
    # mkdir (not mkdtemp): the directory gets the user's usual permissions, not 0700.
    tmp = dst.parent / f".{dst.name}.partial-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        yield tmp
        check_destination(dst, overwrite, argument, overwrite_flag)  # it may have changed meanwhile
        if dst.exists():
            old = dst.parent / f".{dst.name}.old-{secrets.token_hex(4)}"
            os.rename(dst, old)
            try:
                os.rename(tmp, dst)
            except BaseException:
                os.rename(old, dst)  # put the old one back
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, dst)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["check_destination", "check_not_inside", "new_directory"]
