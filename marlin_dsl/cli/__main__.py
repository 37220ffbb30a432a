"""`python -m marlin_dsl.cli ...`: the same program as `marlin-dsl`."""
import sys

from .main import main

sys.exit(main())
