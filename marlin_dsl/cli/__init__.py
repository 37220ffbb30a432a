"""The `marlin-dsl` command line: one module per command (`compile`, `bench`, `convert`, `generate`),
what they share (`common`: exit codes, tables), and `main`, which puts them together."""
from .bench import bench_settings
from .common import (EXIT_CHECK_FAILED, EXIT_ENVIRONMENT, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE,
                     exit_code, parse_shape)
from .compile import report_shape
from .main import build_parser, main

__all__ = ["EXIT_CHECK_FAILED", "EXIT_ENVIRONMENT", "EXIT_INPUT", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE",
           "bench_settings", "build_parser", "exit_code", "main", "parse_shape", "report_shape"]
