"""The ecosystem's checkpoints described in the DSL (issue 36): how GGUF (llama.cpp), GPTQ,
AWQ and bitsandbytes *store* a weight, declared with the storage vocabulary of
marlin_dsl.formats.checkpoint, beside the kernel format that holds its arithmetic.

- `Record`: a GGUF block's fields stored together. `Scalar` is an f16 at a byte offset;
  `Bits` assembles integers from bit slices of the record's bytes; `plane` is a run of bytes
  of `width`-bit fields whose element order is a reshape and a transpose.
- `Words`: codes packed into integer words along K or N, in any order within a word,
  signed words read as bits, stored = value - offset.
- `GroupIndex`: act-order's g_idx. Groups become contiguous by permuting K, and the layer
  permutes x to match.
- `SuperBlockScale`: llama.cpp's k-quant scales, 6-bit (or int8) sub-scales and mins under f16
  super-scales. It is a scale scheme, so the kernels decode it themselves.

Reading, writing, the float64 reference and every kernel are derived from these
declarations. The library's catalogue (formats/checkpoint/catalog.py: gguf_format(...),
gptq(...), awq(...), bnb(...)) declares the same; tests/test_checkpoint_formats.py holds the
two equal and checks them bit for bit against gguf's dequantiser and the published GPTQ, AWQ
and bitsandbytes code.
"""
from dataclasses import replace

from marlin_dsl import (Format, Gemm, GroupScale, IntEncoding, Schedule, SuperBlockScale, WeightStream, ZeroPoint,
                        tuned_schedule)
from marlin_dsl.formats.checkpoint import (Bits, CheckpointFormat, GroupIndex, Packed, Plain, Record, Records,
                                           Scalar, Words, plane, run)

# ----- GGUF Q4_K: 256 weights in 144 bytes ----------------------------------------------------
# struct block_q4_K { half d; half dmin; uint8_t scales[12]; uint8_t qs[128]; }
# value = q * (d * sc) - dmin * m, with one 6-bit sc and m for each 32 weights.
q4_k_record = Record(256, 144, (
    Scalar("d", "f16", 0),
    Scalar("dmin", "f16", 2),
    # llama.cpp's get_scale_min_k4: scales 0-3 and mins 0-3 are the low 6 bits of bytes 0-3 and
    # 4-7 of the 12; scales and mins 4-7 take 4 low bits from bytes 8-11 and 2 high bits
    # from the top of bytes 0-3 (scales) and 4-7 (mins).
    Bits("scales", 8, (run(4, range(0, 4), 0, 6), run(12, range(4, 8), 0, 4), run(4, range(4, 8), 6, 2, to=4))),
    Bits("mins", 8, (run(8, range(0, 4), 0, 6), run(12, range(4, 8), 4, 4), run(8, range(4, 8), 6, 2, to=4))),
    # 4 chunks of 32 bytes: low nibbles are weights 0-31 of the chunk's 64, high nibbles 32-63.
    Bits("q", 256, (plane(16, 128, 4, grid=(4, 32, 2), order=(0, 2, 1)),)),
))
gguf_q4_k = Format("gguf_q4_k", IntEncoding(4), SuperBlockScale(32, 256),
                   doc="GGUF Q4_K: q * (d * sc) - dmin * m, 6-bit sc and m per 32, f16 d and dmin per 256")
q4_k = CheckpointFormat("gguf_q4_k", gguf_q4_k, (Records("weight", q4_k_record, (
    ("d", "super_scales"), ("dmin", "super_mins"), ("scales", "scales"), ("mins", "mins"), ("q", "codes"))),))

# ----- GGUF Q6_K: 256 weights in 210 bytes ----------------------------------------------------
# struct block_q6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; half d; }
# value = (q - 32) * (d * sc), a signed 8-bit sc for each 16 weights.
q6_k_record = Record(256, 210, (
    Bits("q", 256, (plane(0, 128, 4, grid=(2, 64, 2), order=(0, 2, 1)),          # low 4 bits
                    plane(128, 64, 2, grid=(2, 32, 4), order=(0, 2, 1), to=4))),  # high 2 bits
    Bits("scales", 16, (plane(192, 16, 8),)),  # int8, held as its bits (SuperBlockScale sub="i8")
    Scalar("d", "f16", 208),
))
gguf_q6_k = Format("gguf_q6_k", IntEncoding(6, offset=32),
                   SuperBlockScale(16, 256, sub_dtype="i8", mins="none", sub_max=127),
                   doc="GGUF Q6_K: (q - 32) * (d * sc), int8 sc per 16, f16 d per 256")
q6_k = CheckpointFormat("gguf_q6_k", gguf_q6_k, (Records("weight", q6_k_record, (
    ("d", "super_scales"), ("scales", "scales"), ("q", "codes"))),))

# ----- GPTQ (AutoGPTQ v1), 4-bit, group 128, act-order ----------------------------------------
gptq_4bit = Format("gptq_v1_4bit_g128", IntEncoding(4), GroupScale(128), ZeroPoint("u8"), doc="GPTQ v1, 4-bit")
gptq = CheckpointFormat("gptq_v1_4bit_g128", gptq_4bit, (
    Packed("qweight", "codes", Words(4, "i32", "K")),              # int32 [K/8, N], low bits first
    Packed("qzeros", "zeros", Words(4, "i32", "N", offset=1)),     # int32 [K/G, N/8], stores z - 1
    Plain("scales", "scales"),                                      # f16 [K/G, N]
    GroupIndex("g_idx"),                                            # int32 [K]: each row's group
))

# ----- AWQ GEMM, 4-bit, group 128 -------------------------------------------------------------
awq_words = Words(4, "i32", "N", order=(0, 2, 4, 6, 1, 3, 5, 7))  # AutoAWQ's interleave
awq_4bit = Format("awq_4bit_g128", IntEncoding(4), GroupScale(128), ZeroPoint("u8"), doc="AWQ GEMM, 4-bit")
awq = CheckpointFormat("awq_4bit_g128", awq_4bit, (
    Packed("qweight", "codes", awq_words), Packed("qzeros", "zeros", awq_words), Plain("scales", "scales")))

# The kernels: CUDA's tuned decode schedule (one row, Llama-3-8B's 4096 x 4096) for Q4_K and
# GPTQ, declared for CUDA only (Metal's weight stream steps 128 K positions, past Q4_K's groups
# of 32; its own tuned schedules take them). Both read the kernel formats' own layouts: the
# checkpoints are re-laid out at load (docs/DECISIONS.md).
q4_k_decode = Gemm("gguf_q4_k_decode", gguf_q4_k,
                   replace(tuned_schedule(gguf_q4_k, 1, k=4096, n=4096), name="cuda_q4_k_m1", targets=("cuda",)))
gptq_decode = Gemm("gptq_4bit_g128_decode", gptq_4bit,
                   replace(tuned_schedule(gptq_4bit, 1, k=4096, n=4096), name="cuda_gptq_m1", targets=("cuda",)))

# Metal's small-M kernel (the tuned schedule of `quantized_linear` for M <= 8, as in
# dense_fp4.py): one 128-bit load a lane a K step of 128 positions, on the weights re-laid out
# for the simdgroup lanes at load.
metal_m8 = Schedule("metal_stream_m8", tile_m=8, tile_n=128, tile_k=128, warps_m=1, warps_n=8,
                    pipeline=WeightStream(k_warps=2), targets=("metal",))
q4_k_metal = Gemm("gguf_q4_k_stream", gguf_q4_k, metal_m8)
gptq_metal = Gemm("gptq_4bit_g128_stream", gptq_4bit, metal_m8)
