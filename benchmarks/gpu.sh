#!/usr/bin/env bash
# The GPU checks of the hybrid CUDA path (issue 28), for a session lent a device machine (one H200; device
# tool, from the repository root, timeout_s 540): `bash benchmarks/gpu.sh`. It runs the source tree with the
# machine's own python3 (the JSON files record the torch / transformers versions), in bfloat16 on cuda:0, on
# random-weight decoders of Qwen2.5-VL-7B's width (hidden 3584, 28 query heads, 4 KV heads, head dim 128,
# MLP 18944):
#   0. torch, CUDA and cuDNN versions, the GPU;
#   1. benchmarks/gpu_parity.py: compiled flex and partitioned kernels against the mask rule written out;
#   2. bench hybrid --kernel partitioned at 32k and 64k: the kernel table (F = 5, 10, 20, 50 %; stock sdpa,
#      its backend, the partitioned kernel and compiled flex, % of ideal; CUDA-event times after a warm-up at
#      the timed length; q, k, v in the model's strided layout), the mask / plan build time per layer, and
#      the whole 2-layer prefill at F = 20 % and 50 % against the FLOP prediction;
#   3. the same kernel table at 128k (no prefill: the step's time goes to the kernels);
#   4. with more than one GPU, a 2-process torchrun ranking of the organism on cuda:0 and cuda:1;
#   5. benchmarks/gpu_probe_decode.py: the batched RAM probe against its row-by-row form on the device and its
#      host synchronisations per layer; trimmed-cache decoding against the dense rule, token by token;
#   6. bench ram at 32k (4 layers) and 128k (2 layers): probe against stock forward, time and allocator peak;
#   7. bench decode at 64k: tokens/s and KV-cache bytes, dense cache against F = 20 % KV-granular.
# Steps 0-4 ("prefill") and 5-7 ("probe") each fit one 8-minute device call: `bash benchmarks/gpu.sh prefill`
# then `bash benchmarks/gpu.sh probe`; no argument runs both (about 13 minutes at the worst).
# Each step has its own time limit so that the whole script ends within 8 minutes; JSON files, logs and the
# tables land in $OUT, which the device tool brings back. Dry run on a CPU (parses and runs every command at
# tiny sizes): DRY=1 bash benchmarks/gpu.sh
set -uo pipefail
out=${OUT:-benchmarks/results/gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
if [ "${DRY:-0}" = 1 ]; then  # tiny sizes on the CPU
  dev=(--device cpu --dtype float32) width=(--hidden 256 --heads 8 --kv-heads 2 --intermediate 512)
  sizes=(512 640) long=768 shape=(--sink 16 --window 64 --no-flex) parity=(--dry-run)  # nothing compiles
else
  dev=(--device cuda --dtype bfloat16) width=(--hidden 3584 --heads 28 --kv-heads 4 --intermediate 18944)
  sizes=(32768 65536) long=131072 shape=() parity=()
fi
keeps=(--keep 0.05,0.1,0.2,0.5)
part=${1:-all}
if [ "$part" != probe ]; then
timeout 60 "$py" -c "
import torch, transformers
print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'cuDNN', torch.backends.cudnn.version(),
      'transformers', transformers.__version__)
print('GPU', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')
" 2>&1 | tee "$out/gpu.txt"
timeout 80 "$py" benchmarks/gpu_parity.py "${parity[@]}" 2>&1 | grep -v Warning | tee -a "$out/gpu.txt"
for n in "${sizes[@]}"; do
  timeout 115 "$py" -m corelens bench hybrid "${dev[@]}" --tokens "$n" "${width[@]}" "${shape[@]}" "${keeps[@]}" \
    --kernel partitioned --prefill-keep 0.2,0.5 --repeats 3 --layers 2 --json "$out/hybrid-gpu-$n.json" \
    2>&1 | tail -6 | tee -a "$out/gpu.txt" || echo "hybrid N=$n did not finish" | tee -a "$out/gpu.txt"
done
timeout 110 "$py" -m corelens bench hybrid "${dev[@]}" --tokens "$long" "${width[@]}" "${shape[@]}" "${keeps[@]}" \
  --kernel partitioned --no-prefill --repeats 3 --json "$out/hybrid-gpu-$long.json" \
  2>&1 | tail -6 | tee -a "$out/gpu.txt" || echo "hybrid N=$long did not finish" | tee -a "$out/gpu.txt"
"$py" -m corelens bench hybrid --table "$out"/hybrid-gpu-*.json | tee "$out/hybrid-table.md"
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
if [ "$gpus" -gt 1 ]; then
  data=$("$py" -c "from corelens.organism.tasks import generate; print(generate('image', '/tmp/gpu-data', 64, seed=1))")
  timeout 90 "$py" -m torch.distributed.run --standalone --nproc-per-node 2 -m corelens rank \
    --model src/corelens/organism/checkpoint --data "$data" --out /tmp/gpu-rank --device cuda --dtype bfloat16 \
    2>&1 | tail -3 | tee -a "$out/gpu.txt"
  cp /tmp/gpu-rank/manifest.json "$out/torchrun-manifest.json"
else
  echo "one GPU: the 2-process torchrun ranking is skipped" | tee -a "$out/gpu.txt"
fi
fi
if [ "$part" != prefill ]; then
  if [ "${DRY:-0}" = 1 ]; then probe=(--device cpu --tokens 256) ram=(512 640) decode=512
  else probe=(--device cuda --tokens 8192) ram=(32768 131072) decode=65536; fi
  timeout 90 "$py" benchmarks/gpu_probe_decode.py "${probe[@]}" 2>&1 | grep -v Warning | tee -a "$out/gpu.txt"
  layers=4
  for n in "${ram[@]}"; do
    timeout 150 "$py" -m corelens bench ram "${dev[@]}" --tokens "$n" "${width[@]}" --layers $layers --no-eager \
      --repeats 2 --json "$out/ram-gpu-$n.json" 2>&1 | tail -3 | tee -a "$out/gpu.txt" \
      || echo "bench ram N=$n did not finish" | tee -a "$out/gpu.txt"
    layers=2
  done
  timeout 150 "$py" -m corelens bench decode "${dev[@]}" --tokens "$decode" "${width[@]}" --layers 4 --keep 0.2 \
    --granularity kv --steps 64 --repeats 2 --json "$out/decode-gpu-$decode.json" 2>&1 | tail -3 \
    | tee -a "$out/gpu.txt" || echo "bench decode N=$decode did not finish" | tee -a "$out/gpu.txt"
fi
