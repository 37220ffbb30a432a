"""Physical layouts: where a kernel wants an operand's arrays, derived from a description (a
format, a sparsify declaration) and a target's lane tables, never hard-coded per target.

- `weight_stream.py`: the weight-stream pipelines' fragment-ordered weights (`lane_stream`).
- `sparse_activation.py`: a run-time sparsified activation operand, in a target's sparse MMA
  fragment order or row-major.

They sit between the formats and the schedules: the pipelines' checks, the tuned schedules, the
lowering, the launchers and the layers all read them. The face imports nothing.
"""
