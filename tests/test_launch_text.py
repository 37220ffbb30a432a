"""The strings MLX is handed for a CUDA kernel (targets/cuda/launch_text.py): short #include
lines of files that hold exactly the compact text, content-addressed, rewritten when damaged,
and the inline fallback."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from marlin_dsl.errors import MarlinDSLError
from marlin_dsl.formats.builtin import builtin_format
from marlin_dsl.targets.cuda.launch_text import expand, mlx_strings, text_files, text_mode
from marlin_dsl.targets.cuda.runtime import cuda_gemm, cuda_schedule


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MARLIN_DSL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MARLIN_DSL_CUDA_TEXT", raising=False)
    return tmp_path / "cache" / "cuda_text"


@pytest.mark.parametrize("fmt,m", [("fp4", 1), ("uint4_zp", 16), ("fp4_2of4", 3)])
def test_layer_kernels_are_handed_as_includes_of_their_exact_text(cache, fmt, m):
    f = builtin_format(fmt)
    src = cuda_gemm(f, "f16", cuda_schedule(f, m, 4096, 4096)).source.compact()
    header, body = mlx_strings("kern", src.header, src.body)
    assert len(header) + len(body) < 400 < len(src.header) + len(src.body)
    assert header.startswith('#include "/') and body.startswith('#include "/')
    assert expand(header) == src.header and expand(body) == src.body
    assert sorted(p.name for p in cache.iterdir()) == sorted(text_files("kern", src.header, src.body))


def test_file_names_follow_the_content(cache):
    a = mlx_strings("k", "// header A\n", "y[0] = 1;\n")
    b = mlx_strings("k", "// header A\n", "y[0] = 2;\n")
    assert a[0] != b[0] and a[1] != b[1]  # MLX keys its module cache on these strings
    assert mlx_strings("k", "// header A\n", "y[0] = 1;\n") == a  # same text: same strings


def test_a_damaged_file_is_rewritten(cache):
    header, body = mlx_strings("k", "// h\n", "y[0] = 1;\n")
    path = Path(body.strip()[len('#include "'):-1])
    path.write_text("garbage")
    assert mlx_strings("k", "// h\n", "y[0] = 1;\n") == (header, body)
    assert path.read_text() == "y[0] = 1;\n"
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp_")]


def test_inline_mode_hands_the_text(cache, monkeypatch):
    monkeypatch.setenv("MARLIN_DSL_CUDA_TEXT", "inline")
    assert text_mode() == "inline"
    assert mlx_strings("k", "// h\n", "y[0] = 1;\n") == ("// h\n", "y[0] = 1;\n")
    assert not cache.exists()


def test_bad_mode_is_named(monkeypatch):
    monkeypatch.setenv("MARLIN_DSL_CUDA_TEXT", "files")
    with pytest.raises(MarlinDSLError, match="MARLIN_DSL_CUDA_TEXT='files'"):
        text_mode()


def test_unwritable_cache_falls_back_inline_with_a_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    monkeypatch.setenv("MARLIN_DSL_CACHE", str(blocker))
    monkeypatch.delenv("MARLIN_DSL_CUDA_TEXT", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert mlx_strings("k", "// h\n", "y[0] = 1;\n") == ("// h\n", "y[0] = 1;\n")
    assert any("inline" in str(w.message) and isinstance(w.message, RuntimeWarning) for w in caught)


def test_a_path_an_include_cannot_hold_falls_back(tmp_path, monkeypatch):
    monkeypatch.setenv("MARLIN_DSL_CACHE", str(tmp_path / 'we"ird'))
    monkeypatch.delenv("MARLIN_DSL_CUDA_TEXT", raising=False)
    with pytest.warns(RuntimeWarning, match="#include"):
        assert mlx_strings("k", "// h\n", "b;\n") == ("// h\n", "b;\n")
