"""What a result file records so that its numbers can be tied to the code that made them
(issue 17): the commit of the checkout and a digest of each kernel's printed text."""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]


def git_commit(where: Path | None = None) -> str:
    """$MARLIN_COMMIT when set, else `git rev-parse HEAD` of the checkout holding `where`
    (default: this package), with "-dirty" when tracked files differ from it; "unknown"
    outside a git checkout. The variable is for copies whose .git is not the source's: the
    lent GPU machine's copy of the working tree reported a commit two sessions old, so the
    runs there pass the commit they were started from."""
    if os.environ.get("MARLIN_COMMIT"):
        return os.environ["MARLIN_COMMIT"]
    cwd = where or _ROOT
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              check=False, timeout=10).stdout.strip()
        if not head:
            return "unknown"
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=cwd, capture_output=True,
                               check=False, timeout=10).returncode == 1
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def source_digest(source: object) -> str:
    """The digest of a printed kernel: `CudaSource.digest` (everything MLX compiles); for any
    other source object, the sha256 of its text (`header` + `body`, or str())."""
    digest = getattr(source, "digest", None)
    if isinstance(digest, str):
        return digest
    text = getattr(source, "header", "") + "\0" + getattr(source, "body", str(source))
    return hashlib.sha256(text.encode()).hexdigest()


def gpu_name() -> str:
    """The GPU's name as nvidia-smi reports it, for result files; "unknown" where it cannot."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


__all__ = ["git_commit", "source_digest", "gpu_name"]
