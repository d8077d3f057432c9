#!/usr/bin/env bash
# Hybrid-attention benchmark table of docs/performance.md (issue 5): kernels at every kept fraction, the
# whole-decoder prefill at F = 20 % (2 decoder layers at 4k and 16k, 1 at 32k to keep the run short;
# the FLOP prediction counts the same layers). One process per N; all cores. Each time is the median of 3
# runs at 4k, 5 at 16k and 3 at 32k after a warm-up, each ratio the median of the ratios within a run:
# single runs on this VM move by 10-15 %, and a ratio of one run by as much (about 40 minutes in all).
set -euo pipefail
out=benchmarks/results
.venv/bin/corelens bench hybrid --tokens 4096 --keep 0.05,0.1,0.2,0.5 --repeats 3 --json $out/hybrid-4096.json
.venv/bin/corelens bench hybrid --tokens 16384 --keep 0.05,0.1,0.2,0.5 --prefill-keep 0.2 --repeats 5 \
  --json $out/hybrid-16384.json
.venv/bin/corelens bench hybrid --tokens 32768 --keep 0.05,0.1,0.2,0.5 --prefill-keep 0.2 --layers 1 --repeats 3 \
  --json $out/hybrid-32768.json
.venv/bin/corelens bench hybrid --table $out/hybrid-4096.json $out/hybrid-16384.json $out/hybrid-32768.json
