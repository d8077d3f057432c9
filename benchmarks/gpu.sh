#!/usr/bin/env bash
# The GPU checks of the hybrid CUDA path (issue 28), for a session lent a device machine (one H200 or H100;
# device tool, from the repository root, timeout_s 540): `bash benchmarks/gpu.sh prefill`, then
# `bash benchmarks/gpu.sh probe`. It runs the source tree with the machine's own python3 (the JSON files record
# the torch / transformers versions), in bfloat16 on cuda:0, on random-weight decoders of Qwen2.5-VL-7B's width
# (hidden 3584, 28 query heads, 4 KV heads, head dim 128, MLP 18944):
#   0. torch, CUDA and cuDNN versions, the GPU;
#   1. corelens.bench.kernel_parity (benchmarks/gpu_parity.py): compiled flex and partitioned kernels against
#      the mask rule written out;
#   2. bench hybrid --kernel partitioned at 32k and 64k: the kernel table (F = 5, 10, 20, 50 %; stock sdpa,
#      its backend, the partitioned kernel and compiled flex, % of ideal; CUDA-event times after a warm-up at
#      the timed length; q, k, v in the model's strided layout), the mask / plan build time per layer; the
#      whole 2-layer prefill at F = 20 % and 50 % against the FLOP prediction, for query- and KV-granular
#      head sets, with the asked and effective shares and the KV-cache bytes kept; each layer's attention
#      timed inside the model's forward against the kernel table's time for the same heads; the
#      torch.compile frames compiled during the timed repeats (0 = nothing recompiled at a timed length);
#   3. the same kernel table at 128k (no prefill: the step's time goes to the kernels);
#   4. with more than one GPU, a 2-process torchrun ranking of the organism on cuda:0 and cuda:1;
#   5. corelens.bench.probe_decode (benchmarks/gpu_probe_decode.py): the batched RAM probe against its row-by-row
#      form on the device and its host synchronisations per layer; trimmed-cache decoding against the dense rule, token by token;
#   6. bench ram at 32k (4 layers) and 128k (2 layers): probe against stock forward, time and allocator peak;
#   7. bench decode at 64k: tokens/s and KV-cache bytes, dense cache against F = 20 % KV-granular.
# Steps 0-4 ("prefill") and 5-7 ("probe") each fit one 8-minute device call: the time limits of a part's
# steps add up to 480 s (prefill: 20 + 70 + 145 + 155 + 90 on one GPU; 120 + 130 and torchrun's 50 on more). No argument runs both. Each step's printed lines go to the console and to gpu.txt,
# its warnings to stderr.txt (a step that fails or runs out of time prints its exit status and the last lines
# of stderr.txt); JSON files and the tables land in $OUT, which the device tool brings back.
# Dry run on a CPU (every command at tiny sizes, one repeat, time limits x4 for a shared machine):
# DRY=1 bash benchmarks/gpu.sh
set -uo pipefail
out=${OUT:-benchmarks/results/gpu}
mkdir -p "$out"
: >"$out/stderr.txt"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
if [ "${DRY:-0}" = 1 ]; then  # tiny sizes on the CPU
  dev=(--device cpu --dtype float32) width=(--hidden 256 --heads 8 --kv-heads 2 --intermediate 512)
  sizes=(192 256) long=320 shape=(--sink 16 --window 64 --no-flex) parity=(--dry-run) rep=1 slow=4
else
  dev=(--device cuda --dtype bfloat16) width=(--hidden 3584 --heads 28 --kv-heads 4 --intermediate 18944)
  sizes=(32768 65536) long=131072 shape=() parity=() rep=3 slow=1
fi
keeps=(--keep 0.05,0.1,0.2,0.5)

# step SECONDS NAME COMMAND...: run COMMAND with a time limit (x4 in a dry run); its output to the console and
# gpu.txt, its stderr to stderr.txt; say so when it fails or runs out of time.
step() {
  local limit=$(($1 * slow)) name=$2
  shift 2
  timeout "$limit" "$@" 2>>"$out/stderr.txt" | tee -a "$out/gpu.txt"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    echo "$name did not finish (exit $rc$([ "$rc" = 124 ] && echo ": past its ${limit} s")); stderr.txt ends:" \
      | tee -a "$out/gpu.txt"
    tail -n 5 "$out/stderr.txt" | tee -a "$out/gpu.txt"
  fi
}

part=${1:-all}
if [ "$part" != probe ]; then
: >"$out/gpu.txt"
step 20 versions "$py" -c "
import torch, transformers
print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'cuDNN', torch.backends.cudnn.version(),
      'transformers', transformers.__version__)
print('GPU', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')
"
step 70 parity "$py" -m corelens.bench.kernel_parity "${parity[@]}"
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
# 32k, 64k: the kernel table (3 kernels x 4 F) and the prefill at 2 F x 2 granularities; with one GPU they
# also get the 50 s of the torchrun step, which needs two.
if [ "$gpus" -gt 1 ]; then limits=(120 130); else limits=(145 155); fi
for i in 0 1; do
  n=${sizes[$i]}
  step "${limits[$i]}" "hybrid N=$n" "$py" -m corelens bench hybrid "${dev[@]}" --tokens "$n" "${width[@]}" \
    "${shape[@]}" "${keeps[@]}" --kernel partitioned --prefill-keep 0.2,0.5 --prefill-granularity query,kv \
    --repeats $rep --layers 2 --json "$out/hybrid-gpu-$n.json"
done
step 90 "hybrid N=$long" "$py" -m corelens bench hybrid "${dev[@]}" --tokens "$long" "${width[@]}" "${shape[@]}" \
  "${keeps[@]}" --kernel partitioned --no-prefill --repeats $rep --json "$out/hybrid-gpu-$long.json"
"$py" -m corelens bench hybrid --table "$out"/hybrid-gpu-*.json 2>>"$out/stderr.txt" | tee "$out/hybrid-table.md"
if [ "$gpus" -gt 1 ]; then
  data=$("$py" -c "from corelens.organism.tasks import generate; print(generate('image', '/tmp/gpu-data', 64, seed=1))")
  step 50 torchrun "$py" -m torch.distributed.run --standalone --nproc-per-node 2 -m corelens rank \
    --model src/corelens/organism/checkpoint --data "$data" --out /tmp/gpu-rank --device cuda --dtype bfloat16
  cp /tmp/gpu-rank/manifest.json "$out/torchrun-manifest.json"
else
  echo "one GPU: the 2-process torchrun ranking is skipped" | tee -a "$out/gpu.txt"
fi
fi
if [ "$part" != prefill ]; then
  if [ "${DRY:-0}" = 1 ]; then probe=(--device cpu --tokens 256) ram=(512 640) decode=512
  else probe=(--device cuda --tokens 8192) ram=(32768 131072) decode=65536; fi
  step 80 "probe and decode parity" "$py" -m corelens.bench.probe_decode "${probe[@]}"
  layers=4 limit=120
  for n in "${ram[@]}"; do
    step $limit "bench ram N=$n" "$py" -m corelens bench ram "${dev[@]}" --tokens "$n" "${width[@]}" \
      --layers $layers --no-eager --repeats 2 --json "$out/ram-gpu-$n.json"
    layers=2 limit=140
  done
  step 140 "bench decode N=$decode" "$py" -m corelens bench decode "${dev[@]}" --tokens "$decode" "${width[@]}" \
    --layers 4 --keep 0.2 --granularity kv --steps 64 --repeats 2 --json "$out/decode-gpu-$decode.json"
fi
