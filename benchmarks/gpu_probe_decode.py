"""GPU checks of the batched RAM probe and of trimmed-cache decoding: runs `corelens.bench.probe_decode`.

python3 benchmarks/gpu_probe_decode.py [--device cuda] [--tokens 8192]
"""

import runpy

runpy.run_module("corelens.bench.probe_decode", run_name="__main__", alter_sys=True)
