"""Deprecated alias of `corelens.bench.hybrid_kernels`, where the hybrid kernels and prefill are timed
(renamed by issue 30: no two modules of one name in different layers); it goes in the next release.
"""

import sys
import warnings

from corelens.bench import hybrid_kernels

warnings.warn(__doc__, DeprecationWarning, stacklevel=2)
sys.modules[__name__] = hybrid_kernels
