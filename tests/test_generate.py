"""Issue 31, part 5: from a model directory to generated text. `marlin-dsl convert SRC DST`,
then `marlin-dsl generate DST --prompt ...`, mlx-lm's own `load` / `mlx_lm.generate
--trust-remote-code` (through the marlin_dsl_model.py that save_model writes), and
`models.load` all give the same model and text. Formats declared in a spec file convert
too, and `save_model` needs no config for an mlx-lm model. A tiny llama with random weights
and a word-level tokenizer built here; nothing is downloaded."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install -e '.[test]')")
pytest.importorskip("transformers", reason="mlx-lm's tokenizers need transformers")

from tiny_models import WORDS, tiny_llama, write_source  # noqa: E402

from marlin_dsl import cli  # noqa: E402
from marlin_dsl.cli import main  # noqa: E402
from marlin_dsl.models import convert, generate_text, load, save_model  # noqa: E402
from marlin_dsl.nn import MarlinLinear  # noqa: E402

PROMPT = "w1 w7 w42 w3"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = write_source(tmp_path_factory.mktemp("src"), tiny_llama(seed=5, dtype=mx.float16))
    dst = tmp_path_factory.mktemp("out") / "dst"
    assert main(["convert", str(src), str(dst), "--format", "fp4", "--quiet"]) == cli.EXIT_OK
    return dst


def _greedy_first_word(model, prompt: str) -> str:
    """The word the model's own logits pick after the prompt (what greedy decoding emits first)."""
    tokens = [WORDS.index(w) for w in prompt.split()]
    logits = model(mx.array([tokens]))[0, -1]
    return WORDS[int(mx.argmax(logits).item())]


def test_generate_command_prints_the_models_text(converted: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["generate", str(converted), "--prompt", PROMPT, "--max-tokens", "6"]) == cli.EXIT_OK
    text = capsys.readouterr().out.strip()
    words = text.split()
    assert 1 <= len(words) <= 6 and all(w in WORDS for w in words), text
    model, _ = load(converted)
    assert words[0] == _greedy_first_word(model, PROMPT)  # the converted model's own choice
    assert generate_text(converted, PROMPT, max_tokens=6).strip() == text


def test_mlx_lm_loads_a_converted_directory_with_trust_remote_code(converted: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    import mlx_lm

    config = json.loads((converted / "config.json").read_text())
    assert config["model_file"] == "marlin_dsl_model.py" and (converted / "marlin_dsl_model.py").is_file()
    with pytest.raises(ValueError, match="trust_remote_code"):  # mlx-lm says so itself
        mlx_lm.load(str(converted))
    model, tokenizer = mlx_lm.load(str(converted), trust_remote_code=True)
    assert isinstance(model.model.layers[1].mlp.down_proj, MarlinLinear)
    ours, _ = load(converted)
    tokens = mx.array([[WORDS.index(w) for w in PROMPT.split()]])
    np.testing.assert_array_equal(np.array(model(tokens)), np.array(ours(tokens)))
    text = mlx_lm.generate(model, tokenizer, prompt=PROMPT, max_tokens=6)
    assert main(["generate", str(converted), "--prompt", PROMPT, "--max-tokens", "6"]) == cli.EXIT_OK
    assert capsys.readouterr().out.strip() == text.strip()


def test_mlx_lm_generate_command_runs_a_converted_directory(converted: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    from mlx_lm.generate import main as mlx_lm_generate

    want = generate_text(converted, PROMPT, max_tokens=6).strip()
    monkeypatch.setattr(sys, "argv", ["mlx_lm.generate", "--model", str(converted), "--trust-remote-code",
                                      "--prompt", PROMPT, "--max-tokens", "6", "--verbose", "False"])
    mlx_lm_generate()
    assert capsys.readouterr().out.strip() == want


def test_a_corrupt_scale_is_one_line_naming_shard_layer_and_array(converted: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(converted, bad)
    weights = mx.load(str(bad / "model.safetensors"))
    name = "model.layers.0.self_attn.o_proj.scales"
    scales = np.array(weights[name])
    scales[0, 5] = np.nan
    weights[name] = mx.array(scales)
    mx.save_safetensors(str(bad / "model.safetensors"), weights, metadata={"format": "mlx"})
    assert main(["generate", str(bad), "--prompt", PROMPT]) == cli.EXIT_INPUT
    err = capsys.readouterr().err
    assert err == f"marlin-dsl: error: model.safetensors: {name}[0, 5] is not finite: nan\n"
    # mlx-lm's loader (through the model file) names the layer and array too.
    import mlx_lm

    with pytest.raises(ValueError, match=rf"{name}\[0, 5\] is not finite: nan"):
        mlx_lm.load(str(bad), trust_remote_code=True)


def test_a_missing_model_directory_is_not_a_download(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["generate", str(tmp_path / "nope"), "--prompt", PROMPT]) == cli.EXIT_INPUT
    assert "does not exist" in capsys.readouterr().err


def test_save_model_takes_the_config_from_an_mlx_lm_model(tmp_path: Path) -> None:
    model = tiny_llama(seed=2)
    convert(model, {"mlp": "int4", "*": "fp4"})
    save_model(model, tmp_path / "m")  # no config: the model's own args
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["hidden_size"] == 256 and config["num_hidden_layers"] == 2
    loaded, _ = load(tmp_path / "m")
    tokens = mx.array([[3, 17, 250, 9]])
    np.testing.assert_array_equal(np.array(loaded(tokens)), np.array(model(tokens)))


def test_convert_takes_formats_from_a_spec_file(converted: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    spec = tmp_path / "my.py"
    spec.write_text("from marlin_dsl import Format, GroupScale, IntEncoding\n"
                    "int5_g32 = Format('int5_g32', IntEncoding(5, offset=16), GroupScale(32))\n")
    src = write_source(tmp_path / "src", tiny_llama(seed=4, dtype=mx.float16), tokenizer=False)
    argv = ["convert", str(src), str(tmp_path / "dst"), "--spec", str(spec), "--quiet"]
    assert main([*argv, "--format", "int6"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "unknown format 'int6'" in err and "'int5_g32'" in err and "'fp4'" in err
    assert main([*argv, "--format", "int5_g32", "--format", "lm_head=fp4"]) == cli.EXIT_OK
    assert "converted 15 linear layers (1 x fp4, 14 x int5_g32)" in capsys.readouterr().out
    model, _ = load(tmp_path / "dst")
    assert model.model.layers[0].mlp.down_proj.format.name == "int5_g32"
    assert main([*argv, "--format", "int5_g32", "--group-size", "64"]) == cli.EXIT_USAGE
    assert "--group-size 64: applies to built-in formats" in capsys.readouterr().err
