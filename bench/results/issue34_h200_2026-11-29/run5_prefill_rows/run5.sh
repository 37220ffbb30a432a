#!/bin/bash
# issue 34, run 5: the two routes at the model's prefill rows (mlx-lm prefills 2048 tokens as
# 2047 + 1) on the model's four layer shapes, and compute-sanitizer memcheck of the route
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/r5
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/r5/device.txt
timeout 300 python3 bench/probes/dequantize_gpu.py --out /tmp/r5/model_shapes --formats fp4 --ms 1536,2047 \
  --shapes 4096x6144,4096x4096,4096x28672,14336x4096 > /tmp/r5/model_shapes.log 2>&1
echo "rc $?" >> /tmp/r5/model_shapes.log; grep -E "FAIL|Error|^time|checks:|rc " /tmp/r5/model_shapes.log
timeout 200 compute-sanitizer --tool memcheck python3 bench/probes/dequantize_gpu.py --out /tmp/r5/memcheck \
  --formats fp4,nf4 --acts f16,bf16 --ms 64 --shapes 1024x640 > /tmp/r5/memcheck.log 2>&1
echo "memcheck rc $?" >> /tmp/r5/memcheck.log; grep -E "ERROR SUMMARY|checks:|rc " /tmp/r5/memcheck.log
cp .i34/dq2.sh /tmp/r5/run5.sh; tar czf $OUT/run5.tgz -C /tmp r5
