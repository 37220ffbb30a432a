"""`python -m marlin_dsl ...` is the `marlin-dsl` command."""
import sys

from .cli import main

sys.exit(main())
