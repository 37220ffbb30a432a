#!/bin/bash
# issue 34, run 6: the model's prefill with the route's measured rows, and with the route off
# (our GEMMs at every row count), fp16 in each process; 5 rounds
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/r6
for route in on off; do
timeout 200 python3 - $route > /tmp/r6/route_$route.log 2>&1 <<'PY'
import runpy, sys
sys.path.insert(0, ".")
import marlin_dsl.targets.cuda.tuning as t
route = sys.argv[1]
if route == "off":
    t.DEQUANTIZE_MIN_M = t.DEQUANTIZE_MIN_M_SMALL = 1 << 30
sys.argv = ["bench/model_bench.py", "--variants", "fp16", "fp4", "--prefill", "512", "2048", "--decode-tokens", "8",
            "--repeats", "5", "--out", f"/tmp/r6/route_{route}"]
runpy.run_path("bench/model_bench.py", run_name="__main__")
PY
echo "route $route rc $?" >> /tmp/r6/route_$route.log; grep -E "prefill|rc " /tmp/r6/route_$route.log | tail -4
done
cp .i34/model2.sh /tmp/r6/run6.sh; tar czf $OUT/run6.tgz -C /tmp r6
