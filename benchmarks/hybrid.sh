#!/usr/bin/env bash
# Hybrid-attention benchmark table of the README (issue 5): kernels at every kept fraction, the
# whole-decoder prefill at F = 20 % (2 decoder layers at 4k and 16k, 1 at 32k to keep the run short;
# the FLOP prediction counts the same layers). One process per N; all cores. Each time is the median of 3
# runs (2 at 32k) after a warm-up: single runs on this VM move by 10-15 %.
set -euo pipefail
out=benchmarks/results
.venv/bin/corelens bench hybrid --tokens 4096 --keep 0.05,0.1,0.2,0.5 --repeats 3 --json $out/hybrid-4096.json
.venv/bin/corelens bench hybrid --tokens 16384 --keep 0.05,0.1,0.2,0.5 --prefill-keep 0.2 --repeats 3 \
  --json $out/hybrid-16384.json
.venv/bin/corelens bench hybrid --tokens 32768 --keep 0.05,0.1,0.2,0.5 --prefill-keep 0.2 --layers 1 --repeats 2 \
  --json $out/hybrid-32768.json
.venv/bin/corelens bench hybrid --table $out/hybrid-4096.json $out/hybrid-16384.json $out/hybrid-32768.json
