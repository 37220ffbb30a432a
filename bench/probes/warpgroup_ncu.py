"""Launch prepared warpgroup kernels once each (for Nsight Compute): the kernels that
`bench/probes/warpgroup_gpu.py prepare DIR` wrote, at one shape, with fresh random inputs.

    ncu --section SpeedOfLight --section WarpStateStats ... \\
        python3 bench/probes/warpgroup_ncu.py DIR --kernels a,b --m 2048 --n 4096 --k 4096
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--kernels", required=True)
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    a = ap.parse_args()
    import mlx.core as mx

    import marlin_dsl as md
    from marlin_dsl.kernel_args import physical_arrays
    from marlin_dsl.targets.cuda.source import CudaSource
    sys.path.insert(0, str(ROOT / "bench" / "probes"))
    from warpgroup_gpu import Precompiled

    rng = np.random.default_rng(1)
    for name in a.kernels.split(","):
        e = json.loads((a.dir / f"{name}.json").read_text())
        src = CudaSource.from_json(e["source"])
        kern = Precompiled(src, (a.dir / f"{name}.cubin").read_bytes(), name)
        packed = md.pack(md.builtin_format(e["format"]), rng.standard_normal((a.k, a.n)).astype(np.float32))
        arrays = physical_arrays(src.attrs, packed)
        dt = mx.float16 if e["act"] == "f16" else mx.bfloat16
        x = mx.array(rng.standard_normal((a.m, a.k)).astype(np.float32)).astype(dt)
        scalars = {"M": a.m, "N": a.n, "K": a.k}
        inputs = [x if nm == "x" else mx.array(src.dims(scalars)) if nm == "dims" else
                  mx.array(np.ascontiguousarray(arrays[nm]).ravel()) for nm in src.input_names]
        mx.eval(*inputs)
        for _ in range(2):
            y = kern(mx, inputs, [(a.m, a.n)], [dt], scalars, None)[0]
            mx.eval(y)
        print(name, "ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
