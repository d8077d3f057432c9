"""Deprecated alias of `corelens.report.overlay`, where overlays are measured and drawn (issue 30); it goes
in the next release.
"""

import sys
import warnings

from corelens.report import overlay

warnings.warn(__doc__, DeprecationWarning, stacklevel=2)
sys.modules[__name__] = overlay
