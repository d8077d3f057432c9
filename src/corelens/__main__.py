"""`python -m corelens` and `torchrun --nproc-per-node N -m corelens ...`: the command line."""

import sys

from corelens.cli import main

sys.exit(main())
