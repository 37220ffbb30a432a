#!/bin/bash
# issue 34, run 8: Nsight Compute's full set on the dequantize kernel (fp4 f16, 4096 x 14336)
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/r8
timeout 200 ncu --set full -k regex:dequantize -s 1 -c 1 -o /tmp/r8/dq python3 bench/probes/dequantize_gpu.py --out /tmp/r8/x \
  --no-main --variants 8:1 --formats fp4 --acts f16 --ms 1024 --shapes 4096x14336 > /tmp/r8/ncu_run.log 2>&1
echo "rc $?" >> /tmp/r8/ncu_run.log; tail -3 /tmp/r8/ncu_run.log
ncu -i /tmp/r8/dq.ncu-rep --page details --csv > /tmp/r8/details.csv 2>&1
python3 - <<'PY'
import csv
rows = list(csv.reader(open("/tmp/r8/details.csv")))
hdr = rows[0]
keep = ("Duration", "DRAM Throughput", "Memory Throughput", "L1/TEX Hit", "L2 Hit", "Achieved Occupancy",
        "Registers Per Thread", "Issue Slots Busy", "Executed Ipc Active", "Mem Busy", "Max Bandwidth",
        "Stall", "Theoretical Occupancy", "Waves Per SM", "Block Limit", "L2 Compression", "Uncoalesced", "Excessive")
i_name, i_val, i_unit = hdr.index("Metric Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
for r in rows[1:]:
    if len(r) > i_val and any(k in r[i_name] for k in keep):
        print(r[i_name], r[i_val], r[i_unit])
PY
ncu -i /tmp/r8/dq.ncu-rep --page details --print-details all 2>/dev/null | grep -iE "uncoalesced|excessive|sectors|est. speedup" | head -20
cp .i34/r8.sh /tmp/r8/run8.sh; rm -f /tmp/r8/dq.ncu-rep; tar czf $OUT/run8.tgz -C /tmp r8
