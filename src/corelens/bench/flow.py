"""Deprecated alias of `corelens.bench.flow_metrics`, where RID + MixIG are timed against the direct
computation (renamed by issue 30: no two modules of one name in different layers); it goes in the next
release.
"""

import sys
import warnings

from corelens.bench import flow_metrics

warnings.warn(__doc__, DeprecationWarning, stacklevel=2)
sys.modules[__name__] = flow_metrics
