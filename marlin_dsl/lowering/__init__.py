"""Lowering of formats and schedules to kernel IR.

`lower_gemm` is in `lowering/pipelines.py` (the registry of pipeline lowerings). This face
imports nothing, so that the spec-level pipeline checks (`marlin_dsl/pipelines/`) can read
`lowering/stream_layout.py` without loading the lowerings, which read the schedule."""
