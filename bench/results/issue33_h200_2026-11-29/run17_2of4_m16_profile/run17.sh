#!/bin/bash
# issue 33, run 17: the 2:4 decode at M = 16 profiled (decode_sweep timing + ncu full sets)
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python3 bench/probes/decode_sweep.py --kernels .gpuprof/kernels --out $OUT/sweep --formats fp4,fp4_2of4 --ms 1,16 \
  --shapes 4096x14336,14336x4096 --baselines copy \
  --metrics sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio \
  > $OUT/sweep.log 2>&1; echo "sweep rc $?" >> $OUT/sweep.log
tail -40 $OUT/sweep.log
timeout 330 ncu --set full --import-source no -k regex:fp4 -c 18 --cache-control all --clock-control none -o $OUT/full \
  python3 bench/probes/decode_sweep.py --drive --out /tmp/d2 --kernels .gpuprof/kernels --labels /tmp/l2.json \
  --shapes 4096x14336 --ms 16 --formats fp4,fp4_2of4 --baselines copy --passed $OUT/sweep/passed.json --copies 1 --seed 0 > $OUT/full.log 2>&1
echo "full rc $?"; tail -5 $OUT/full.log
cp /tmp/l2.json $OUT/full_labels.json
ncu -i $OUT/full.ncu-rep --page details --csv > $OUT/full_details.csv 2>&1
ncu -i $OUT/full.ncu-rep --page source --csv --print-source sass > $OUT/full_source.csv 2>&1
gzip $OUT/full_source.csv; ls -la $OUT
