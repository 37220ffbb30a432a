"""Which GPU backend MLX has here (`gpu_backend`), and what the machine is: the bench runs only
on MLX's CUDA or Metal backend and says clearly what a machine without one has."""
from __future__ import annotations

import platform

from ..errors import EnvironmentUnavailable


def machine() -> str:
    return f"{platform.system()} {platform.machine()}, Python {platform.python_version()}"


def gpu_backend(mx=None) -> str:
    """'cuda' or 'metal', or EnvironmentUnavailable saying what this machine has."""
    needs = "marlin-dsl bench needs MLX's CUDA (or Metal) GPU backend; this machine has "
    if mx is None:
        try:
            import mlx.core as mx
        except ImportError as exc:
            raise EnvironmentUnavailable(needs + f"no importable MLX ({exc}); {machine()}. Run it on an NVIDIA GPU "
                                 "machine with pip install \"marlin-dsl[cuda]\" (MLX's CUDA backend), or on "
                                 "an Apple-silicon Mac") from None
    try:
        cuda = bool(hasattr(mx, "cuda") and mx.cuda.is_available())
    except Exception:  # noqa: BLE001
        cuda = False
    if cuda:
        return "cuda"
    try:
        metal = bool(mx.metal.is_available())
    except Exception:  # noqa: BLE001
        metal = False
    if metal:
        return "metal"
    raise EnvironmentUnavailable(
        needs + f"MLX {getattr(mx, '__version__', '?')} with no GPU backend (default device "
        f"{mx.default_device()}; mx.cuda.is_available() and mx.metal.is_available() are false); "
        f"{machine()}. Run it on an NVIDIA GPU machine with pip install \"marlin-dsl[cuda]\" (MLX's "
        "CUDA backend), or on an Apple-silicon Mac")


def device_info(mx) -> dict:
    for get in (getattr(mx, "device_info", None), getattr(getattr(mx, "metal", None), "device_info", None)):
        if get is None:
            continue
        try:
            return {k: (v if isinstance(v, (int, float, str)) else str(v)) for k, v in get().items()}
        except Exception:  # noqa: BLE001
            continue
    return {}

