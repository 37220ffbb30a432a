"""A transformer MLP's decode kernels with the work around the GEMMs in their epilogues
(marlin_dsl/epilogue.py; issue 35): the fused gate/up projection computes silu(gate) * up and
writes I columns instead of 2I, the down projection adds the block's residual. Both round once,
after the epilogue. `marlin_dsl.models.convert` builds these for mlx-lm's llama, qwen2 and
qwen3 blocks (models/fused_block.py)."""
from marlin_dsl import Epilogue, Gemm, builtin_format, tuned_schedule

fp4 = builtin_format("fp4")  # FP4 E2M1, f16 scales per 32
decode = tuned_schedule(fp4, 1)  # the weight stream for one row of activations

# Columns of the fused weight alternate between 8 gate and 8 up columns
# (marlin_dsl.epilogue.gate_interleave); y has half the GEMM's columns.
gate_up = Gemm("fp4_gate_up_silu", fp4, decode, epilogue=Epilogue(gate="silu"))
# y = x @ W + bias + residual (an attention or MLP output added to the block's input).
down = Gemm("fp4_down_residual", fp4, decode, epilogue=Epilogue(bias=True, residual=True))
