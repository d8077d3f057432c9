#!/usr/bin/env bash
# GPU table of the hybrid benchmark (issue 5), for a session lent a device machine (device tool, from the
# repository root, timeout_s 540): `bash benchmarks/gpu-hybrid.sh`. The machine cannot install anything; it
# runs the source tree with its own python3 (PyTorch 2.11 / transformers 5.17 when last read, against the
# 2.14.1 / 5.24.0 pinned here: the JSON records the versions). bfloat16 on cuda:0, docs/performance.md's sizes,
# 5 timed runs each; JSON files and the table land in $OUT, which the device tool brings back.
# benchmarks/gpu.sh ran on 2026-12-04 (results/gpu/); this script adds the 4k and 16k sizes with 5 repeats.
set -euo pipefail
out=${OUT:-benchmarks/results/gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
for n in 4096 16384 32768; do
  timeout 150 python3 -m corelens bench hybrid --device cuda --dtype bfloat16 --tokens $n \
    --keep 0.05,0.1,0.2,0.5 --prefill-keep 0.2 --repeats 5 --layers 2 --json "$out/hybrid-gpu-$n.json" \
    || echo "N=$n did not finish in 150 s" | tee -a "$out/gpu.txt"
done
python3 -m corelens bench hybrid --table "$out"/hybrid-gpu-*.json | tee "$out/table.md"
