"""Self-checks of a format on fresh random data, reported as rows of the verification table.

Each check uses an independent oracle: the round trip compares codes, the quantisation
bound compares against a brute-force nearest representable value, the pack/validate check
reloads the arrays as a user loading them from disk would.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..formats import (
    BlockPatternSparsity,
    Format,
    PackedWeights,
    dequantize,
    pack_codes,
    prune,
    quantize,
    reference_matmul,
    unpack,
    validate,
)


@dataclass
class FormatCheck:
    """Results of `verify_format` for one format."""

    format: Format
    shape: tuple[int, int]
    checks: dict[str, bool] = field(default_factory=dict)
    quant_excess: float = 0.0  # (|deq - w| - |nearest - w|) / scale, worst element
    matmul_rel_error: float = 0.0  # ||x@deq - x@w|| / ||x@w||: the format's accuracy

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


def sample_weights(fmt: Format, k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Random weights; block-pattern formats get clustered zeros, as such formats assume."""
    w = rng.standard_normal((k, n)) * rng.uniform(0.01, 2.0)
    if isinstance(fmt.sparsity, BlockPatternSparsity):
        sp = fmt.sparsity
        empty_rows = rng.random(k) < 0.5  # K positions pruned for whole column blocks
        first_block = rng.random((k, -(-n // sp.block_n))) < 0.5
        mask = np.repeat(first_block, sp.block_n, axis=1)[:, :n] & empty_rows[:, None]
        w[mask] = 0.0
        # whole runs of 8 pattern rows zero in some blocks (what a skipping kernel leaves out),
        # the first block zero throughout, the last block's runs all kept (never all zeros)
        runs = clustered_mask(k, n, rng, 8 * sp.block_k, sp.block_n, keep=0.6, empty_block=True)
        runs[:, (-(-n // sp.block_n) - 1) * sp.block_n:] = False
        w[runs] = 0.0
    return w


def clustered_mask(k: int, n: int, rng: np.random.Generator, run_k: int, block_n: int, keep: float,
                   empty_block: bool = False) -> np.ndarray:
    """bool [K, N], True where a weight is zero: aligned runs of `run_k` K positions x
    `block_n` columns zeroed with probability 1 - keep (clustered sparsity: pruned channel
    groups), and with `empty_block` the first column block zero over all of K."""
    runs, blocks = -(-k // run_k), -(-n // block_n)
    zero = rng.random((runs, blocks)) >= keep
    if empty_block and blocks > 1:
        zero[:, 0] = True
    return np.repeat(np.repeat(zero, run_k, axis=0), block_n, axis=1)[:k, :n]


def format_weights(fmt: Format, k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """`sample_weights` in the format's own range, so that any declarable format can be
    checked: without a zero point or bias, positive weights scaled to the table's largest
    value and negative ones to its most negative (none where the table has none), so scales
    sit near 1 in every storage type; with one, magnitudes around the table's largest."""
    w = sample_weights(fmt, k, n, rng)
    table = fmt.element.table()
    table = table[np.isfinite(table)]
    if fmt.zero_point is None and fmt.bias is None:
        return np.where(w >= 0, w * max(float(table.max()), 0.0), -w * min(float(table.min()), 0.0))
    return w * float(np.abs(table).max())


def verify_format(fmt: Format, rng: np.random.Generator, n: int = 65, m: int = 3) -> FormatCheck:
    """Quantise, prune, pack, reload and compare one format on a small random problem."""
    k = 2 * fmt.k_multiple
    w = format_weights(fmt, k, n, rng)
    result = FormatCheck(fmt, (k, n))
    q = quantize(fmt, w)
    result.quant_excess = _quantisation_excess(q, w)
    result.checks["quantise: nearest value"] = result.quant_excess <= 1e-9
    pq = prune(q)
    packed = pack_codes(pq)
    reloaded = PackedWeights(fmt, (k, n), {name: a.copy() for name, a in packed.arrays.items()})
    validate(reloaded)
    specs = fmt.buffers(k, n)
    result.checks["arrays: shapes and dtypes"] = all(
        packed[s.name].shape == s.shape and packed[s.name].dtype == s.dtype for s in specs
    )
    back = unpack(reloaded)
    same_keep = (back.keep is None and pq.keep is None) or np.array_equal(back.keep, pq.keep)
    result.checks["unpack(pack(codes)) == codes"] = bool(
        np.array_equal(back.codes, pq.codes) and same_keep
    )
    x = rng.standard_normal((m, k))
    exact = reference_matmul(x, back)
    direct = x @ dequantize(pq)
    result.checks["reference matmul"] = bool(np.allclose(exact, direct, rtol=1e-12, atol=0))
    if pq.keep is not None:
        per_block = pq.keep.reshape(k // fmt.sparsity.block_k, -1, n).sum(axis=1)
        result.checks["N:M kept per block"] = bool((per_block == fmt.sparsity.kept_per_block).all())
    reference = x @ w
    error, scale = float(np.linalg.norm(exact - reference)), float(np.linalg.norm(reference))
    # Informational; a format whose range makes every sample weight 0 has nothing to compare.
    result.matmul_rel_error = error / scale if scale > 0 else (0.0 if error == 0 else float("inf"))
    return result


def _quantisation_excess(q, w: np.ndarray) -> float:
    """max over elements of (|deq - w| - |nearest representable - w|) / scale.

    The nearest representable value is found by brute force over every table value; a
    round-to-nearest quantiser gives 0 here (up to float64 rounding, ~1e-15).
    """
    fmt = q.format
    k, n = w.shape
    g = fmt.group_size_for(k)
    table = fmt.element.table()
    table = table[np.isfinite(table)]  # reserved codes are not representable values
    a = fmt.scaling.affine({name: storage.to_float64(q.parameter(name))
                            for name, storage in fmt.parameters().items()})
    s = np.repeat(np.broadcast_to(a.scale, (fmt.scale.groups(k), n)), g, axis=0)
    z = np.zeros_like(s) if a.zero is None else np.repeat(a.zero, g, axis=0)
    bias = np.zeros_like(s) if a.bias is None else np.repeat(a.bias, g, axis=0)
    candidates = (table[None, None, :] - z[..., None]) * s[..., None] + bias[..., None]
    best = np.abs(candidates - w[..., None]).min(axis=-1)
    err = np.abs(dequantize(q) - w)
    return float(np.max((err - best) / np.abs(s)))
