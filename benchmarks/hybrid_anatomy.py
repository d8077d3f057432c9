"""Where the hybrid CPU kernel's time goes: runs `corelens.bench.hybrid_anatomy` (about 3 minutes on 2 cores).

.venv/bin/python benchmarks/hybrid_anatomy.py
"""

import runpy

runpy.run_module("corelens.bench.hybrid_anatomy", run_name="__main__", alter_sys=True)
