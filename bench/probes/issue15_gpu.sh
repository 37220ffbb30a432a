#!/usr/bin/env bash
# Issue 15's measurements on the lent H100, in phases that each fit one device call (see
# ../shared/GPU.md for staging MLX's CUDA backend first). Every phase writes under $OUT and
# prints a short table last.
#
#   phase kernels : warpgroup kernels (prepared here into .wgk by bench/probes/warpgroup_gpu.py
#                   prepare): correctness on every format and speed against fp16, MLX 4-bit and
#                   multistage at M = 128..2048; GEMM correctness of the weight-stream and
#                   multistage kernels (the new decode); compute-sanitizer memcheck.
#   phase decode  : bench/probes/decode_sweep.py under ncu (M = 1, 16; kernels prepared into
#                   .sweep_kernels by its --dry-run), with the copy baseline.
#   phase layers  : MarlinLinear and a whole mlx-lm model (needs .gpu3 installed).
set -uo pipefail
phase="${1:?phase: kernels | decode | layers}"
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
out="${OUT:?}"
case "$phase" in
  kernels)
    python3 bench/probes/warpgroup_gpu.py run .wgk --out "$out" 2>&1 | grep -v " ok$" | tail -25
    timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 bench/probes/warpgroup_ncu.py .wgk \
      --kernels "$(python3 -c 'import json;print(",".join(n for n in json.load(open(".wgk/index.json")) if "multistage" not in n)[:400])')" \
      --m 300 --n 4104 --k 4224 > "$out/memcheck_warpgroup.log" 2>&1
    tail -3 "$out/memcheck_warpgroup.log"
    ;;
  decode)
    timeout 100 python3 bench/gpu_correctness.py --pipelines weight_stream --quick --out "$out/gemm" 2>&1 | tail -3
    python3 bench/probes/decode_sweep.py --kernels .sweep_kernels --out "$out" --k-warps 8,16 --depth 1,2 --unroll 1 \
      --vectors 1,2 2>&1 | tail -30
    ;;
  layers)
    timeout 150 python3 bench/layer_bench.py --m 1 16 512 2048 --formats fp4 --calls 200 --repeats 5 \
      --out "$out/layer_bench.json" 2>&1 | tail -12
    timeout 380 python3 bench/model_bench.py --layers 32 --repeats 2 --decode-tokens 64 --prefill 512 2048 \
      --variants fp16 mlx_4bit_g64 fp4 fp4_2of4 --out "$out/model_bench.json" 2>&1 | tail -16
    ;;
esac
