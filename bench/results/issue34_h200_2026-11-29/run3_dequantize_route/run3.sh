#!/bin/bash
# issue 34, run 3: the dequantize route for large M against our GEMM and fp16/bf16 mx.matmul (layers, H200)
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/r3
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/r3/device.txt
timeout 420 python3 bench/probes/dequantize_gpu.py --out /tmp/r3 > /tmp/r3/dequantize_gpu.log 2>&1
echo "dq rc $?" >> /tmp/r3/dequantize_gpu.log
grep -E "FAIL|Error|^time|checks:|rc " /tmp/r3/dequantize_gpu.log | tail -60
cp .i34/dq.sh /tmp/r3/run3.sh; tar czf $OUT/run3.tgz -C /tmp r3
