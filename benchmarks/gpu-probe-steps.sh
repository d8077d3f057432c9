#!/usr/bin/env bash
# Issue 28, points 2 and 3 (batched RAM probe, trimmed-cache decoding): the GPU steps to merge into
# benchmarks/gpu.sh (after its header: `out`, PYTHONPATH and `width` as set there). About 6 minutes at most.
#   a. gpu_probe_decode.py: batched probe = row by row on the device (bf16, GQA, 8k keys) and its CUDA
#      synchronisations per layer (1 expected: the final copy); trimmed decoding = the dense rule token by
#      token (fp32, bf16) with no synchronisation in the cache writes and the trimmed kernels;
#   b. bench ram at 32k (4 layers; already in gpu.sh) and 128k (2 layers): probe vs stock forward time and
#      allocator peak (targets: <= 1.05x time, <= 1.02x peak at 32k);
#   c. bench decode at 64k: tokens/s and KV-cache bytes, dense DynamicCache vs F = 20 % KV-granular
#      (targets: KV bytes <= 0.25x dense, decoding faster than dense).
set -uo pipefail
out=${OUT:-benchmarks/results/gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
width=(--hidden 3584 --heads 28 --kv-heads 4 --intermediate 18944)
timeout 90 python3 benchmarks/gpu_probe_decode.py --device cuda --tokens 8192 2>&1 | grep -v Warning \
  | tee -a "$out/gpu.txt"
timeout 150 python3 -m corelens bench ram --device cuda --dtype bfloat16 --tokens 131072 "${width[@]}" \
  --layers 2 --no-eager --repeats 2 --json "$out/ram-gpu-131072.json" 2>&1 | tail -3 | tee -a "$out/gpu.txt" \
  || echo "bench ram N=131072 did not finish" | tee -a "$out/gpu.txt"
timeout 150 python3 -m corelens bench decode --device cuda --dtype bfloat16 --tokens 65536 "${width[@]}" \
  --layers 4 --keep 0.2 --granularity kv --steps 64 --repeats 2 --json "$out/decode-gpu-65536.json" 2>&1 \
  | tail -3 | tee -a "$out/gpu.txt" || echo "bench decode N=65536 did not finish" | tee -a "$out/gpu.txt"
