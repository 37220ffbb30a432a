"""Independent numpy oracles for published quantised-weight formats.

Written from the published sources only (nothing from marlin_dsl is read or imported):
  * AutoGPTQ/AutoGPTQ      auto_gptq/nn_modules/qlinear/qlinear_cuda.py  (QuantLinear.pack / forward)
  * ModelCloud/GPTQModel   gptqmodel/nn_modules/qlinear/__init__.py (dequantize_weight, pack_block),
                           gptqmodel/utils/model.py (convert_gptq_v1_to_v2_format_module)
  * casper-hansen/AutoAWQ  awq/modules/linear/gemm.py (WQLinear_GEMM.from_linear),
                           awq/utils/packing_utils.py (unpack_awq, reverse_awq_order, dequantize_gemm)
  * bitsandbytes-foundation/bitsandbytes  bitsandbytes/functional.py (get_4bit_type, create_dynamic_map,
                           quantize_4bit, dequantize_4bit, quantize_blockwise, dequantize_blockwise),
                           csrc/kernels.cu (dDequantizeNF4, dDequantizeFP4Tree, dQuantizeNF4, dQuantizeFP4,
                           dQuantize<0>, kQuantizeBlockwise, kDequantizeBlockwise), csrc/ops.cu, CMakeLists.txt
Torch's f16 elementwise ops compute in float32 and round once to f16; numpy's float16 ufuncs do the same,
and the product of an f16 and a small integer is exact in f32, so the f16 results here are bit-identical.
"""
from fractions import Fraction

import numpy as np

# ----------------------------------------------------------------------------------------------- GPTQ


def _unpack_rows(q, bits):
    """int32 [R, C] packed along rows, LSB first -> uint32 codes [R*32/bits, C]."""
    u = np.ascontiguousarray(q, dtype=np.int32).view(np.uint32)
    sh = np.arange(0, 32, bits, dtype=np.uint32)
    return ((u[:, None, :] >> sh[None, :, None]) & np.uint32((1 << bits) - 1)).reshape(-1, u.shape[1])


def _unpack_cols(q, bits):
    """int32 [R, C] packed along columns, LSB first -> uint32 codes [R, C*32/bits]."""
    u = np.ascontiguousarray(q, dtype=np.int32).view(np.uint32)
    sh = np.arange(0, 32, bits, dtype=np.uint32)
    return ((u[:, :, None] >> sh[None, None, :]) & np.uint32((1 << bits) - 1)).reshape(u.shape[0], -1)


def _check_bits(bits):
    if bits not in (2, 4, 8):
        raise NotImplementedError("bits must be 2, 4 or 8 (the 3-bit split-word layout is not modelled)")


def gptq_dequantize(qweight, qzeros, scales, g_idx, bits, version=1):
    """GPTQ dequantisation -> float16 [K, N].

    Follows AutoGPTQ/AutoGPTQ auto_gptq/nn_modules/qlinear/qlinear_cuda.py, QuantLinear.forward (torch path):
    codes = (qweight >> wf).to(int8 [int16 for 8 bit]) & maxq; zeros = ((qzeros >> wf).to(int8) & maxq) + 1;
    weight = scales[g_idx] * (weight - zeros[g_idx]).  version=2 follows ModelCloud/GPTQModel
    gptqmodel/nn_modules/qlinear/__init__.py, BaseQuantLinear.dequantize_weight/_dequantize_from_codes, which
    is the same without the +1 (gptq_v2 stores the true zero point).
    Precision: code extraction in integers; (q - z) an int8/int16 difference (exact); the difference is
    converted to f16 (exact) and multiplied by the f16 scale with one f16 rounding (torch: f32 opmath, round).
    Note the v1 mask is applied BEFORE the +1, so a stored field of maxq gives zero = 2**bits (16 for 4 bit).
    (AutoGPTQ's sibling module qlinear_cuda_old.py masks AFTER the +1 in its torch path, giving 0 instead,
    and indexes groups by k // group_size rather than g_idx; this oracle follows qlinear_cuda.py.)
    """
    _check_bits(bits)
    it = np.int8 if bits <= 4 else np.int16
    q = _unpack_rows(qweight, bits).astype(it)                 # [K, N]
    z = _unpack_cols(qzeros, bits).astype(it)                  # [G, N]
    if version == 1:
        z = z + it(1)
    elif version != 2:
        raise ValueError("version must be 1 (AutoGPTQ, zero-1 stored) or 2 (GPTQModel gptq_v2)")
    g = np.asarray(g_idx).astype(np.int64)
    if g.shape[0] != q.shape[0]:
        raise ValueError(f"g_idx has {g.shape[0]} rows, qweight unpacks to {q.shape[0]}")
    diff = (q - z[g]).astype(np.float16)                       # int8/int16 -> f16, exact
    return np.asarray(scales, dtype=np.float16)[g] * diff      # one f16 rounding


def gptq_pack(intweight, zeros, bits, version=1):
    """Write (qweight int32 [K*bits/32, N], qzeros int32 [G, N*bits/32]) as the published packers do.

    version=1 follows AutoGPTQ/AutoGPTQ auto_gptq/nn_modules/qlinear/qlinear_cuda.py, QuantLinear.pack:
    intweight.numpy().astype(np.uint32); qweight[row] |= intweight[j] << (bits*(j-i)); then `zeros -= 1`,
    zeros.numpy().astype(np.uint32); qzeros[:, col] |= zeros[:, j] << (bits*(j-i)); .astype(np.int32).
    version=2 follows ModelCloud/GPTQModel gptqmodel/nn_modules/qlinear/__init__.py, pack_block (the qzeros
    "original numpy path" without the -1).
    No masking, exactly like the sources: a true zero of 0 in v1 becomes -1 -> 0xFFFFFFFF (numpy's float or
    int -> uint32 cast on x86-64), and `0xFFFFFFFF << shift` sets EVERY bit from that field up to bit 31, so
    that field and all higher fields of the same word read back as maxq (zero = maxq + 1 = 2**bits after the
    loader's +1). That is AutoGPTQ's wrap-around; in practice only asymmetric quantisation hits it.
    Integer arithmetic only (uint32, shifts wrap modulo 2**32).
    """
    _check_bits(bits)
    pf = 32 // bits
    sh = np.arange(0, 32, bits, dtype=np.uint32)
    w = np.asarray(intweight).astype(np.int64).astype(np.uint32)
    z = np.asarray(zeros).astype(np.int64) - (1 if version == 1 else 0)
    z = z.astype(np.uint32)                 # -1 -> 0xFFFFFFFF, as AutoGPTQ on x86-64 (float -1.0 -> uint32
    #                                         is undefined in C; aarch64 saturates it to 0 instead)
    K, N = w.shape
    if K % pf or z.shape[1] % pf:
        raise ValueError("K and N must be multiples of 32/bits")
    qw = np.bitwise_or.reduce(w.reshape(K // pf, pf, N) << sh[None, :, None], axis=1)
    qz = np.bitwise_or.reduce(z.reshape(z.shape[0], -1, pf) << sh[None, None, :], axis=2)
    return qw.view(np.int32), qz.view(np.int32)


# ------------------------------------------------------------------------------------------------ AWQ

AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])          # nibble i of a word holds column 8*c + AWQ_ORDER[i]
AWQ_REVERSE_ORDER = np.array([0, 4, 1, 5, 2, 6, 3, 7])  # column 8*c + j sits in nibble AWQ_REVERSE_ORDER[j]


def awq_dequantize(qweight, qzeros, scales, bits=4):
    """AWQ GEMM dequantisation -> float16 [K, N].

    Follows casper-hansen/AutoAWQ awq/utils/packing_utils.py, dequantize_gemm: unpack_awq (qweight >> shifts
    .to(int8), column-wise), reverse_awq_order (AWQ_REVERSE_ORDER per 8 columns), & (2**bits - 1),
    scales/izeros.repeat_interleave(group_size, dim=0), iweight = (iweight - izeros) * scales.
    Zeros are stored as-is (no -1). group_size = K // G.
    Precision: integer unpack; int8 difference (exact); int8 -> f16 exact; times the f16 scale, one f16
    rounding.
    """
    if bits != 4:
        raise NotImplementedError("AutoAWQ WQLinear_GEMM packs only 4-bit")
    q = _unpack_cols(qweight, bits).reshape(qweight.shape[0], -1, 8)[:, :, AWQ_REVERSE_ORDER]
    z = _unpack_cols(qzeros, bits).reshape(qzeros.shape[0], -1, 8)[:, :, AWQ_REVERSE_ORDER]
    q = q.reshape(q.shape[0], -1).astype(np.int8)
    z = z.reshape(z.shape[0], -1).astype(np.int8)
    gs = q.shape[0] // z.shape[0]
    g = np.arange(q.shape[0]) // gs
    return (q - z[g]).astype(np.float16) * np.asarray(scales, dtype=np.float16)[g]


def awq_pack(intweight, zeros, bits=4):
    """Write (qweight int32 [K, N/8], qzeros int32 [G, N/8]) for AWQ GEMM.

    Follows casper-hansen/AutoAWQ awq/modules/linear/gemm.py, WQLinear_GEMM.from_linear:
    order_map = [0, 2, 4, 6, 1, 3, 5, 7]; qweight[:, col] |= intweight[:, col*8 + order_map[i]] << (4*i),
    same for qzeros (zeros.to(int32), no -1). torch int32 << wraps like uint32; no masking (codes and zeros
    must be in 0..15). Integer arithmetic only.
    """
    if bits != 4:
        raise NotImplementedError("AutoAWQ WQLinear_GEMM packs only 4-bit")
    sh = np.arange(0, 32, bits, dtype=np.uint32)

    def pack(a):
        a = np.asarray(a).astype(np.int64).astype(np.uint32)
        a = a.reshape(a.shape[0], -1, 8)[:, :, AWQ_ORDER]
        return np.bitwise_or.reduce(a << sh[None, None, :], axis=2).view(np.int32)

    return pack(intweight), pack(zeros)


# ------------------------------------------------------------------------------------------ bitsandbytes


def _f32_literal(s):
    """A C `1.234f` literal: the decimal string correctly rounded straight to float32 (round half to even).
    Going through a Python double first can differ (double rounding) for decimals that are midpoints of two
    float32 values, which three of dQuantizeNF4's thresholds are."""
    f = Fraction(s)
    x = np.float32(float(f))
    c = [np.nextafter(x, np.float32(-np.inf)), x, np.nextafter(x, np.float32(np.inf))]
    return min(c, key=lambda v: (abs(Fraction(float(v)) - f), int(np.float32(v).view(np.uint32)) & 1))


def _ftz(x):
    """CUDA flush-to-zero: bitsandbytes builds its kernels with --use_fast_math (CMakeLists.txt), which
    implies -ftz=true for float32 operands and results."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(np.abs(x) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), x), x)


# csrc/kernels.cu nf4_dequantization_lut (dDequantizeNF4); identical, bit for bit, to get_4bit_type("nf4").
_NF4_LITERALS = (
    "-1.0", "-0.6961928009986877", "-0.5250730514526367", "-0.39491748809814453", "-0.28444138169288635",
    "-0.18477343022823334", "-0.09105003625154495", "0.0", "0.07958029955625534", "0.16093020141124725",
    "0.24611230194568634", "0.33791524171829224", "0.44070982933044434", "0.5626170039176941",
    "0.7229568362236023", "1.0")
BNB_NF4 = np.array([_f32_literal(s) for s in _NF4_LITERALS], dtype=np.float32)
# csrc/kernels.cu fp4_dequantization_lut + dDequantizeFP4Tree: lut[c & 7] * (1.0f - 2*((c & 8) >> 3)).
_FP4_LUT = np.array([_f32_literal(s) for s in (
    "0.0", "0.005208333333", "0.66666667", "1.0", "0.33333333", "0.5", "0.16666667", "0.25")], np.float32)
_codes16 = np.arange(16)
BNB_FP4 = (_FP4_LUT[_codes16 & 7] * (np.float32(1) - np.float32(2) * ((_codes16 & 8) >> 3))).astype(np.float32)
# Magnitudes equal get_4bit_type("fp4") ([0, .0625, 8, 12, 4, 6, 2, 3, -0, ...] / 12 in float32) bit for
# bit, but code 8 is -0.0 in the kernel, +0.0 in Python (the list holds the int -0, i.e. 0).

# csrc/kernels.cu dQuantizeNF4 decision tree: code = number of thresholds strictly below x (NaN -> 0).
_NF4_THRESH = np.array([_f32_literal(s) for s in (
    "-0.8480964004993439", "-0.6106329262256622", "-0.4599952697753906", "-0.33967943489551544",
    "-0.23460740596055984", "-0.13791173323988914", "-0.045525018125772476", "0.03979014977812767",
    "0.1202552504837513", "0.2035212516784668", "0.2920137718319893", "0.3893125355243683",
    "0.5016634166240692", "0.6427869200706482", "0.8614784181118011")], dtype=np.float32)
# csrc/kernels.cu dQuantizeFP4 tree on |x|: count of thresholds below |x| -> 3-bit code; sign = (x < 0) << 3.
_FP4_THRESH = np.array([_f32_literal(s) for s in (
    "0.00260417", "0.0859375", "0.20833333", "0.29166667", "0.4166667", "0.583333", "0.8333333")], np.float32)
_FP4_RANK_TO_CODE = np.array([0b000, 0b001, 0b110, 0b111, 0b100, 0b101, 0b010, 0b011], dtype=np.uint8)


def _table(quant_type):
    if quant_type == "nf4":
        return BNB_NF4
    if quant_type == "fp4":
        return BNB_FP4
    raise ValueError("quant_type must be 'nf4' or 'fp4'")


def _torch_linspace_f32(start, end, steps):
    """torch.linspace(start, end, steps, dtype=torch.float32) on CPU, following pytorch/pytorch
    aten/src/ATen/native/cpu/RangeFactoriesKernel.cpp linspace_kernel (scalar loop): step = (end - start) /
    (steps - 1) in float32; i < steps//2: start + step*i, else end - step*(steps - i - 1). The compiled
    kernel contracts each `a + step*i` into ONE fused multiply-add (checked: torch 2.11 CPU output equals the
    fused form and differs from the two-rounding form at 25 of the 124 points used by create_dynamic_map).
    The FMA is emulated exactly in float64 (f32 step times a small integer and the sum are exact there)."""
    s, e = np.float32(start), np.float32(end)
    step = np.float64((e - s) / np.float32(steps - 1))
    i = np.arange(steps)
    lo = np.float64(s) + step * i[: steps // 2]
    hi = np.float64(e) - step * (steps - i[steps // 2:] - 1)
    return np.concatenate([lo, hi]).astype(np.float32)


def bnb_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    """float32[256] as bitsandbytes/functional.py create_dynamic_map builds it.

    Per exponent i: boundaries = torch.linspace(0.1, 1, n, float32); means = (b[:-1] + b[1:]) / 2.0 (f32);
    (10 ** (-(max_exponent_bits - 1) + i)) * means: the Python double scalar is cast to f32 and multiplied in
    f32 (torch wrapped-number semantics); negated copies when signed; the `additional_items` block (reusing
    the loop's last i); append 0 and 1.0; pad with zeros to 256; Python sort; torch.tensor(float32) (exact).
    """
    data = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1

    def add(i, n):
        b = _torch_linspace_f32(0.1, 1.0, n)
        means = (b[:-1] + b[1:]) / np.float32(2.0)
        p = 10 ** (-(max_exponent_bits - 1) + i)
        data.extend((np.float32(p) * means).astype(np.float32).tolist())
        if signed:
            data.extend((np.float32(-p) * means).astype(np.float32).tolist())

    for i in range(max_exponent_bits):
        add(i, int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                   else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1))
    if additional_items > 0:
        add(max_exponent_bits - 1, additional_items + 1)
    data += [0, 1.0]
    assert len(data) == 2 ** total_bits
    data += [0] * (256 - len(data))
    data.sort()
    return np.array(data, dtype=np.float32)


def _dquantize8(code, x):
    """csrc/kernels.cu dQuantize<0> (non-stochastic): 7-step binary search from pivot 127 over the sorted
    code, then nearest of the two neighbours by float32 midpoints (upper + val) * 0.5f, strict compares."""
    code = np.asarray(code, np.float32)
    x = np.asarray(x, np.float32)
    pivot = np.full(x.shape, 127, np.int64)
    up_p = np.full(x.shape, 255, np.int64)
    lo_p = np.zeros(x.shape, np.int64)
    upper = np.full(x.shape, 1.0, np.float32)
    lower = np.full(x.shape, -1.0, np.float32)
    val = code[pivot]
    for i in (64, 32, 16, 8, 4, 2, 1):
        gt = x > val
        lo_p, lower = np.where(gt, pivot, lo_p), np.where(gt, val, lower)
        up_p, upper = np.where(gt, up_p, pivot), np.where(gt, upper, val)
        pivot = np.where(gt, pivot + i, pivot - i)
        val = code[pivot]
    upper = np.where(up_p == 255, code[255], upper)
    lower = np.where(lo_p == 0, code[0], lower)
    half = np.float32(0.5)
    gt = x > val
    res = np.where(gt, np.where(x > (upper + val) * half, up_p, pivot),
                   np.where(x < (lower + val) * half, lo_p, pivot))
    return res.astype(np.uint8)


def _blockwise_absmax_scale(x, blocksize):
    """kQuantizeBlockwise: absmax = max |x| over the block (fmaxf, ignores NaN), stored; the kernel then
    multiplies by 1.0f / absmax (float32; under --use_fast_math that reciprocal is rcp.approx and may be
    1 ulp off the IEEE value used here). The zero padding of a partial last block does not change the max."""
    n = x.size
    nb = -(-n // blocksize)
    xp = np.zeros(nb * blocksize, np.float32)
    xp[:n] = _ftz(x.reshape(-1))
    blocks = xp.reshape(nb, blocksize)
    absmax = np.fmax.reduce(np.abs(blocks), axis=1).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = _ftz(blocks * (np.float32(1.0) / _ftz(absmax))[:, None])   # 0 * inf = NaN for all-zero blocks
    return absmax, y.reshape(-1)  # padded length; the padding is the kernel's (T)0 fill times 1/absmax


def bnb_quantize_4bit(w, quant_type, blocksize=64, compress_statistics=False):
    """bitsandbytes quantize_4bit -> (packed uint8 [(n+1)//2, 1], absmax float32 [nb] or nested dict).

    Follows bitsandbytes/functional.py quantize_4bit and csrc/kernels.cu kQuantizeBlockwise /
    kQuantizeBlockwiseSmall with dQuantizeNF4 / dQuantizeFP4 (the kernels' threshold trees, reproduced
    exactly, not a nearest-entry search): byte = Q(x[2j]) << 4 | Q(x[2j+1]) (first element in the HIGH
    nibble). An all-zero block gives NaN inputs to the tree: NF4 code 0 (-1.0 * 0), FP4 code 0.
    compress_statistics: offset = absmax.mean(); quantize_blockwise(absmax - offset, blocksize=256) with
    create_dynamic_map() and dQuantize<0>. Float32 throughout. May differ from the CUDA quantiser where the
    fast-math rcp.approx of 1/absmax is 1 ulp off (values sitting on a threshold), and in the nested offset:
    torch's CUDA mean accumulates float32 in a tree, here the mean is computed in float64 and rounded once.
    """
    _table(quant_type)
    x = np.asarray(w, np.float32).reshape(-1)
    n = x.size
    absmax, y = _blockwise_absmax_scale(x, blocksize)
    y = y[: n + n % 2]                       # an odd tail byte gets the code of the zero fill
    if quant_type == "nf4":
        codes = (y[:, None] > _NF4_THRESH[None, :]).sum(axis=1).astype(np.uint8)
    else:
        rank = (np.abs(y)[:, None] > _FP4_THRESH[None, :]).sum(axis=1)
        codes = _FP4_RANK_TO_CODE[rank] | np.where(y < 0, 8, 0).astype(np.uint8)
    packed = ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8).reshape(-1, 1)
    if not compress_statistics:
        return packed, absmax
    offset = np.float32(np.mean(absmax.astype(np.float64)))
    centred = (absmax - offset).astype(np.float32)
    qmap = bnb_dynamic_map()
    nested_absmax, y2 = _blockwise_absmax_scale(centred, 256)
    return packed, {"absmax": _dquantize8(qmap, y2[: absmax.size]), "nested_absmax": nested_absmax,
                    "nested_quant_map": qmap, "offset": offset}


def bnb_nested_absmax(nested):
    """bitsandbytes/functional.py dequantize_4bit, nested branch: absmax = dequantize_blockwise(qabsmax,
    state2) (kDequantizeBlockwise General8bit: code[q] * absmax2[i // 256], one f32 multiply, fast-math FTZ),
    then `absmax += offset` (a separate torch f32 add, no FMA)."""
    q = np.asarray(nested["absmax"]).reshape(-1).astype(np.int64)
    code = np.asarray(nested["nested_quant_map"], np.float32)
    a2 = _ftz(np.asarray(nested["nested_absmax"], np.float32).reshape(-1))
    prod = _ftz(code[q] * a2[np.arange(q.size) // 256])
    return (prod + np.float32(nested["offset"])).astype(np.float32)


def bnb_dequantize_4bit(packed, shape, quant_type, absmax=None, blocksize=64, nested=None):
    """bitsandbytes dequantize_4bit -> float32 array of `shape` ([N, K]).

    Follows bitsandbytes/functional.py dequantize_4bit -> backends/cuda/ops.py _dequantize_4bit_impl ->
    csrc/ops.cu dequantizeBlockwise (passes blocksize/2 because it indexes bytes) -> csrc/kernels.cu
    kDequantizeBlockwise: vals[2j] = table[qvals[j] >> 4] * absmax, vals[2j+1] = table[qvals[j] & 0x0F] *
    absmax (first element in the HIGH nibble), one float32 multiply each (FTZ under --use_fast_math); the
    f16/bf16 kernels round that same f32 product once to the output type. nested: see bnb_nested_absmax.
    """
    table = _table(quant_type)
    n = int(np.prod(shape))
    b = np.asarray(packed, np.uint8).reshape(-1)
    codes = np.empty(2 * b.size, np.uint8)
    codes[0::2], codes[1::2] = b >> 4, b & 0x0F
    codes = codes[:n]
    if nested is not None:
        absmax = bnb_nested_absmax(nested)
    a = _ftz(np.asarray(absmax, np.float32).reshape(-1))[np.arange(n) // blocksize]
    return _ftz(table[codes] * a).reshape(shape)


# ------------------------------------------------------------------------------------------ self-check

if __name__ == "__main__":
    rng = np.random.default_rng(0)
    K, N, gs = 256, 64, 32
    G = K // gs
    for bits in (2, 4, 8):
        maxq = (1 << bits) - 1
        codes = rng.integers(0, maxq + 1, (K, N))
        scales = (rng.random((G, N)) * 0.1 + 0.001).astype(np.float16)
        g_idx = rng.permutation(np.arange(K) // gs).astype(np.int32)            # act-order style
        for version, zlo in ((1, 1), (2, 0)):
            zeros = rng.integers(zlo, maxq + 1, (G, N))
            qw, qz = gptq_pack(codes, zeros, bits, version)
            got = gptq_dequantize(qw, qz, scales, g_idx, bits, version)
            ref = (scales[g_idx].astype(np.float64) * (codes - zeros[g_idx])).astype(np.float16)
            assert got.dtype == np.float16 and np.array_equal(got.view(np.uint16), ref.view(np.uint16)), bits
        # GPTQModel v1 -> v2: qzeros += 0x..0101 per field (carry-free when no stored field is maxq)
        _, qz1 = gptq_pack(codes, zeros.clip(1, maxq), bits, 1)
        _, qz2 = gptq_pack(codes, zeros.clip(1, maxq), bits, 2)
        rep = sum(1 << s for s in range(0, 32, bits))
        assert np.array_equal((qz1.view(np.uint32) + np.uint32(rep)).view(np.int32), qz2)
        # AutoGPTQ v1 wrap-around: zero 0 in field 1 corrupts fields 1..pf-1 of that word
        z = np.full((G, N), 3)
        z[0, 1] = 0
        _, qz = gptq_pack(codes, z, bits, 1)
        dz = _unpack_cols(qz, bits).astype(np.int64) + 1
        assert (dz[0, 1:32 // bits] == maxq + 1).all() and dz[0, 0] == 3 and (dz[0, 32 // bits:] == 3).all()
    # AWQ
    codes = rng.integers(0, 16, (K, N))
    zeros = rng.integers(0, 16, (G, N))
    scales = (rng.random((G, N)) * 0.1 + 0.001).astype(np.float16)
    qw, qz = awq_pack(codes, zeros)
    assert np.array_equal((qw.view(np.uint32)[:, 0] >> 4) & 15, codes[:, 2])   # nibble 1 holds column 2
    assert np.array_equal((qw.view(np.uint32)[:, 0] >> 16) & 15, codes[:, 1])  # nibble 4 holds column 1
    got = awq_dequantize(qw, qz, scales)
    g = np.arange(K) // gs
    ref = ((codes - zeros[g]) * scales[g].astype(np.float64)).astype(np.float16)
    assert np.array_equal(got.view(np.uint16), ref.view(np.uint16))
    # bitsandbytes tables vs the Python get_4bit_type lists after float32 conversion
    py_nf4 = np.array([float(s) for s in _NF4_LITERALS], np.float32)    # Python list -> torch float32
    assert np.array_equal(BNB_NF4.view(np.uint32), py_nf4.view(np.uint32))
    py_fp4 = np.array([0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, -0, -0.0625, -8.0, -12.0, -4.0, -6.0,
                       -2.0, -3.0], np.float32)
    py_fp4 = py_fp4 / np.abs(py_fp4).max()
    assert np.array_equal(BNB_FP4, py_fp4) and np.signbit(BNB_FP4[8]) and not np.signbit(py_fp4[8])
    # torch 2.11 CPU torch.linspace(0.1, 1, 17, dtype=torch.float32), recorded as float32 bit patterns
    assert _torch_linspace_f32(0.1, 1.0, 17).view(np.uint32).tolist() == [
        1036831949, 1042284544, 1046059418, 1049205146, 1051092582, 1052980019, 1054867456, 1056754892,
        1057803469, 1058747187, 1059690906, 1060634624, 1061578342, 1062522061, 1063465779, 1064409498,
        1065353216]
    # nvcc --use_fast_math float-literal bits (device code) for the three midpoint thresholds
    assert [int(_f32_literal(s).view(np.uint32)) for s in ("0.5016634166240692", "0.1202552504837513",
            "-0.8480964004993439")] == [1056992515, 1039550563, 3210288345]
    assert np.all(np.diff(_NF4_THRESH) > 0) and np.all(np.diff(_FP4_THRESH) > 0)
    qmap = bnb_dynamic_map()
    assert qmap.shape == (256,) and np.all(np.diff(qmap) >= 0) and qmap[0] == -qmap[-2] and qmap[-1] == 1
    assert np.count_nonzero(qmap == 0) == 1
    # 8-bit dQuantize equals nearest code away from midpoints
    xs = rng.uniform(-1, 1, 20000).astype(np.float32)
    near = np.abs(xs[:, None] - qmap[None, :]).argmin(axis=1)
    assert np.mean(_dquantize8(qmap, xs) == near) > 0.999
    # 4-bit round trips (plain and nested), including an all-zero block and an odd tail
    Nw, Kw = 96, 128
    w = (rng.standard_normal((Nw, Kw)) * 0.02).astype(np.float32)
    w[0, :64] = 0
    for qt in ("nf4", "fp4"):
        tab = _table(qt)
        for nested in (False, True):
            packed, st = bnb_quantize_4bit(w, qt, 64, nested)
            kw = dict(nested=st) if nested else dict(absmax=st)
            deq = bnb_dequantize_4bit(packed, (Nw, Kw), qt, blocksize=64, **kw)
            am = bnb_nested_absmax(st) if nested else st
            true_am = np.abs(w.reshape(-1, 64)).max(axis=1)
            if nested:
                assert np.allclose(am, true_am, atol=2e-2 * true_am.max())
            else:
                assert np.array_equal(am, true_am)
            codes = np.stack([packed.reshape(-1) >> 4, packed.reshape(-1) & 15], 1).reshape(-1)
            ref = tab[codes] * np.repeat(am, 64)
            assert np.array_equal(deq.reshape(-1), ref.astype(np.float32)) and deq.dtype == np.float32
            with np.errstate(invalid="ignore"):
                x = (w.reshape(-1, 64) / true_am[:, None]).reshape(-1)
            nearest = np.abs(x[:, None] - tab[None, :]).argmin(axis=1)
            ok = (tab[codes] == tab[nearest]) | ~np.isfinite(x)
            assert ok.mean() > 0.999, (qt, ok.mean())
            if not nested:
                err = np.abs(deq - w).reshape(-1, 64).max(axis=1)
                assert np.all(err <= 0.5 * np.diff(np.sort(tab)).max() * true_am + 1e-12)
        p_odd, a_odd = bnb_quantize_4bit(w.reshape(-1)[:65], qt, 64)
        d_odd = bnb_dequantize_4bit(p_odd, (65,), qt, absmax=a_odd)
        assert p_odd.shape == (33, 1) and (p_odd[-1, 0] & 15) == (7 if qt == "nf4" else 0) and d_odd.shape == (65,)
    print("published_oracles self-check: OK")
