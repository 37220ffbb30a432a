"""Issue 32, item 3: models whose linear layers have biases, through `convert`, `save_model`
and back (`load`, `load_into`, `mlx_lm.load(..., trust_remote_code=True)`), checked by their
numbers, and fused groups checked part by part by their values.

- mlx-lm's Qwen2 (q/k/v with biases; a tiny config, random weights and biases, nothing
  downloaded): the converted model's logits, before saving, equal those of the same model
  converted without fusing and are within float32 summation order of its dequantised float
  twin (nn.Linear layers holding the float64 reference weights and the biases); every loaded
  copy gives those logits bit for bit. The saved config says which layers have a bias.
- A model of our own whose fused groups have parts of three different sizes (q 96, k 32,
  v 64; gate 80, up 48) and biases on some parts only: each fused part returns what that
  part converted on its own returns, bit for bit, before saving and after loading, so a part
  given another part's columns or size, or a bias dropped or misplaced, changes numbers.

Bit for bit, not within a tolerance: quantisation is per output column, so a fused layer's
columns hold exactly the codes and scales of the part's own layer (checked below on the
dequantised values), and on the "mlx" backend these tests run on (MLX's CPU device) each
output is the float32 dot product of x with that same column, summed over K in the same
order whatever the layer's other columns (MLX's matmul does not split K by N), plus the
same bias element. A kernel backend that picked another K split for a wider N would be
within float32 summation order instead.
"""
from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import marlin_dsl as md
from marlin_dsl.models import EXACT, convert, load, load_into, save_model
from marlin_dsl.models.fuse import FusedLinear, LinearSlice
from marlin_dsl.nn import MarlinLinear

pytest.importorskip("mlx_lm.models.qwen2", reason="mlx-lm is not installed (pip install -e '.[test]')")

from tiny_models import tiny_qwen2, write_tokenizer  # noqa: E402

TOKENS = mx.array([[3, 17, 250, 9, 100, 42, 7, 383]])


def logits(model: nn.Module) -> np.ndarray:
    return np.array(model(TOKENS).astype(mx.float32))


def _quantised_by_mlx(model: nn.Module) -> nn.Module:
    nn.quantize(model, group_size=64, bits=4, class_predicate=lambda p, m: isinstance(m, nn.Linear))
    return model


def dequantised_twin(converted: nn.Module, fresh: nn.Module) -> nn.Module:
    """`fresh` (the same architecture with nn.Linear layers) holding, for every MarlinLinear of
    the unfused `converted`, its float64 reference weight rounded to float32 and its bias;
    every other parameter as `converted` has it."""
    weights = dict(tree_flatten(converted.parameters()))
    for path, module in converted.named_modules():
        if isinstance(module, MarlinLinear):
            for name in module.weight_arrays:
                weights.pop(f"{path}.{name}")
            weights[f"{path}.weight"] = mx.array(md.dequantize(module.to_packed()).T.astype(np.float32))
    fresh.load_weights(list(weights.items()), strict=True)
    return fresh


# ----- mlx-lm's Qwen2 ------------------------------------------------------------------------------

QWEN2_FORMATS = ["fp4", "uint4_zp", EXACT]


@pytest.mark.parametrize("name", QWEN2_FORMATS)
def test_qwen2_with_biases_saves_and_loads_bit_identical(name: str, tmp_path: Path) -> None:
    import mlx_lm

    def source(seed: int = 0) -> nn.Module:
        model = tiny_qwen2(seed)
        return _quantised_by_mlx(model) if name == EXACT else model

    fused, separate = source(), source()
    conversion = convert(fused, name)
    convert(separate, name, fuse=())
    assert conversion.fused["model.layers.1.self_attn"] == [("q_proj", "k_proj", "v_proj")]
    before = logits(fused)
    np.testing.assert_array_equal(before, logits(separate))  # the module docstring: bit for bit
    # The fused bias is the parts' biases side by side, by value.
    group = fused.model.layers[0].self_attn["q_proj__k_proj__v_proj"]
    want_bias = np.concatenate([np.array(separate.model.layers[0].self_attn[p].bias)
                                for p in ("q_proj", "k_proj", "v_proj")])
    np.testing.assert_array_equal(np.array(group.layer.bias), want_bias)
    assert isinstance(group, FusedLinear) and group.sizes == (256, 128, 128)
    twin = logits(dequantised_twin(separate, tiny_qwen2(seed=9)))
    rel = np.linalg.norm(before - twin) / np.linalg.norm(twin)
    assert rel < 1e-5, rel  # float32 summation order (the twin's matmul is MLX's, not ours)

    src = tmp_path / "src"
    src.mkdir()
    write_tokenizer(src)
    out = save_model(fused, tmp_path / "m", source_dir=src)  # the config: the model's own args
    loaded, _ = load(out)
    np.testing.assert_array_equal(logits(loaded), before)
    again = load_into(source(seed=7), out)
    np.testing.assert_array_equal(logits(again), before)
    by_mlx_lm, _ = mlx_lm.load(str(out), trust_remote_code=True)
    np.testing.assert_array_equal(logits(by_mlx_lm), before)
    assert isinstance(by_mlx_lm.model.layers[0].self_attn.k_proj, LinearSlice)
    # What the config says: which layers have a bias.
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    layers = config["marlin_dsl"]["layers"]
    for path, module in fused.named_modules():
        if isinstance(module, MarlinLinear):
            assert layers[path].get("bias") is ("bias" in module), path
    assert layers["model.layers.0.self_attn.q_proj__k_proj__v_proj.layer"].get("bias") is True
    assert layers["model.layers.0.self_attn.o_proj"].get("bias") is False
    assert layers["model.layers.1.mlp.gate_proj__up_proj.layer"].get("bias") is False
    # The unfused conversion round-trips too (a bias on each of q, k and v).
    out = save_model(separate, tmp_path / "separate", source_dir=src)
    np.testing.assert_array_equal(logits(load(out)[0]), before)


# ----- a model of our own: parts of three sizes, biases on some ----------------------------------

K_IN = 256
SIZES = {"q_proj": 96, "k_proj": 32, "v_proj": 64, "gate_proj": 80, "up_proj": 48}
#: per block: the parts with a bias (block 0: q and v but not k, so the fused bias has zeros
#: in k's place; no bias in its gate/up group. Block 1: all of q/k/v, and up but not gate)
BIASED = ({"q_proj", "v_proj"}, {"q_proj", "k_proj", "v_proj", "up_proj"})
GROUPS = [("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")]


class Block(nn.Module):
    def __init__(self, biased: set[str]) -> None:
        super().__init__()
        for name, n in SIZES.items():
            setattr(self, name, nn.Linear(K_IN, n, bias=name in biased))

    def __call__(self, x: mx.array) -> list[mx.array]:
        return [getattr(self, name)(x) for name in SIZES]  # every part reads the same x


class TwoBlocks(nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        mx.random.seed(seed)
        self.layers = [Block(b) for b in BIASED]
        mx.eval(self.parameters())


def _source(name: str, seed: int = 0) -> nn.Module:
    model = TwoBlocks(seed)
    return _quantised_by_mlx(model) if name == EXACT else model


def assert_same_values(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """got == want bit for bit; where a part has another part's width, the columns both have
    are compared first, so that a misplaced part fails on its numbers, not only its shape."""
    n = min(got.shape[-1], want.shape[-1])
    np.testing.assert_array_equal(got[..., :n], want[..., :n], err_msg=f"{what}: its first {n} outputs")
    np.testing.assert_array_equal(got, want, err_msg=what)


def _outputs(model: nn.Module, x: mx.array) -> dict[str, np.ndarray]:
    """Every part's output for x, part by part (each called on its own, in reverse order:
    the fused group computes once and hands each part its columns)."""
    out = {}
    for i, block in enumerate(model.layers):
        for name in reversed(SIZES):
            out[f"layers.{i}.{name}"] = np.array(block[name](x))
    return out


@pytest.mark.parametrize("name", ["fp4", "uint4_zp", "nf4", "fp4_2of4", "fp4_blockpattern", EXACT])
def test_fused_parts_of_different_sizes_return_their_own_layers_values(name: str, tmp_path: Path) -> None:
    fused, separate = _source(name), _source(name)
    conversion = convert(fused, name)
    convert(separate, name, fuse=())
    assert conversion.fused == {"layers.0": GROUPS, "layers.1": GROUPS}
    x = mx.array(np.random.default_rng(1).standard_normal((2, 3, K_IN)).astype(np.float32))
    want = _outputs(separate, x)
    got = _outputs(fused, x)
    for path, y in want.items():
        assert_same_values(got[path], y, path)
        assert y.shape == (2, 3, SIZES[path.rpartition(".")[2]]), path
    # The stored columns: the fused weight's columns of a part, dequantised, are that part's
    # own dequantised weight exactly (the columns of SIZES, not of the group's own sizes).
    for i, block in enumerate(fused.layers):
        for parts in GROUPS:
            whole = md.dequantize(block["__".join(parts)].layer.to_packed())
            start = 0
            for part in parts:
                own = separate.layers[i][part]
                stop = start + SIZES[part]
                np.testing.assert_array_equal(whole[:, start:stop], md.dequantize(own.to_packed()),
                                              err_msg=f"layers.{i}.{part}")
                # ... and that part's output is x @ its weight + its bias (float64 reference)
                ref = np.array(x, dtype=np.float64) @ md.dequantize(own.to_packed())
                if "bias" in own:
                    ref = ref + np.array(own.bias, dtype=np.float64)
                y = got[f"layers.{i}.{part}"]
                assert np.linalg.norm(y - ref) <= 1e-5 * np.linalg.norm(ref), (i, part)
                start = stop

    # Saved and loaded into a fresh model (another seed): every part's output again, bit for bit.
    out = save_model(fused, tmp_path / "fused")
    loaded = load_into(_source(name, seed=9), out)
    for path, y in _outputs(loaded, x).items():
        assert_same_values(y, want[path], f"loaded {path}")
    assert isinstance(loaded.layers[0].k_proj, LinearSlice)
    layers = json.loads((out / "config.json").read_text())["marlin_dsl"]["layers"]
    assert [layers[f"layers.{i}.q_proj__k_proj__v_proj.layer"].get("bias") for i in (0, 1)] == [True, True]
    assert [layers[f"layers.{i}.gate_proj__up_proj.layer"].get("bias") for i in (0, 1)] == [False, True]
    # Unfused, each biased layer on its own.
    out = save_model(separate, tmp_path / "separate")
    for path, y in _outputs(load_into(_source(name, seed=9), out), x).items():
        assert_same_values(y, want[path], f"loaded unfused {path}")
    layers = json.loads((out / "config.json").read_text())["marlin_dsl"]["layers"]
    assert {p for p, e in layers.items() if e.get("bias")} == {f"layers.{i}.{p}" for i, b in enumerate(BIASED) for p in b}
