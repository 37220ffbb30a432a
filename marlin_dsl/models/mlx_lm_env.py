"""mlx-lm is an optional extra: what needs it says so in one line (EnvironmentUnavailable, the
command line's exit code 4) instead of a ModuleNotFoundError traceback."""
from __future__ import annotations

from ..errors import EnvironmentUnavailable

#: What to install.
EXTRA = 'pip install "marlin-dsl[mlx-lm]"'


def require_mlx_lm(what: str) -> None:
    """EnvironmentUnavailable naming `what` and the extra unless mlx-lm imports."""
    try:
        import mlx_lm.utils  # noqa: F401
    except ImportError as err:
        raise EnvironmentUnavailable(f"{what} needs mlx-lm, which does not import here ({err}); "
                                     f"install it with {EXTRA}") from None


__all__ = ["EXTRA", "require_mlx_lm"]
