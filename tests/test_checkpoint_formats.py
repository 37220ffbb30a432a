"""The storage vocabulary (formats/checkpoint/, issue 36): every GGUF type bit for bit against
`gguf.quants.dequantize` (the gguf package's own numpy dequantiser), GPTQ, AWQ and
bitsandbytes against dequantisers written from their published code (tests/published_oracles.py),
declaration errors at their line, bad tensors named, layers through the CUDA kernels (the
interpreter), and tiny llamas as GGUF Q4_K_M and GPTQ act-order that load, save, load back and
generate."""
from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from marlin_dsl.checks.gpu_output import check_gpu_output
from marlin_dsl.errors import FormatError, MarlinDSLError, ShapeError, ValueRangeError
from marlin_dsl.formats.checkpoint import (GGUF_TYPES, Bits, Record, Scalar, Words, awq, bnb, gguf_format, gptq,
                                           plane, run)
from marlin_dsl.formats.packing import pack_codes
from marlin_dsl.formats.quantize import quantize
from marlin_dsl.formats.evaluate import dequantize as md_dequantize
from marlin_dsl.formats.reference import dequantize
from marlin_dsl.nn import MarlinLinear

gguf = pytest.importorskip("gguf", reason="the gguf package (test extra) is the GGUF oracle")

from gguf.quants import dequantize as gguf_dequantize  # noqa: E402


def random_records(rng: np.random.Generator, type_name: str, n: int, k: int) -> np.ndarray:
    """[N, K/block * size] random record bytes, every f16 field a finite value near 0.01."""
    cf = gguf_format(type_name)
    rec = cf.tensors[0].record
    raw = rng.integers(0, 256, size=(n, k // rec.block, rec.size), dtype=np.uint8)
    for f in rec.fields:
        if isinstance(f, Scalar):
            v = (rng.standard_normal((n, k // rec.block)) * 0.01).astype(np.float16)
            raw[:, :, f.offset:f.offset + 2] = v[..., None].view(np.uint8).reshape(n, k // rec.block, 2)
    return raw.reshape(n, -1)


# ----- GGUF --------------------------------------------------------------------------------------

@pytest.mark.parametrize("type_name", sorted(GGUF_TYPES))
@pytest.mark.parametrize("n, blocks", [(1, 1), (5, 3), (33, 2)])
def test_gguf_bit_exact_against_gguf_package(type_name: str, n: int, blocks: int) -> None:
    """Every bit pattern of the records (random bytes, finite f16 scales): our float64
    reference rounded once to f32 equals gguf's f32 dequantisation; writing reads back the
    same bytes."""
    rng = np.random.default_rng(abs(hash((type_name, n, blocks))) % 2**32)
    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    k = block * blocks
    raw = random_records(rng, type_name, n, k)
    cf = gguf_format(type_name)
    imported = cf.read({"weight": raw}, (k, n))
    oracle = gguf_dequantize(raw, qtype)
    ours = dequantize(imported.weights).T.astype(np.float32)
    assert np.array_equal(ours.view(np.uint32), oracle.view(np.uint32)) or np.array_equal(ours, oracle)
    assert np.array_equal(cf.write(imported.weights)["weight"], raw)


@pytest.mark.parametrize("type_name", sorted(GGUF_TYPES))
def test_gguf_quantised_by_us_read_by_gguf(type_name: str) -> None:
    """Weights quantised in the kernel format and written as records: gguf reads them as our
    reference does, and the weight is within a quantisation step of the input."""
    rng = np.random.default_rng(7)
    cf = gguf_format(type_name)
    k, n = 512, 17
    w = rng.standard_normal((k, n)) * 0.02
    q = quantize(cf.format, w)
    raw = cf.write(q)["weight"]
    oracle = gguf_dequantize(raw, getattr(gguf.GGMLQuantizationType, type_name))
    assert np.array_equal(dequantize(q).T.astype(np.float32), oracle)
    bits = cf.format.element.bits
    assert np.abs(oracle.T - w).max() < 4 * np.abs(w).max() / (2**bits - 1)


def test_gguf_unknown_type_and_bad_tensors() -> None:
    with pytest.raises(FormatError, match="GGUF tensor type 'IQ2_XS' has no marlin-dsl format"):
        gguf_format("IQ2_XS")
    cf = gguf_format("Q4_K")
    with pytest.raises(ShapeError, match=r"blk.0.ffn_up.weight: expected 3 x 1 records of 144 bytes"):
        cf.read({"weight": np.zeros((3, 100), np.uint8)}, (256, 3), "blk.0.ffn_up.")
    with pytest.raises(ShapeError, match=r"blk.0.ffn_up.weight: missing; checkpoint format 'gguf_q4_k'"):
        cf.read({}, (256, 3), "blk.0.ffn_up.")
    with pytest.raises(ShapeError, match="K=96 is not a multiple of 256"):
        cf.read({"weight": np.zeros((3, 54), np.uint8)}, (96, 3))


# ----- the declarations --------------------------------------------------------------------------

def test_record_declarations_are_checked_at_their_line() -> None:
    with pytest.raises(FormatError, match=r"bit 0 of byte 2 belongs to both 'd' and 'qs'") as err:
        Record(32, 18, (Scalar("d", "f16", 1), Bits("qs", 32, (plane(2, 16, 4, (16, 2), (1, 0)),))))
    assert err.value.location is not None and err.value.location.line > 0
    with pytest.raises(FormatError, match=r"bit 0 of byte 17 of the 18-byte record belongs to no field"):
        Record(32, 18, (Scalar("d", "f16", 0), Bits("qs", 30, (plane(2, 15, 4, (15, 2), (1, 0)),))))
    with pytest.raises(FormatError, match="element 2 is missing some of its 5 bits"):
        Record(3, 3, (Bits("q", 3, (run(0, range(3), 0, 4), run(0, range(2), 4, 1, to=4))),))
    with pytest.raises(FormatError, match="order must be a permutation of 0..7"):
        Words(4, "i32", "N", order=(0, 1, 2, 3, 4, 5, 6, 6))
    with pytest.raises(FormatError, match="bits must divide the 32-bit word"):
        Words(5, "i32")


def test_words_round_trip_in_every_order() -> None:
    rng = np.random.default_rng(3)
    for words in (Words(4, "i32", "K"), Words(4, "i32", "N", order=(0, 2, 4, 6, 1, 3, 5, 7)),
                  Words(4, "u8", "K", order=(1, 0), transposed=True, flat=True), Words(8, "u32", "N", offset=1)):
        values = rng.integers(words.offset, (1 << words.bits) + words.offset, size=(64, 16))
        packed = words.pack(values)
        assert np.array_equal(words.unpack(packed, 64, 16, "t"), values)
    assert Words(4, "i32", "K").pack(np.full((8, 1), 15)).dtype == np.int32


# ----- GPTQ, AWQ, bitsandbytes against their published definitions -------------------------------

oracles = pytest.importorskip("published_oracles")


@pytest.mark.parametrize("bits, group, version", [(4, 128, 1), (4, 32, 2), (8, 64, 1), (8, 128, 2), (4, -1, 1)])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_bit_exact(bits: int, group: int, version: int, act_order: bool) -> None:
    rng = np.random.default_rng(bits * 1000 + group + version)
    k, n = 256, 48
    g = k if group == -1 else group
    codes = rng.integers(0, 2**bits, size=(k, n))
    zeros = rng.integers(1 if version == 1 else 0, 2**bits, size=(k // g, n))
    scales = (rng.random((k // g, n)) * 0.01 + 1e-3).astype(np.float16)
    g_idx = (rng.permutation(k) // g if act_order else np.arange(k) // g).astype(np.int32)
    qweight, qzeros = oracles.gptq_pack(codes, zeros, bits, version)
    tensors = {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx}
    cf = gptq(bits, group, version)
    imported = cf.read(tensors, (k, n))
    w = dequantize(imported.weights)  # rows in group order
    order = imported.input_order if act_order else None
    assert (order is None) == (not act_order or group == -1)  # one group: any order is in order
    if order is not None:
        unsorted = np.empty_like(w)
        unsorted[order] = w
        w = unsorted
    expected = oracles.gptq_dequantize(qweight, qzeros, scales, g_idx, bits, version)
    assert np.array_equal(w.astype(np.float16), expected)
    back = cf.write(imported.weights, imported.input_order)
    assert all(np.array_equal(back[t], tensors[t]) for t in ("qweight", "qzeros", "scales"))
    assert np.array_equal(back["g_idx"], g_idx)


def test_gptq_act_order_errors() -> None:
    cf = gptq(4, 64, 1)
    k, n = 128, 8
    tensors = {"qweight": np.zeros((k // 8, n), np.int32), "qzeros": np.zeros((2, 1), np.int32),
               "scales": np.ones((2, n), np.float16)}
    with pytest.raises(ShapeError, match=r"layer.g_idx: missing"):
        cf.read(tensors, (k, n), "layer.")
    with pytest.raises(ValueRangeError, match=r"layer.g_idx: group 0 has 65 rows; format 'gptq_v1_4bit_g64' needs 64"):
        cf.read({**tensors, "g_idx": np.r_[np.zeros(65), np.ones(63)].astype(np.int32)}, (k, n), "layer.")
    with pytest.raises(ShapeError, match=r"layer.qweight: expected shape \[16, 8\]"):
        cf.read({**tensors, "qweight": np.zeros((8, n), np.int32), "g_idx": np.arange(k) // 64}, (k, n), "layer.")


@pytest.mark.parametrize("group", [32, 128])
def test_awq_bit_exact(group: int) -> None:
    rng = np.random.default_rng(group)
    k, n = 256, 40
    codes = rng.integers(0, 16, size=(k, n))
    zeros = rng.integers(0, 16, size=(k // group, n))
    scales = (rng.random((k // group, n)) * 0.01 + 1e-3).astype(np.float16)
    qweight, qzeros = oracles.awq_pack(codes, zeros, 4)
    cf = awq(4, group)
    imported = cf.read({"qweight": qweight, "qzeros": qzeros, "scales": scales}, (k, n))
    assert np.array_equal(dequantize(imported.weights).astype(np.float16),
                          oracles.awq_dequantize(qweight, qzeros, scales, 4))
    back = cf.write(imported.weights)
    assert np.array_equal(back["qweight"], qweight) and np.array_equal(back["qzeros"], qzeros)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("double_quant", [False, True])
def test_bitsandbytes_bit_exact(quant_type: str, double_quant: bool) -> None:
    rng = np.random.default_rng(5)
    n, k = 24, 192
    w = (rng.standard_normal((n, k)) * 0.03).astype(np.float32)
    packed, stats = oracles.bnb_quantize_4bit(w, quant_type, 64, compress_statistics=double_quant)
    cf = bnb(quant_type, 64, double_quant)
    tensors = {"weight": packed}
    if double_quant:
        tensors |= {"absmax": stats["absmax"], "nested_absmax": stats["nested_absmax"],
                    "nested_quant_map": stats["nested_quant_map"], "nested_offset": np.asarray(stats["offset"])}
        expected = oracles.bnb_dequantize_4bit(packed, (n, k), quant_type, nested=stats)
    else:
        tensors["absmax"] = stats
        expected = oracles.bnb_dequantize_4bit(packed, (n, k), quant_type, absmax=stats)
    imported = cf.read(tensors, (k, n))
    ours = dequantize(imported.weights).T.astype(np.float32)
    assert np.array_equal(ours, expected)
    assert np.array_equal(cf.write(imported.weights, nested_table=stats["nested_quant_map"] if double_quant
                                   else None)["weight"].reshape(-1), packed.reshape(-1))


def test_bitsandbytes_tables_are_the_published_ones() -> None:
    from marlin_dsl.formats.checkpoint import BNB_FP4, BNB_NF4

    assert np.array_equal(np.float32(BNB_NF4), oracles.BNB_NF4)
    assert np.array_equal(np.float32(BNB_FP4), oracles.BNB_FP4)


# ----- layers through the CUDA kernels (the interpreter) -----------------------------------------

LAYER_CASES = [lambda: gguf_format("Q4_K"), lambda: gguf_format("Q6_K"), lambda: gguf_format("Q5_0"),
               lambda: gptq(4, 128, 1), lambda: awq(4, 128), lambda: bnb("nf4")]


@pytest.mark.parametrize("case", range(len(LAYER_CASES)))
def test_layers_run_the_cuda_kernels(case: int, fake_cuda) -> None:
    """from_checkpoint on backend "cuda", kernels run by the interpreter: within the error model
    of x @ W (act-order: x's columns permuted) at M = 1 and 3."""
    cf = LAYER_CASES[case]()
    rng = np.random.default_rng(case)
    k, n = 256, 40
    w = rng.standard_normal((k, n)) * 0.05
    order = rng.permutation(k) if cf.name.startswith("gptq") else None
    q = quantize(cf.format, w if order is None else w[order])
    layer = MarlinLinear.from_checkpoint(cf.write(q, order), cf, (k, n), name="layer", backend="cuda")
    assert ("input_order" in layer) == (order is not None)
    for m in (1, 3):
        x = rng.standard_normal((m, k)).astype(np.float16)
        y = np.array(layer(mx.array(x)).astype(mx.float32))
        xk = x.astype(np.float64)[:, order] if order is not None else x.astype(np.float64)
        check = check_gpu_output(y, xk, pack_codes(q), "f16")
        assert check.ok, (cf.name, m, check.failures())
    assert fake_cuda  # the kernels ran


def test_from_checkpoint_errors() -> None:
    cf = gptq(4, 128, 1)
    with pytest.raises(ShapeError, match="format: expected a marlin_dsl.formats.checkpoint.CheckpointFormat"):
        MarlinLinear.from_checkpoint({}, "gptq", (128, 8))
    with pytest.raises(ShapeError, match=r"q_proj.bias_scales: not a tensor of checkpoint format"):
        MarlinLinear.from_checkpoint({"bias_scales": np.zeros(1)}, cf, (128, 8), name="q_proj")
    with pytest.raises(ShapeError, match=r"shape: expected \(K, N\)"):
        MarlinLinear.from_checkpoint({}, cf, (128,))


# ----- models ------------------------------------------------------------------------------------

TOKENS = mx.array([[3, 17, 250, 9, 100, 42, 7, 383]])


def test_tiny_llama_gguf_q4_k_m(tmp_path) -> None:
    """A tiny llama written by gguf's writer as llama.cpp lays it out (Q4_K_M): read, its
    logits against the HF model holding gguf's own dequantisation with q/k rows un-permuted
    (mlx-lm's usual RoPE); saved, loaded back by models.load, generated from."""
    from gguf_files import hf_to_gguf_names, llama_cpp_unpermute, write_tiny_gguf
    from tiny_models import CONFIG, tiny_llama

    from marlin_dsl.models import load
    from marlin_dsl.models.checkpoint import save_model
    from marlin_dsl.models.imports import read_gguf

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    model, config = read_gguf(path, backend="mlx")
    formats = sorted({m.format.name for _, m in model.named_modules() if isinstance(m, MarlinLinear)})
    assert formats == ["gguf_q4_k", "gguf_q6_k"]
    reader = gguf.GGUFReader(str(path))
    inverse = {v: k for k, v in hf_to_gguf_names().items()}
    twin = tiny_llama()
    weights = []
    for t in reader.tensors:
        w = np.asarray(t.data)
        if t.tensor_type.name != "F32":
            w = gguf_dequantize(w, t.tensor_type)
        if ".attn_q." in t.name:
            w = llama_cpp_unpermute(w, CONFIG["num_attention_heads"])
        elif ".attn_k." in t.name:
            w = llama_cpp_unpermute(w, CONFIG["num_key_value_heads"])
        weights.append((inverse[t.name], mx.array(w.astype(np.float32))))
    twin.load_weights(weights)
    ours, ref = np.array(model(TOKENS)), np.array(twin(TOKENS))
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 1e-5
    save_model(model, tmp_path / "out", config)
    loaded, _ = load(tmp_path / "out", backend="mlx")
    from marlin_dsl.cli import main

    assert main(["convert", str(path), str(tmp_path / "cli"), "--backend", "mlx"]) == 0
    assert np.array_equal(np.array(load(tmp_path / "cli", backend="mlx")[0](TOKENS)), ours)
    from marlin_dsl.cli import EXIT_USAGE  # a quantised checkpoint keeps its own formats

    assert main(["convert", str(path), str(tmp_path / "cli2"), "--format", "fp4"]) == EXIT_USAGE
    assert np.array_equal(np.array(loaded(TOKENS)), ours)
    from mlx_lm.generate import generate_step

    tokens = [int(t) for t, _ in zip((tok for tok, _ in generate_step(TOKENS[0], loaded, max_tokens=4)), range(4))]
    assert len(tokens) == 4


def write_gptq_directory(path, act_order: bool = True, seed: int = 0) -> dict[str, np.ndarray]:
    """A tiny llama as a Hugging Face GPTQ directory (v1, 4-bit, group 128, desc_act) written
    with the published packer; returns the float weights of its dequantisation, by name."""
    from safetensors.numpy import save_file
    from tiny_models import CONFIG, tiny_llama

    rng = np.random.default_rng(seed)
    model = tiny_llama(seed)
    out, ref = {}, {}
    cf = gptq(4, 128, 1)
    for name, w in tree_flatten(model.parameters()):
        w = np.array(w)
        module = name.rpartition(".")[0]
        if w.ndim == 2 and "embed" not in name:
            k = w.shape[1]
            order = rng.permutation(k) if act_order else None
            q = quantize(cf.format, (w.T if order is None else w.T[order]).astype(np.float64))
            tensors = cf.write(q, order)
            qweight, qzeros = oracles.gptq_pack(*_codes_and_zeros(q), 4, 1)
            assert np.array_equal(qzeros, tensors["qzeros"])
            out.update({f"{module}.{t}": a for t, a in tensors.items()})
            ref[name] = oracles.gptq_dequantize(tensors["qweight"], tensors["qzeros"], tensors["scales"],
                                                tensors["g_idx"], 4, 1).T.astype(np.float32)
        else:
            out[name] = w
            ref[name] = w
    save_file(out, str(path / "model.safetensors"))
    config = dict(CONFIG, quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128,
                                               "desc_act": act_order, "sym": False})
    (path / "config.json").write_text(json.dumps(config))
    return ref


def _codes_and_zeros(q) -> tuple[np.ndarray, np.ndarray]:
    return q.codes, q.parameter("zeros").astype(np.int64)


def test_tiny_llama_gptq_act_order_directory(tmp_path, capsys) -> None:
    """A GPTQ act-order directory converts with `marlin-dsl convert`, loads with models.load,
    and its logits match the float model holding the published dequantisation."""
    from tiny_models import tiny_llama

    from marlin_dsl.cli import main
    from marlin_dsl.models import load

    src = tmp_path / "gptq"
    src.mkdir()
    ref = write_gptq_directory(src)
    assert main(["convert", str(src), str(tmp_path / "out"), "--backend", "mlx"]) == 0
    assert "imported 15 quantised linear layers (15 x gptq_v1_4bit_g128)" in capsys.readouterr().out
    model, config = load(tmp_path / "out", backend="mlx")
    assert "quantization_config" not in config
    assert sum("input_order" in m for _, m in model.named_modules() if isinstance(m, MarlinLinear)) == 15
    # GPTQ's published dequantisation rounds each weight to f16 (its own arithmetic); the
    # float32 model's layers multiply the exact weights, so the two differ by that rounding
    # (2^-12 relative a weight at most): against it within 2e-3, and within 1e-5 of a twin
    # holding the exact weights, which equal the published ones after the f16 cast
    # (test_gptq_bit_exact).
    twin, exact = tiny_llama(), tiny_llama()
    twin.load_weights([(k, mx.array(v)) for k, v in ref.items()])
    exact_weights = dict(ref)
    for path, module in model.named_modules():
        if isinstance(module, MarlinLinear):
            w = md_dequantize(module.to_packed())  # rows in group order: put them back
            order = np.array(module["input_order"])
            unsorted = np.empty_like(w)
            unsorted[order] = w
            assert np.array_equal(unsorted.astype(np.float16).T, ref[f"{path}.weight"].astype(np.float16))
            exact_weights[f"{path}.weight"] = unsorted.T.astype(np.float32)
    exact.load_weights([(k, mx.array(v)) for k, v in exact_weights.items()])
    ours = np.array(model(TOKENS))
    for other, tol in ((twin, 2e-3), (exact, 1e-5)):
        expected = np.array(other(TOKENS))
        assert np.linalg.norm(ours - expected) / np.linalg.norm(expected) < tol


def test_gptq_directory_without_g_idx_is_an_error(tmp_path) -> None:
    from safetensors.numpy import load_file, save_file

    from marlin_dsl.models.imports import read_hf_quantized

    write_gptq_directory(tmp_path, act_order=True)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors.pop("model.layers.0.self_attn.q_proj.g_idx")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ShapeError, match=r"model.layers.0.self_attn.q_proj.g_idx: missing, and "
                                         r"quantization_config has desc_act: true"):
        read_hf_quantized(tmp_path, backend="mlx")
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["quant_method"] = "exl2"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(MarlinDSLError, match="quant_method 'exl2'"):
        read_hf_quantized(tmp_path, backend="mlx")


def test_the_example_declares_what_the_catalogue_does() -> None:
    """examples/checkpoint_formats.py spells out Q4_K, Q6_K, GPTQ and AWQ with the vocabulary;
    they are the catalogue's declarations, field for field."""
    import runpy
    from pathlib import Path

    example = runpy.run_path(str(Path(__file__).resolve().parent.parent / "examples" / "checkpoint_formats.py"))
    assert example["q4_k"] == gguf_format("Q4_K")
    assert example["q6_k"] == gguf_format("Q6_K")
    assert example["gptq"] == gptq(4, 128, 1)
    assert example["awq"] == awq(4, 128)
