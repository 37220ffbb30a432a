#!/bin/bash
# issue 34, run 1: small M on the H200: the read floor, PyTorch's peers, and the decode schedules
export PYTHONPATH=/tmp/site:$PWD
S=4096x4096,4096x14336,14336x4096
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
timeout 60 ncu --cache-control all --clock-control none --metrics gpu__time_duration.sum -k regex:mdsl_probe \
  python3 bench/probes/read_floor_probe.py > $OUT/floor_ncu.txt 2>&1
python3 bench/probes/read_floor_probe.py --report $OUT/floor_ncu.txt > $OUT/floor.txt 2>&1; cat $OUT/floor.txt
timeout 150 python3 bench/torch_peers.py --out $OUT/peers_small --ms 1,16 --subjects torch_fp16,torch_bf16,torch_tinygemm_int4 \
  > $OUT/peers_small.log 2>&1; echo "peers rc $?" >> $OUT/peers_small.log; tail -22 $OUT/peers_small.log
timeout 170 python3 bench/probes/decode_sweep.py --kernels .s1/kernels --out $OUT/s1 --formats fp4 --ms 1 --shapes $S \
  --baselines copy,mlx_q4 > $OUT/s1.log 2>&1; echo "s1 rc $?" >> $OUT/s1.log; tail -25 $OUT/s1.log
timeout 130 python3 bench/probes/decode_sweep.py --kernels .s16/kernels --out $OUT/s16 --formats fp4 --ms 16 --shapes $S \
  --baselines copy,mlx_q4 > $OUT/s16.log 2>&1; echo "s16 rc $?" >> $OUT/s16.log; tail -20 $OUT/s16.log
