#!/usr/bin/env bash
# The kernel targets alone (N = 16k and 32k, F = 20 %, S = 128, W = 1024): kernels only, more repeats
# than benchmarks/hybrid.sh (9 at 16k, 5 at 32k), so that the median of the per-repeat ratios rests on more
# samples of this VM's spread (about 12 minutes).
set -euo pipefail
out=benchmarks/results
.venv/bin/corelens bench hybrid --tokens 16384 --keep 0.2 --no-prefill --repeats 9 --json $out/hybrid-targets-16384.json
.venv/bin/corelens bench hybrid --tokens 32768 --keep 0.2 --no-prefill --repeats 5 --json $out/hybrid-targets-32768.json
