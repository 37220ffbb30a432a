#!/bin/bash
# issue 34, run 2: large M on the H200: warpgroup kernels (A in registers with the decode under
# the wgmmas, against the tuned A-in-shared-memory kernel) and PyTorch's cuBLAS in one call
export PYTHONPATH=/tmp/site:$PWD
export WG_SCHEDULE_SPECS="wga256x128s4d2:256:8:4:2:registers+ahead,wgs256x128s4d2:256:8:4:2:shared,wga128x128s4d2:128:8:4:2:registers+ahead,wgr256x128s4d2:256:8:4:2:registers"
export WG_TIME_MS=256,512,1024,2048
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
WG_FORMATS=fp4,uint4_zp timeout 230 python3 bench/probes/warpgroup_gpu.py run .wg1 --out $OUT/wg_fp4 > $OUT/wg_fp4.log 2>&1
echo "wg_fp4 rc $?" >> $OUT/wg_fp4.log; grep -E "FAIL|ERROR|^  M=|correctness|rc " $OUT/wg_fp4.log
timeout 150 python3 bench/torch_peers.py --out $OUT/peers_large --ms 256,512,1024,2048 --subjects torch_fp16,torch_bf16 \
  > $OUT/peers_large.log 2>&1; echo "peers rc $?" >> $OUT/peers_large.log; tail -28 $OUT/peers_large.log
WG_FORMATS=uint4_zp,fp4 timeout 200 python3 bench/probes/warpgroup_gpu.py run .wg2 --out $OUT/wg_uint4_zp > $OUT/wg_uint4_zp.log 2>&1
echo "wg_uint4_zp rc $?" >> $OUT/wg_uint4_zp.log; grep -E "FAIL|ERROR|^  M=|correctness|rc " $OUT/wg_uint4_zp.log
