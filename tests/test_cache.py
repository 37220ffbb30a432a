"""The per-user cache (marlin_dsl/cache.py): XDG location, a size bound that removes the least
recently used builds first (never the one in use), and `marlin-dsl cache [--clear]`."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from marlin_dsl import cache
from marlin_dsl.cli import main


def test_location_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MARLIN_DSL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "xdg" / "marlin_dsl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_root() == tmp_path / "home" / ".cache" / "marlin_dsl"
    monkeypatch.setenv("MARLIN_DSL_CACHE", str(tmp_path / "mine"))
    assert cache.cache_dir("metal_cpu") == tmp_path / "mine" / "metal_cpu" and (tmp_path / "mine" / "metal_cpu").is_dir()


def test_prune_removes_least_recently_used_first(tmp_path: Path) -> None:
    files = []
    for i in range(5):
        f = tmp_path / f"k{i}.so"
        f.write_bytes(b"x" * 1000)
        os.utime(f, (1_000_000 + i, 1_000_000 + i))  # k0 oldest
        files.append(f)
    (tmp_path / "include-1").mkdir()
    (tmp_path / "include-1" / "metal_stdlib").write_bytes(b"y" * 5000)  # headers are not pruned
    removed = cache.prune(tmp_path, limit=2500, keep=(files[0],))
    assert removed == 3000
    assert [f.exists() for f in files] == [True, False, False, False, True]
    assert (tmp_path / "include-1" / "metal_stdlib").exists()


def test_cli_cache_shows_and_clears(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MARLIN_DSL_CACHE", str(tmp_path / "c"))
    (cache.cache_dir("metal_cpu") / "a.so").write_bytes(b"z" * 2**20)
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "c") in out and "metal_cpu       1.0 MB" in out
    assert main(["cache", "--clear"]) == 0
    assert "removed 1.0 MB" in capsys.readouterr().out and not (tmp_path / "c").exists()


def test_harness_builds_go_to_the_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from marlin_dsl.targets.metal import cpu_harness as metal_cpu

    monkeypatch.delenv("MARLIN_METAL_CPU_CACHE", raising=False)
    monkeypatch.setenv("MARLIN_DSL_CACHE", str(tmp_path / "c"))
    assert metal_cpu._cache_dir() == tmp_path / "c" / "metal_cpu"
    from marlin_dsl.targets.cuda import cpu_harness as cuda_cpu

    monkeypatch.delenv("MARLIN_CUDA_CPU_CACHE", raising=False)
    assert cuda_cpu._cache_dir() == tmp_path / "c" / "cuda_cpu"
