"""GPU parity of the hybrid kernels against the mask rule written out: runs `corelens.bench.kernel_parity`.

python3 benchmarks/gpu_parity.py [--dry-run]
"""

import runpy

runpy.run_module("corelens.bench.kernel_parity", run_name="__main__", alter_sys=True)
