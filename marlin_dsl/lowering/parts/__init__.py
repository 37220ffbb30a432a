"""Shared parts of the lowerings: the emitter helpers (`emit.py`), the lowering context
(`context.py`), the kernel shell (`shell.py`), operand sources (`staged.py`: threadgroup-staged
tiles; `registers.py`: global memory to registers; `async_stages.py`: asynchronous shared-memory
stages), the stream-layout family's setup and MMAs (`stream_family.py`) and the epilogues
(`epilogues.py`). A pipeline's lowering (`lowering/<pipeline>.py`) is assembled from them."""
