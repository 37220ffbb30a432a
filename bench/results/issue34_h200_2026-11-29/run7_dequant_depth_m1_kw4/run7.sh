#!/bin/bash
# issue 34, run 7: the dequantize kernel's loads in flight (vectors per block : steps ahead), and
# M = 1 on 4096 x 14336 with 4 K warps (one wave of blocks) against the tuned 8
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/r7
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/r7/device.txt
timeout 240 python3 bench/probes/dequantize_gpu.py --out /tmp/r7/dq --no-main --formats fp4 --ms 1024 \
  --variants 8:1,8:2,4:2,16:2,8:4 > /tmp/r7/dq_variants.log 2>&1
echo "rc $?" >> /tmp/r7/dq_variants.log; grep -E "FAIL|Error|^variant|rc " /tmp/r7/dq_variants.log
timeout 120 python3 bench/probes/decode_sweep.py --kernels .s1b/kernels --out /tmp/r7/s1b --formats fp4 --ms 1 \
  --shapes 4096x14336 --baselines copy > /tmp/r7/s1b.log 2>&1; echo "s1b rc $?" >> /tmp/r7/s1b.log
python3 - <<'PY'
import json
d = json.load(open("/tmp/r7/s1b/decode_sweep.json"))
rows = d.get("rows", d) if isinstance(d, dict) else d
for r in rows:
    if isinstance(r, dict) and r.get("kernel"):
        print(r.get("kernel"), r.get("K"), r.get("N"), round(r.get("time_ns", 0) / 1e3, 2), r.get("registers"), r.get("occupancy_pct"))
PY
tail -4 /tmp/r7/s1b.log
cp .i34/r7.sh /tmp/r7/run7.sh; tar czf $OUT/run7.tgz -C /tmp r7
