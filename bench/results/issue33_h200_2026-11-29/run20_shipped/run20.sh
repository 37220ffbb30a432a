#!/bin/bash
# issue 33, run 20: the shipped text (CUDA's __shfl_xor_sync) of the tuned M = 16 kernels, and memcheck
export PYTHONPATH=/tmp/site:$PWD
M="sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
timeout 250 python3 bench/probes/decode_sweep.py --kernels .r20/kernels --out $OUT/tuned --formats fp4,fp4_2of4,int4_2of4 \
  --ms 16 --shapes 4096x4096,4096x14336,14336x4096 --baselines copy --metrics $M > $OUT/tuned.log 2>&1; echo "tuned rc $?" >> $OUT/tuned.log
tail -30 $OUT/tuned.log
timeout 90 compute-sanitizer --tool memcheck python3 bench/probes/decode_sweep.py --kernels .r20/kernels --out $OUT/memcheck \
  --formats fp4_2of4,int4_2of4 --ms 16 --shapes 4096x4096 --timer wall --batch 1 --repeats 1 --copies 1 --baselines "" \
  > $OUT/memcheck.log 2>&1; echo "memcheck rc $?" >> $OUT/memcheck.log
grep -E "ERROR SUMMARY|kernels correct|rc " $OUT/memcheck.log
