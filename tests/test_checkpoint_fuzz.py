"""Bad checkpoint tensors (issue 36) reach the user as marlin-dsl's own errors naming the
tensor, never a numpy or MLX exception and never a silent wrong answer: every catalogue format,
each tensor dropped, retyped, reshaped, truncated, replaced by a non-array, or its parameters
made non-finite, through `MarlinLinear.from_checkpoint` (backend mlx)."""
from __future__ import annotations

import numpy as np
import pytest

from marlin_dsl.errors import MarlinDSLError
from marlin_dsl.formats.checkpoint import GGUF_TYPES, awq, bnb, gguf_format, gptq
from marlin_dsl.formats.quantize import quantize
from marlin_dsl.nn import MarlinLinear

FORMATS = {**{f"gguf_{t}": (lambda t=t: gguf_format(t)) for t in sorted(GGUF_TYPES)},
           "gptq4": lambda: gptq(4, 128, 1), "gptq8_v2": lambda: gptq(8, 64, 2), "awq": lambda: awq(4, 128),
           "bnb_nf4": lambda: bnb("nf4"), "bnb_fp4_dq": lambda: bnb("fp4", 64, True)}
K, N = 256, 24


def valid(name: str) -> tuple[object, dict[str, np.ndarray]]:
    cf = FORMATS[name]()
    rng = np.random.default_rng(len(name))
    q = quantize(cf.format, rng.standard_normal((K, N)) * 0.05)
    order = rng.permutation(K) if name.startswith("gptq") else None
    table = np.linspace(-1, 1, 256, dtype=np.float32) if name.endswith("_dq") else None
    return cf, cf.write(q, order, nested_table=table)


def mutations(tensors: dict[str, np.ndarray], rng: np.random.Generator):
    """(what, mutated tensors, the tensor the error must name)."""
    for t, a in tensors.items():
        yield f"drop {t}", {k: v for k, v in tensors.items() if k != t}, t
        if a.ndim >= 1 and a.size > 1:
            yield f"truncate {t}", {**tensors, t: a.reshape(-1)[:-1]}, t
            yield f"extra row {t}", {**tensors, t: np.concatenate([a.reshape(a.shape[0], -1)] * 2)}, t
        wrong = np.float32 if a.dtype.kind in "iu" else np.int64
        yield f"retype {t}", {**tensors, t: a.astype(wrong)}, t
        yield f"non-array {t}", {**tensors, t: "not an array"}, t
        if a.dtype.kind == "f" and a.size:
            bad = a.copy().reshape(-1)
            bad[rng.integers(bad.size)] = np.nan
            yield f"nan in {t}", {**tensors, t: bad.reshape(a.shape)}, None
    yield "unknown tensor", {**tensors, "bias_scale": np.zeros(3)}, "bias_scale"


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_bad_tensors_are_named_errors(name: str) -> None:
    cf, tensors = valid(name)
    MarlinLinear.from_checkpoint(tensors, cf, (K, N), name="layer", backend="mlx")  # the valid one loads
    rng = np.random.default_rng(1)
    for what, bad, tensor in mutations(tensors, rng):
        try:
            MarlinLinear.from_checkpoint(bad, cf, (K, N), name="layer", backend="mlx")
        except MarlinDSLError as err:
            if tensor is not None:
                assert f"layer.{tensor}" in str(err) or tensor in str(err), (what, str(err))
            continue
        except Exception as err:  # noqa: BLE001 - the point: nothing foreign gets out
            pytest.fail(f"{name}: {what}: {type(err).__name__}: {err}")
        pytest.fail(f"{name}: {what}: accepted")


@pytest.mark.parametrize("shape", [(128, N), (K + 256, N), (K, N + 8), (0, N)])
def test_a_shape_that_disagrees_with_the_tensors(shape: tuple[int, int]) -> None:
    for name in ("gguf_Q4_K", "gptq4", "awq", "bnb_nf4"):
        cf, tensors = valid(name)
        with pytest.raises(MarlinDSLError):
            MarlinLinear.from_checkpoint(tensors, cf, shape, name="layer", backend="mlx")
