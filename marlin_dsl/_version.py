"""The package's version, in a module of its own: code below the package face (the Metal
runtime's launcher cache key, the header of the files `compile -o` writes) reads it here
instead of importing `marlin_dsl/__init__.py`, which imports every stage."""

__version__ = "0.1.0"
