"""Issue 31: `marlin-dsl convert` as a new user meets it. It never loses data (a non-empty
destination needs --overwrite, which replaces the whole directory only once the new one is
complete; an error or Ctrl-C leaves it as it was), refuses an already converted source, says
what is missing in one line, names the source tensor or argument that is wrong, refuses rules
that match nothing, and says (exit 1) when layers were left unconverted. A tiny mlx-lm llama
with random weights; nothing is downloaded."""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install -e '.[test]')")

from tiny_models import LINEARS, snapshot, tiny_llama, write_source  # noqa: E402

from marlin_dsl import cli  # noqa: E402
from marlin_dsl.cli import main  # noqa: E402
from marlin_dsl.errors import EnvironmentUnavailable, FormatError, UsageError, ValueRangeError  # noqa: E402
from marlin_dsl.models import UnmatchedRules, convert, convert_directory, load, save_model  # noqa: E402
from marlin_dsl.models import checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_source(tmp_path_factory.mktemp("src"), tiny_llama(seed=3, dtype=mx.float16))


def _error_line(err: str) -> str:
    """The one error line: the last line of stderr, which must be the only `error:` line."""
    lines = err.strip().splitlines()
    assert sum("error:" in line for line in lines) == 1, err
    assert "Traceback" not in err
    return lines[-1]


def _stale_destination(dst: Path) -> dict[str, bytes]:
    """A user's directory with a model in it (config.json and two shards)."""
    dst.mkdir()
    (dst / "config.json").write_text(json.dumps({"model_type": "llama", "mine": True}))
    (dst / "model-00001-of-00002.safetensors").write_bytes(b"\x06\x00\x00\x00\x00\x00\x00\x00{}    ")
    (dst / "model-00002-of-00002.safetensors").write_bytes(b"old")
    return snapshot(dst)


# ----- 1. data loss ---------------------------------------------------------------------------

def test_a_non_empty_destination_needs_overwrite(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    dst = tmp_path / "dst"
    before = _stale_destination(dst)
    assert main(["convert", str(src), str(dst), "--quiet"]) == cli.EXIT_USAGE
    line = _error_line(capsys.readouterr().err)
    assert "is not empty" in line and "--overwrite" in line
    assert snapshot(dst) == before  # nothing touched
    # --overwrite: the whole directory is the new model; the stale shards are gone.
    assert main(["convert", str(src), str(dst), "--quiet", "--overwrite"]) == cli.EXIT_OK
    assert not (dst / "model-00001-of-00002.safetensors").exists()
    assert "mine" not in json.loads((dst / "config.json").read_text())
    model, _ = load(dst)
    assert model.model.layers[0].mlp.down_proj.format.name == "fp4"
    assert [p.name for p in tmp_path.iterdir()] == ["dst"]  # no temporary left beside it
    # A directory that is not a model directory is not replaced, even with --overwrite.
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    assert main(["convert", str(src), str(other), "--quiet", "--overwrite"]) == cli.EXIT_USAGE
    assert "no config.json" in _error_line(capsys.readouterr().err)
    assert (other / "todo.txt").read_text() == "keep me"


@pytest.mark.parametrize("when", ["converting", "writing"])
def test_an_interruption_leaves_the_destination_as_it_was(src: Path, tmp_path: Path, when: str,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture) -> None:
    dst = tmp_path / "dst"
    before = _stale_destination(dst)
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        raise KeyboardInterrupt

    if when == "writing":  # after the shards are written, before the other files are copied
        monkeypatch.setattr(checkpoint, "_copy_other_files", interrupted)
    else:
        convert_module = sys.modules["marlin_dsl.models.convert"]  # the package exports a function of that name
        monkeypatch.setattr(convert_module, "_convert_one", interrupted)
    assert main(["convert", str(src), str(dst), "--quiet", "--overwrite"]) == cli.EXIT_INTERRUPTED
    assert calls and capsys.readouterr().err.endswith("marlin-dsl: interrupted\n")
    assert snapshot(dst) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"]  # the temporary is removed


def test_an_already_converted_source_is_refused(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["convert", str(src), str(tmp_path / "a"), "--quiet"]) == cli.EXIT_OK
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "a"), str(tmp_path / "b"), "--quiet", "--format", "int4"]) == cli.EXIT_INPUT
    line = _error_line(capsys.readouterr().err)
    assert "already converted by marlin-dsl" in line and "'marlin_dsl' section" in line
    assert not (tmp_path / "b").exists()
    with pytest.raises(ValueError, match="already converted"):
        convert_directory(tmp_path / "a", tmp_path / "c")


def test_the_python_api_has_the_same_protections(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    before = _stale_destination(dst)
    with pytest.raises(UsageError, match=r"is not empty .*overwrite=True"):
        convert_directory(src, dst, "fp4")
    model = tiny_llama()
    convert(model, "int4")
    with pytest.raises(UsageError, match="overwrite=True"):
        save_model(model, dst)
    assert snapshot(dst) == before
    save_model(model, dst, overwrite=True)
    assert not (dst / "model-00002-of-00002.safetensors").exists()
    with pytest.raises(UsageError, match="source directory"):
        convert_directory(src, src.parent, "fp4", overwrite=True)  # would replace the source


# ----- 2. one line, the project's own errors --------------------------------------------------

def test_without_mlx_lm_the_commands_say_what_to_install(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "mlx_lm", None)  # `import mlx_lm` raises ImportError
    monkeypatch.setitem(sys.modules, "mlx_lm.utils", None)
    assert main(["convert", str(src), str(tmp_path / "dst"), "--quiet"]) == cli.EXIT_ENVIRONMENT
    line = _error_line(capsys.readouterr().err)
    assert 'pip install "marlin-dsl[mlx-lm]"' in line
    assert main(["generate", str(src), "--prompt", "w1"]) == cli.EXIT_ENVIRONMENT
    assert 'pip install "marlin-dsl[mlx-lm]"' in _error_line(capsys.readouterr().err)
    with pytest.raises(EnvironmentUnavailable, match=r"marlin_dsl.models.load needs mlx-lm"):
        load(src)


def test_a_truncated_or_stale_shard_is_named(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    convert_directory(src, dst, "fp4")
    shard = dst / "model.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match=r"model.safetensors: truncated"):
        load(dst)
    shard.write_bytes(data)
    (dst / "model-00001-of-00002.safetensors").write_bytes(data)
    with pytest.raises(ValueError, match=r"model-00001-of-00002.safetensors'\] not listed in "
                                         r"model.safetensors.index.json"):
        load(dst)


# ----- 3. errors that point at the right thing ------------------------------------------------

def _with_bad_value(src: Path, dst: Path, name: str, index: tuple[int, int], value: float) -> Path:
    import shutil

    shutil.copytree(src, dst)
    weights = mx.load(str(dst / "model.safetensors"))
    w = np.array(weights[name].astype(mx.float32))
    w[index] = value
    weights[name] = mx.array(w).astype(weights[name].dtype)
    mx.save_safetensors(str(dst / "model.safetensors"), weights, metadata={"format": "mlx"})
    return dst


def test_a_non_finite_source_value_is_named_by_its_tensor_and_index(src: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    bad = _with_bad_value(src, tmp_path / "bad", "model.layers.1.mlp.up_proj.weight", (300, 7), np.nan)
    assert main(["convert", str(bad), str(tmp_path / "dst")]) == cli.EXIT_INPUT  # progress on: lines
    err = capsys.readouterr().err
    line = _error_line(err)
    assert line == (f"marlin-dsl: error: {bad / 'model.safetensors'}: model.layers.1.mlp.up_proj.weight: "
                    "non-finite value nan at index (300, 7) of its shape (512, 256)")
    assert not (tmp_path / "dst").exists()


def test_an_error_after_a_progress_bar_starts_on_its_own_line(tmp_path: Path) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    model = tiny_llama()
    model.model.layers[0].self_attn.o_proj.weight[5, 9] = float("inf")
    out = Terminal()
    with pytest.raises(ValueRangeError, match=r"^model.layers.0.self_attn.o_proj.weight: non-finite value inf "
                                              r"at index \(5, 9\)"):
        convert(model, "fp4", progress=out)
    assert "\r" in out.getvalue() and out.getvalue().endswith("\n")


def test_a_scale_beyond_its_storage_names_the_layer_and_suggests_wider_scales(tmp_path: Path) -> None:
    model = tiny_llama()
    model.model.layers[1].mlp.down_proj.weight = model.model.layers[1].mlp.down_proj.weight * 1e7
    with pytest.raises(ValueRangeError, match=r"^model.layers.1.mlp.down_proj.weight: the group of row \d+, "
                                              r"columns \d+..\d+ .*needs scale [\d.e+]+, beyond f16's largest value "
                                              r"65504.* wider scales"):
        convert(model, "fp4")
    # Scaled by 1e6 the scales fit in f16 but x @ W does not: the f32 source computed in f32,
    # and so does its conversion (for f16 activations too) on the MLX-ops backend; MLX's float
    # layer is the reference. (GPU kernels take f32 activations in f16: layers/dispatch.py.)
    layer = nn.Linear(256, 64)
    layer.weight = layer.weight * 1e6
    x = mx.random.normal((3, 256)).astype(mx.float16)
    from marlin_dsl.nn import MarlinLinear

    ours, want = MarlinLinear.from_linear(layer, "fp4", backend="mlx")(x), layer(x)
    assert ours.dtype == want.dtype == mx.float32 and bool(mx.all(mx.isfinite(ours)))
    rel = float(mx.linalg.norm(ours - want) / mx.linalg.norm(want))
    assert rel < 0.2, rel  # 4-bit weights


def test_a_bad_group_size_names_the_argument(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["convert", str(src), str(tmp_path / "dst"), "--group-size", "100"]) == cli.EXIT_USAGE
    line = _error_line(capsys.readouterr().err)
    assert line.startswith("marlin-dsl: error: --group-size 100: format 'fp4': group_size 100 must be a multiple")
    assert ".py:" not in line and "bin/" not in line  # no caller's frame as its location
    with pytest.raises(FormatError, match=r"^group_size=100: format 'fp4'") as info:
        convert(tiny_llama(), "fp4", group_size=100)
    assert info.value.location is None


# ----- 4. no silent no-ops --------------------------------------------------------------------

@pytest.mark.parametrize("argv, said, near", [
    (["--skip", "lm-head"], "--skip 'lm-head' matches no linear layer", "'lm_head'"),
    (["--format", "mlp.down=int4", "--format", "fp4"], "--format 'mlp.down=int4' matches no linear layer",
     "'mlp.down_proj'"),
])
def test_a_rule_that_matches_nothing_is_an_error(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                 argv: list[str], said: str, near: str) -> None:
    assert main(["convert", str(src), str(tmp_path / "dst"), "--quiet", *argv]) == cli.EXIT_USAGE
    line = _error_line(capsys.readouterr().err)
    assert said in line and near in line.split("(near: ")[1] and "run of whole dotted parts" in line
    assert not (tmp_path / "dst").exists()


def test_the_python_api_refuses_rules_that_match_nothing() -> None:
    with pytest.raises(UnmatchedRules, match=r"format rule 'mlp.down' matches no linear layer \(near: 'mlp.down_proj'"):
        convert(tiny_llama(), {"mlp.down": "int4", "*": "fp4"})
    conversion = convert(tiny_llama(), {"down_proj": "int4", "*": "fp4"})
    assert conversion.counts() == {"fp4": LINEARS - 2, "int4": 2}


def test_the_matching_rule_is_in_help() -> None:
    parser = cli.build_parser()
    convert_help = parser._subparsers._group_actions[0].choices["convert"].format_help()  # noqa: SLF001
    assert "run of whole dotted parts" in " ".join(convert_help.split())


def test_layers_left_unconverted_exit_1_with_count_and_reason(src: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    # K = 256 everywhere but down_proj (K = 512): group 512 fits 2 of the 15 layers.
    assert main(["convert", str(src), str(tmp_path / "dst"), "--group-size", "512"]) == cli.EXIT_CHECK_FAILED
    captured = capsys.readouterr()
    assert "converted 2 linear layers (2 x fp4_g512)" in captured.out
    assert f"13 of {LINEARS} linear layers were left unconverted" in captured.err
    assert "group_size 512 of format 'fp4_g512' does not divide K=256" in captured.err
    assert load(tmp_path / "dst")[0].model.layers[1].mlp.down_proj.format.name == "fp4_g512"


# ----- 8. progress, help texts, repr ----------------------------------------------------------

def test_progress_is_plain_lines_off_a_terminal_and_reaches_the_total(src: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    assert main(["convert", str(src), str(tmp_path / "dst"), "--skip", "lm_head"]) == cli.EXIT_OK
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("[")]  # not a library's warning
    assert len(lines) == LINEARS and lines[-1].startswith(f"[{LINEARS}/{LINEARS}]") and "lm_head: left as it is" in err

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    convert(tiny_llama(), {"lm_head": None, "*": "fp4"}, progress=out)
    assert out.getvalue().rstrip("\n").rsplit("\r", 1)[1].split()[1] == f"{LINEARS}/{LINEARS}"


def test_cache_help_names_every_folder_and_help_texts_are_self_contained(capsys: pytest.CaptureFixture) -> None:
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    cache_help = " ".join(commands["cache"].format_help().split())
    for part in ("metal_cpu", "cuda_cpu", "metal/", "nvcc", "nvrtc", "cuda_text"):
        assert part in cache_help, part
    texts = [parser.format_help(), *(c.format_help() for c in commands.values())]
    for text in texts:
        assert "docs/" not in text and "bench/" not in text
    assert "Exit codes" in parser.format_help()
    if main(["bench"]) == cli.EXIT_ENVIRONMENT:  # this machine has no GPU backend
        err = capsys.readouterr().err
        assert "bench/" not in err and "docs/" not in err and "marlin-dsl[cuda]" in err


def test_conversion_repr_is_a_summary() -> None:
    model = tiny_llama()
    conversion = convert(model, {"lm_head": None, "mlp": "int4", "*": "fp4"})
    text = repr(conversion)
    assert len(text) < 200, text
    assert "8 x fp4" in text and "6 x int4" in text and "1 left" in text
    assert "4 fused groups" in text
