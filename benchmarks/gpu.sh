#!/usr/bin/env bash
# The GPU checks of the real-scale work, for a session lent a device machine (one H200; device tool, from the
# repository root, timeout_s 540): `bash benchmarks/gpu.sh`. It runs the source tree with the machine's own
# python3 (the JSON files record the torch / transformers versions), in bfloat16 on cuda:0, on random-weight
# decoders of Qwen2.5-VL-7B's width (hidden 3584, 28 query heads, 4 KV heads, head dim 128, MLP 18944):
#   0. benchmarks/gpu_parity.py: compiled FlexAttention against the mask rule written out literally;
#   1. bench ram at 32k tokens: probe vs stock sdpa time and the allocator's peak (4 layers, no eager);
#   2. bench hybrid at 32k and 64k: corelens (FlexAttention on CUDA) vs stock sdpa (flash backend, which is
#      what transformers' sdpa path runs) at kept fractions 5-50 %, and the whole 2-layer prefill at 20 %;
#   3. bench flow at S = 4096, H = 3584 with corelens' side on the GPU;
#   4. with more than one GPU, a 2-process torchrun ranking of the organism on cuda:0 and cuda:1.
# Each step has its own time limit so that the whole script ends within 8 minutes; JSON files, logs and the
# tables land in $OUT, which the device tool brings back.
set -uo pipefail
out=${OUT:-benchmarks/results/gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
width=(--hidden 3584 --heads 28 --kv-heads 4 --intermediate 18944)
python3 -c "import torch, transformers; print(\"torch\", torch.__version__, \"transformers\", transformers.__version__)" | tee "$out/gpu.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$out/gpu.txt"
timeout 120 python3 benchmarks/gpu_parity.py 2>&1 | grep -v Warning | tee -a "$out/gpu.txt"
timeout 100 python3 -m corelens bench ram --device cuda --dtype bfloat16 --tokens 32768 "${width[@]}" \
  --layers 4 --no-eager --repeats 3 --json "$out/ram-gpu-32768.json" 2>&1 | tail -3 | tee -a "$out/gpu.txt"
for n in 32768 65536; do
  timeout 130 python3 -m corelens bench hybrid --device cuda --dtype bfloat16 --tokens $n "${width[@]}" \
    --keep 0.05,0.1,0.2,0.5 --prefill-keep 0.2 --repeats 3 --layers 2 --json "$out/hybrid-gpu-$n.json" \
    2>&1 | tail -3 | tee -a "$out/gpu.txt" || echo "hybrid N=$n did not finish" | tee -a "$out/gpu.txt"
done
python3 -m corelens bench hybrid --table "$out"/hybrid-gpu-*.json | tee "$out/hybrid-table.md"
timeout 60 python3 -m corelens bench flow --device cuda --tokens 4096 --hidden 3584 --repeats 3 \
  --json "$out/flow-gpu.json" 2>&1 | tail -2 | tee -a "$out/gpu.txt"
gpus=$(nvidia-smi --list-gpus | wc -l)
if [ "$gpus" -gt 1 ]; then
  data=$(python3 -c "from corelens.organism.tasks import generate; print(generate('image', '/tmp/gpu-data', 64, seed=1))")
  timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m corelens rank \
    --model src/corelens/organism/checkpoint --data "$data" --out /tmp/gpu-rank --device cuda --dtype bfloat16 \
    2>&1 | tail -3 | tee -a "$out/gpu.txt"
  cp /tmp/gpu-rank/manifest.json "$out/torchrun-manifest.json"
else
  echo "one GPU: the 2-process torchrun ranking is skipped" | tee -a "$out/gpu.txt"
fi
