"""Whole models: mlx-lm's own llama code (a tiny config, random weights) converted in place
with `marlin_dsl.models.convert`, saved as a model directory, loaded back, and converted from
a directory by `marlin-dsl convert`. Runs on MLX's CPU backend (the "mlx" backend of the layer)."""
from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import marlin_dsl as md
from marlin_dsl.cli import main as cli_main
from marlin_dsl.errors import MarlinDSLError, ValueRangeError
from marlin_dsl.models import EXACT, convert, load, load_into, save_model
from marlin_dsl.models.checkpoint import marlin_section
from marlin_dsl.nn import MarlinLinear

llama = pytest.importorskip("mlx_lm.models.llama", reason="mlx-lm is not installed (pip install -e '.[test]')")

CONFIG = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "intermediate_size": 512,
          "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 384,
          "rope_theta": 10000.0, "tie_word_embeddings": False, "head_dim": 64}
LINEARS = 2 * 7 + 1  # q, k, v, o, gate, up, down per block, and the lm_head


def tiny_llama(seed: int = 0, dtype=mx.float32) -> nn.Module:
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(CONFIG))
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def dequantised_twin(model: nn.Module) -> nn.Module:
    """The same architecture with every MarlinLinear replaced by an nn.Linear holding its
    exact (float64 reference, rounded to float32) dequantised weight."""
    twin = tiny_llama()
    weights = dict(tree_flatten(model.parameters()))
    replaced = {}
    for path, module in model.named_modules():
        if isinstance(module, MarlinLinear):
            w = md.dequantize(module.to_packed()).T.astype(np.float32)  # [N, K]
            replaced[f"{path}.weight"] = mx.array(w)
            for name in module.weight_arrays:
                weights.pop(f"{path}.{name}")
    weights.update(replaced)
    twin.load_weights(list(weights.items()))
    return twin


TOKENS = mx.array([[3, 17, 250, 9, 100, 42, 7, 383]])


def logits(model: nn.Module) -> np.ndarray:
    return np.array(model(TOKENS).astype(mx.float32))


@pytest.mark.parametrize("name", sorted(md.BUILTIN_FORMATS))
def test_converted_model_matches_its_dequantised_twin(name: str) -> None:
    model = tiny_llama()
    conversion = convert(model, name, fuse=())
    assert len(conversion.formats) == LINEARS and not conversion.skipped
    assert all(isinstance(m, MarlinLinear) for p, m in model.named_modules() if p.endswith(("proj", "lm_head")))
    got, want = logits(model), logits(dequantised_twin(model))
    assert got.shape == (1, 8, CONFIG["vocab_size"])
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel < 1e-5, rel  # the same float32 arithmetic up to summation order


@pytest.mark.parametrize("name", ["fp4", "uint4_zp", "fp4_2of4"])
def test_fused_groups_compute_what_their_parts_do(name: str) -> None:
    """q/k/v and gate/up as one layer each: the same packed columns, the same logits."""
    from marlin_dsl.models.fuse import FusedLinear, LinearSlice

    separate, fused = tiny_llama(), tiny_llama()
    convert(separate, name, fuse=())
    conversion = convert(fused, name)
    assert conversion.fused["model.layers.1.self_attn"] == [("q_proj", "k_proj", "v_proj")]
    assert conversion.fused["model.layers.0.mlp"] == [("gate_proj", "up_proj")]
    attn = fused.model.layers[0].self_attn
    assert isinstance(attn.q_proj, LinearSlice) and isinstance(attn["q_proj__k_proj__v_proj"], FusedLinear)
    assert not tree_flatten(attn.q_proj.parameters())  # the parameters live once, in the group
    # Quantisation is per column: the fused weight is the parts' weights side by side.
    parts = [separate.model.layers[0].self_attn[p].to_packed() for p in ("q_proj", "k_proj", "v_proj")]
    whole = attn["q_proj__k_proj__v_proj"].layer.to_packed()
    for array in whole.arrays:
        np.testing.assert_array_equal(whole[array], np.concatenate([p[array] for p in parts], axis=1))
    np.testing.assert_allclose(logits(fused), logits(separate), rtol=1e-5, atol=1e-5)


def test_fused_parts_share_one_launch_per_input_and_let_it_go() -> None:
    """The parts of a fused group take one product per x (the same array object), recompute
    for another x (also in any order or repeated), and the group keeps neither x nor the
    outputs once every part has taken its own."""
    import gc
    import weakref

    model = tiny_llama()
    convert(model, "fp4")
    attn = model.model.layers[0].self_attn
    group = attn["q_proj__k_proj__v_proj"]
    launches = []
    layer = group["layer"]
    layer.call_parts(mx.zeros((1, CONFIG["hidden_size"])))  # armed: `_parts_call` is the per-call closure
    real = layer._parts_call
    object.__setattr__(layer, "_parts_call", lambda x: launches.append(1) or real(x))
    parts = (attn.q_proj, attn.k_proj, attn.v_proj)
    x1, x2 = (mx.random.normal((2, 3, CONFIG["hidden_size"])) for _ in range(2))
    splits = list(np.cumsum(group.sizes)[:-1])
    want = {id(x): [np.array(p_) for p_ in mx.split(layer(x), splits, axis=-1)] for x in (x1, x2)}

    def check(x: mx.array, i: int) -> None:
        np.testing.assert_array_equal(np.array(parts[i](x)), want[id(x)][i])

    for i in range(3):
        check(x1, i)
    assert len(launches) == 1 and group._memo == [None, None, 0]  # all taken: nothing kept
    # Interleaved and repeated: a launch for each change of x, none for the repeated part.
    check(x1, 2), check(x2, 0), check(x1, 1), check(x1, 1), check(x2, 2)
    assert len(launches) == 5
    # A prefill's input and outputs are not held by the model after the forward.
    x3 = mx.random.normal((1, 5, CONFIG["hidden_size"]))
    ref = weakref.ref(x3)
    for p_ in parts:
        mx.eval(p_(x3))
    del x3
    gc.collect()
    assert ref() is None


def test_per_layer_rules_and_functions() -> None:
    model = tiny_llama()
    conversion = convert(model, {"mlp": "fp4_2of4", "lm_head": None, "*": "nf4"})
    names = {p: f.name for p, f in conversion.formats.items()}
    assert names["model.layers.0.mlp.up_proj"] == "fp4_2of4"
    assert names["model.layers.1.self_attn.q_proj"] == "nf4"
    assert "lm_head" not in names and isinstance(model.lm_head, nn.Linear)
    model = tiny_llama()
    conversion = convert(model, lambda path, m: "int4" if path.endswith("o_proj") else None)
    assert sorted(conversion.formats) == ["model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj"]
    with pytest.raises(MarlinDSLError, match=r"format for layer 'model.layers.0.self_attn.q_proj': expected a built-in"):
        convert(tiny_llama(), {"q_proj": "fp5"})


def test_layers_the_format_cannot_hold_are_skipped_or_refused() -> None:
    model = nn.Sequential(nn.Linear(256, 64), nn.Linear(64, 32))  # K = 64 < group 128
    conversion = convert(model, "fp4")
    assert list(conversion.formats) == ["layers.0"] and "layers.1" in conversion.skipped
    assert "group_size 128" in conversion.skipped["layers.1"]
    # The catch-all rule is a default for all layers too; a rule that names the layer is not.
    conversion = convert(nn.Sequential(nn.Linear(256, 64), nn.Linear(64, 32)), {"layers.0": "nf4", "*": "fp4"})
    assert list(conversion.unconverted) == ["layers.1"]
    with pytest.raises(md.ShapeError, match="layer 'layers.1'"):
        convert(nn.Sequential(nn.Linear(256, 64), nn.Linear(64, 32)), {"layers.1": "fp4", "*": "fp4"})


def test_save_and_load_are_bit_identical(tmp_path: Path) -> None:
    model = tiny_llama()
    convert(model, {"mlp": "fp4_2of4", "*": "uint4_zp"})
    before = logits(model)
    save_model(model, tmp_path / "m", CONFIG)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["marlin_dsl"] == marlin_section(model) and config["hidden_size"] == 256
    # Any architecture: a fresh model of the same shape, filled from the directory.
    again = load_into(tiny_llama(seed=9), tmp_path / "m")
    for (path, a), (path2, b) in zip(sorted(tree_flatten(model.parameters())), sorted(tree_flatten(again.parameters()))):
        assert path == path2
        np.testing.assert_array_equal(np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a),
                                      np.array(b.astype(mx.float32) if b.dtype == mx.bfloat16 else b))
    np.testing.assert_array_equal(logits(again), before)
    # mlx-lm's loader with marlin-dsl's layers.
    loaded, loaded_config = load(tmp_path / "m")
    np.testing.assert_array_equal(logits(loaded), before)
    assert loaded_config["marlin_dsl"]["fused"]["model.layers.0.mlp"] == [["gate_proj", "up_proj"]]
    assert "model.layers.0.mlp.gate_proj__up_proj.layer" in loaded_config["marlin_dsl"]["layers"]


def test_corrupt_checkpoint_raises_at_load_naming_array_and_index(tmp_path: Path) -> None:
    model = tiny_llama()
    convert(model, {"mlp": "fp4_2of4", "*": "fp4"})
    save_model(model, tmp_path / "m", CONFIG)
    weights = mx.load(str(tmp_path / "m" / "model.safetensors"))
    meta = np.array(weights["model.layers.1.mlp.down_proj.meta"])
    meta[:] = 0xFFFFFFFF  # every 2:4 field 0b1111: position 3 kept twice
    weights["model.layers.1.mlp.down_proj.meta"] = mx.array(meta)
    mx.save_safetensors(str(tmp_path / "m" / "model.safetensors"), weights)
    with pytest.raises(ValueRangeError, match=r"meta\[0, 0\] field 0: invalid 2:4 metadata value 15"):
        load_into(tiny_llama(), tmp_path / "m")
    save_model(model, tmp_path / "m", CONFIG, overwrite=True)  # intact again
    weights = mx.load(str(tmp_path / "m" / "model.safetensors"))
    scales = np.array(weights["model.layers.0.self_attn.o_proj.scales"])
    scales[1, 7] = np.nan
    weights["model.layers.0.self_attn.o_proj.scales"] = mx.array(scales)
    mx.save_safetensors(str(tmp_path / "m" / "model.safetensors"), weights)
    # The shard file, the layer and the array, in marlin-dsl's own error type.
    with pytest.raises(ValueRangeError, match=r"^model.safetensors: model.layers.0.self_attn.o_proj.scales\[1, 7\] "
                                              r"is not finite: nan"):
        load(tmp_path / "m")
    with pytest.raises(ValueRangeError, match=r"model.layers.0.self_attn.o_proj.scales\[1, 7\]"):
        load_into(tiny_llama(), tmp_path / "m")


def test_cli_converts_an_mlx_lm_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from mlx_lm.utils import save_config
    from mlx_lm.utils import save_model as save_mlx_lm

    src = tmp_path / "src"
    model = tiny_llama(dtype=mx.float16)
    save_mlx_lm(src, model)
    save_config(dict(CONFIG), src / "config.json")
    (src / "tokenizer_config.json").write_text("{}\n")
    code = cli_main(["convert", str(src), str(tmp_path / "dst"), "--format", "fp4", "--format",
                     "mlp=fp4_2of4", "--skip", "lm_head", "--quiet"])
    assert code == 0
    out = capsys.readouterr().out
    assert "converted 14 linear layers (8 x fp4, 6 x fp4_2of4)" in out  # attention 2 x 4, MLP 2 x 3
    assert (tmp_path / "dst" / "tokenizer_config.json").exists()
    converted, _ = load(tmp_path / "dst")
    assert isinstance(converted.lm_head, nn.Linear)
    assert converted.model.layers[0].mlp.gate_proj.format.name == "fp4_2of4"
    # The same as converting in memory.
    again = tiny_llama(dtype=mx.float16)
    again.load_weights(list(mx.load(str(src / "model.safetensors")).items()))
    convert(again, {"lm_head": None, "mlp": "fp4_2of4", "*": "fp4"})
    np.testing.assert_array_equal(logits(converted), logits(again))


def test_mlx_quantized_model_converts_exactly() -> None:
    """A float32 model quantised by MLX (f32 scales and biases) loads bit for bit: the logits
    differ only by float32 summation order."""
    model = tiny_llama(dtype=mx.float32)
    nn.quantize(model, group_size=64, bits=4, class_predicate=lambda p, m: isinstance(m, nn.Linear))
    want = logits(model)
    conversion = convert(model, EXACT)
    assert {f.name for f in conversion.formats.values()} == {"mlx_affine4_g64_f32"}
    got = logits(model)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
    with pytest.raises(MarlinDSLError, match="'exact' loads an nn.QuantizedLinear"):
        convert(tiny_llama(), EXACT)


def test_compiled_model_runs() -> None:
    """mx.compile over a converted model (the call path has no sync and no numpy)."""
    model = tiny_llama()
    convert(model, "fp4")
    compiled = mx.compile(lambda t: model(t))
    np.testing.assert_allclose(np.array(compiled(TOKENS)), logits(model), rtol=1e-5, atol=1e-5)
