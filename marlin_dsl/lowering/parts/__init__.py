"""Shared parts of the lowerings: the emitter helpers (`emit.py`), the lowering context
(`context.py`), the kernel shell (`shell.py`), operand sources (`staged.py`: threadgroup-staged
tiles; `registers.py`: global memory to registers; `async_stages.py`: asynchronous shared-memory
stages; `register_stages.py`: shared-memory stages fed through registers, for targets without
asynchronous copies; `stage_buffers.py`: the reads back from either), the stream-layout family's
setup and MMAs (`stream_family.py`) and the epilogues (`epilogues.py`). A pipeline's lowering (`lowering/<pipeline>.py`) is assembled from them."""
