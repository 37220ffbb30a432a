"""Lowering of formats and schedules to kernel IR.

`lower_gemm` is in `lowering/pipelines.py` (the registry of pipeline lowerings). This face
imports nothing, so that importing one lowering module does not load every lowering."""
