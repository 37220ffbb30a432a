"""Whole models: convert the linear layers of any mlx.nn model to MarlinLinear in place, save
the result as a model directory and load it back (mlx-lm models directly)."""
from .checkpoint import convert_directory, load, load_into, save_model
from .convert import EXACT, Conversion, convert

__all__ = ["EXACT", "Conversion", "convert", "convert_directory", "load", "load_into", "save_model"]
