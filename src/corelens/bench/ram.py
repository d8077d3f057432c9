"""Deprecated alias of `corelens.bench.ram_probe`, where the RAM probe's time and memory are measured
(renamed by issue 30: no two modules of one name in different layers); it goes in the next release.
"""

import sys
import warnings

from corelens.bench import ram_probe

warnings.warn(__doc__, DeprecationWarning, stacklevel=2)
sys.modules[__name__] = ram_probe
