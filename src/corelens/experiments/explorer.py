"""Deprecated alias of `corelens.report.explorer`, where the explorer's data are written and read (issue
30); it goes in the next release.
"""

import sys
import warnings

from corelens.report import explorer

warnings.warn(__doc__, DeprecationWarning, stacklevel=2)
sys.modules[__name__] = explorer
