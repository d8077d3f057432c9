"""How long the command line takes to answer without running a command (`corelens.bench.cli_startup`).

python benchmarks/cli_startup.py [--repeats 5] [--commands rank,ablate]
"""

import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1] / "src")
)  # this source tree, not an installed copy

from corelens.bench.cli_startup import main  # noqa: E402
from corelens.commands import COMMANDS  # noqa: E402

main(tuple(COMMANDS))
