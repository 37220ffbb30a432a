"""bench/block_skip_gpu.py without a GPU: its sparsities are what they say, its kernels pass the
interpreter in the dry run, and its table pairs each skipping row with dense fp4's."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from marlin_dsl import CUDA, builtin_format, pack
from marlin_dsl.layouts.block_skip import stored_fraction

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("block_skip_gpu", ROOT / "bench" / "block_skip_gpu.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


@pytest.mark.parametrize("kind,zeros,stored", [
    ("clustered50", 0.5, 0.5), ("clustered75", 0.75, 0.25), ("blocks8_50", 0.5, 1.0), ("random50", 0.5, 1.0)])
def test_sparsities(kind: str, zeros: float, stored: float) -> None:
    rng = np.random.default_rng(1)
    w = bench.sparse_weights(kind, 4096, 1024, rng)
    assert abs((w == 0).mean() - zeros) < 0.03
    frac = stored_fraction(builtin_format("fp4_blockpattern"), CUDA, pack(builtin_format("fp4_blockpattern"), w))
    assert abs(frac - stored) < 0.03, frac


def test_dry_run_builds_checked_kernels(tmp_path: Path) -> None:
    assert bench.main(["--dry-run", "--out", str(tmp_path), "--shapes", "4096x4096,4096x14336"]) == 0
    import json
    names = [e["name"] for e in json.loads((tmp_path / "manifest.json").read_text())["kernels"]]
    # dense fp4 per (M, shape); the layers' skipping schedule per M (both shapes have K = 4096)
    assert len(names) == len(set(names)) == 4 + 2
    from marlin_dsl.targets.cuda.tuning import skip_schedule
    assert {e["name"].rsplit("_d", 1)[0] for e in json.loads((tmp_path / "manifest.json").read_text())["kernels"]
            if e["format"] == "fp4_blockpattern"} == {skip_schedule(builtin_format("fp4_blockpattern"), m, CUDA, 4096).name
                                                       for m in (1, 16)}


def test_table_pairs_dense_and_best_skip() -> None:
    base = {"K": 4096, "N": 4096, "M": 1, "sparsity": "clustered50", "stored": 0.5}
    rows = [{**base, "sparsity": None, "subject": "copy", "time_ns": 5000.0},
            {**base, "subject": "fp4", "kernel": "d", "time_ns": 7000.0},
            {**base, "subject": "fp4_blockpattern", "kernel": "a", "time_ns": 5000.0},
            {**base, "subject": "fp4_blockpattern", "kernel": "b", "time_ns": 4000.0}]
    line = bench.table(rows).splitlines()[1].split()
    assert line[:6] == ["4096x4096", "1", "clustered50", "0.500", "7.0", "4.0"] and line[6] == "b"
    assert line[7] == "1.75"
