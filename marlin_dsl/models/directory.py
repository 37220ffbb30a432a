"""`convert_directory`: an mlx-lm model directory in, a converted model directory out, with
the protections a command that writes gigabytes needs: the destination is checked before
anything is loaded, written beside itself and renamed into place (models/destination.py), a
source that is already converted is refused, and an error names the source tensor and its
shard file."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import MarlinDSLError, ValueRangeError
from ..formats.builtin import GroupSize
from ..nn import Backend
from .checkpoint import CONFIG, MODEL_FILE, SECTION, save_model
from .destination import check_destination, check_not_inside
from .loading import model_directory
from .mlx_lm_env import require_mlx_lm
from .rules import FormatChoice
from .shards import tensor_files

if TYPE_CHECKING:
    from .convert import Conversion


def check_source(src: str | Path, argument: str = "src") -> tuple[Path, dict[str, Any]]:
    """(directory, config) of a model directory that can be converted, or MarlinDSLError: not a
    model directory, already converted, or built by its own code (config "model_file")."""
    source, config = model_directory(src, argument)
    if SECTION in config:
        raise MarlinDSLError(f"{argument}: {source} is already converted by marlin-dsl (its {CONFIG} has a "
                             f"{SECTION!r} section); convert the original model instead")
    if config.get("model_file") not in (None, MODEL_FILE):
        raise MarlinDSLError(f"{argument}: {source} builds its model with its own code ({CONFIG} names "
                             f"model_file {config['model_file']!r}); only mlx-lm's own architectures convert")
    return source, config


def convert_directory(src: str | Path, dst: str | Path, format: FormatChoice = "fp4", *,
                      group_size: GroupSize | None = None, backend: Backend = "auto",
                      progress: Any = None, overwrite: bool = False) -> "Conversion":
    """Convert an mlx-lm model directory (fp16/bf16/f32, or quantised by MLX) into `dst`:
    load it with mlx-lm (lazily), `convert` its linear layers, `save_model` with the source's
    other files (tokenizer, ...). Returns the Conversion (formats per layer, skipped layers,
    seconds).

    `dst` must not exist or be empty, unless `overwrite` (then it must be a model directory,
    and is replaced only once the new one is complete); an error leaves it as it was. A
    source converted already is refused. Needs mlx-lm."""
    require_mlx_lm("convert_directory")
    from mlx_lm.utils import load_model

    from .convert import convert

    source, _ = check_source(src)
    target = Path(dst)
    check_not_inside(target, source)
    check_destination(target, overwrite)  # before minutes of work, not after
    try:
        model, config = load_model(source, lazy=True)
    except (ValueError, KeyError, TypeError, FileNotFoundError, RuntimeError) as err:
        raise MarlinDSLError(f"src: mlx-lm cannot load {source}: {type(err).__name__}: {err}") from None
    try:
        conversion = convert(model, format, group_size=group_size, backend=backend, progress=progress)
    except MarlinDSLError as err:
        raise _in_shard(err, source) from None
    save_model(model, target, config, source_dir=source, overwrite=overwrite)
    return conversion


def _in_shard(err: MarlinDSLError, source: Path) -> MarlinDSLError:
    """`err` (a bad value in a source tensor), prefixed with the shard file that holds the
    tensor it names first; other errors as they are."""
    if not isinstance(err, ValueRangeError):
        return err
    name = err.message.split(":", 1)[0]
    try:
        shard = tensor_files(source).get(name)
    except MarlinDSLError:  # the message is about the tensor; an odd shard must not hide it
        shard = None
    return type(err)(f"{source / shard}: {err.message}", err.location) if shard else err


__all__ = ["check_source", "convert_directory"]
