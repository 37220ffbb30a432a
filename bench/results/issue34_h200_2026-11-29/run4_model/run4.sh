#!/bin/bash
# issue 34, run 4: the 32-layer mlx-lm model's prefill with the dequantize route (default rows)
# and with our GEMMs at every row count (the route switched off), fp16 and mlx-lm 4-bit beside
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/r4
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/r4/device.txt
timeout 270 python3 bench/model_bench.py --variants fp16 mlx_4bit_g64 fp4 --prefill 512 2048 --decode-tokens 16 \
  --repeats 3 --out /tmp/r4/routed > /tmp/r4/routed.log 2>&1; echo "routed rc $?" >> /tmp/r4/routed.log
tail -8 /tmp/r4/routed.log
timeout 200 python3 - > /tmp/r4/gemm_only.log 2>&1 <<'PY'
import runpy, sys
sys.path.insert(0, ".")
import marlin_dsl.targets.cuda.tuning as t
t.DEQUANTIZE_MIN_M = t.DEQUANTIZE_MIN_M_SMALL = 1 << 30  # the route switched off
sys.argv = ["bench/model_bench.py", "--variants", "fp16", "fp4", "--prefill", "512", "2048", "--decode-tokens", "16",
            "--repeats", "3", "--out", "/tmp/r4/gemm_only"]
runpy.run_path("bench/model_bench.py", run_name="__main__")
PY
echo "gemm_only rc $?" >> /tmp/r4/gemm_only.log; tail -6 /tmp/r4/gemm_only.log
cp .i34/model.sh /tmp/r4/run4.sh; tar czf $OUT/run4.tgz -C /tmp r4
