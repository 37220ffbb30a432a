#!/bin/bash
# issue 33, run 18: 2:4 activation loads shared through warp shuffles (WeightStream.x_shuffle)
export PYTHONPATH=/tmp/site:$PWD
M="sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"
S=4096x4096,4096x14336,14336x4096
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
for spec in "$@"; do
  IFS=: read name dir formats ms <<< "$spec"
  timeout ${T:-280} python3 bench/probes/decode_sweep.py --kernels $dir/kernels --out $OUT/$name --formats $formats --ms $ms \
    --shapes $S --baselines copy --metrics $M > $OUT/$name.log 2>&1; echo "$name rc $?" >> $OUT/$name.log
  rm -rf $OUT/$name/kernels
  tail -22 $OUT/$name.log
done
