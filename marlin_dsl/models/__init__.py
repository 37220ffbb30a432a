"""Whole models: convert the linear layers of any mlx.nn model to MarlinLinear in place, save
the result as a model directory, load it back (mlx-lm models directly, also through mlx-lm's
own `load` with trust_remote_code) and generate text with it."""
from .checkpoint import save_model
from .convert import EXACT, Conversion, convert
from .directory import convert_directory
from .generate import generate_text
from .loading import load, load_into
from .rules import UnmatchedRules

__all__ = ["EXACT", "Conversion", "UnmatchedRules", "convert", "convert_directory", "generate_text", "load",
           "load_into", "save_model"]
