#!/usr/bin/env bash
# The GPU checks of the hybrid CUDA path (issues 28 and 41), for a session lent a device machine (one H200 or
# H100; device tool, from the repository root). Two parts, each one device call of at most 8 minutes including
# cold compiles: the time limits of a part's steps, the table's included, add up to at most 480 s, so a part
# cannot run longer (a step past its limit is stopped and says so):
#   bash benchmarks/gpu.sh prefill   (timeout_s 540; run it first)
#   bash benchmarks/gpu.sh probe     (timeout_s 540; run it second)
# No argument runs both (about 16 minutes at most: more than one call allows). Both write into one results
# folder ($OUT, which the device tool brings back; benchmarks/results/gpu without it): gpu.txt (every printed
# line), stderr.txt (warnings), the JSON files, and table.md (the kernel table, the crossover, the anatomy; the
# probe part adds its RAM and decode lines) for docs/performance.md. Each part needs nothing of the other (a
# second device call starts on a bare machine). It runs the source tree with the machine's own python3, in
# bfloat16 on cuda:0, on random-weight decoders of Qwen2.5-VL-7B's width (hidden 3584, 28 query heads, 4 KV
# heads, head dim 128).
# prefill:
#   0. torch, CUDA, cuDNN, Triton versions, the GPU;
#   1. corelens.bench.kernel_parity: the partitioned kernel (Triton, FlexAttention and flash streaming paths,
#      and the full heads on a second CUDA stream), compiled flex and `auto` against the mask rule written out;
#      exits 1 past its tolerance (the part stops there);
#   2. corelens.bench.stream_anatomy at 32k, F = 20 %: stock, full heads only, the Triton streaming kernel, flex
#      window / sink / merge, flash window / sink / merge, the whole kernel with each streaming path and with
#      streams=2, and the first call at a fresh length, for stock and hybrid; it names the faster of the
#      Triton and flash paths;
#   3. bench hybrid at 4k, 8k, 16k: the kernel table alone (F = 5, 10, 20, 50 %; stock sdpa against the
#      partitioned kernel, no crossover), for the crossover;
#   4. bench hybrid at 32k and 64k: the kernel table and the whole 2-layer prefill at F = 20 % and 50 %, query-
#      and KV-granular, against the FLOP prediction; 128k: the kernel table;
#   5. corelens.bench.crossover_table: from the tables of steps 3-4, per F the length from which the hybrid kernel
#      beats stock sdpa on this GPU, and from step 2 the streaming path `auto` keeps (crossover.json;
#      CORELENS_CROSSOVER=crossover.json applies both).
# probe:
#   6. corelens.bench.probe_decode: the batched RAM probe and trimmed-cache decoding against their references;
#      exits 1 past its tolerance;
#   7. bench ram at 32k and at 128k: probe against stock forward (warm-up at the timed length, 3 repeats);
#   8. bench decode at 64k: tokens/s and KV-cache bytes, dense cache against F = 20 % KV-granular.
# Every bench refuses a kernel that fell back (`auto` failing on CUDA) and, on CUDA, full heads on another sdpa
# backend than stock's; every timed length is warmed up at that length and timed >= 3 times.
# Dry run on a CPU (every step at tiny sizes, time limits x6 for a shared machine; the benches time the CPU's
# blocked kernel, the parity and anatomy steps run the Triton kernel under its interpreter and the flash path
# through its dense reference):
# DRY=1 bash benchmarks/gpu.sh prefill; DRY=1 bash benchmarks/gpu.sh probe
# LIMITS=1 bash benchmarks/gpu.sh PART lists the steps' time limits and runs nothing.
set -uo pipefail
out=${OUT:-benchmarks/results/gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
if [ "${DRY:-0}" = 1 ]; then  # tiny sizes on the CPU
  export TRITON_INTERPRET=1
  dev=(--device cpu --dtype float32) width=(--hidden 256 --heads 8 --kv-heads 2 --intermediate 512)
  short=(128 192) sizes=(256 320) long=384 shape=(--sink 16 --window 64) slow=6
  kern=blocked  # the CPU's kernel: FlexAttention runs unfused on a CPU, seconds per call
  anatomy=(--device cpu --dtype float32 --tokens 320 --heads 8 --kv-heads 2 --head-dim 32 --sink 16 --window 64)
  probe=(--device cpu --tokens 256) rams=(512 768) decode=512
else
  dev=(--device cuda --dtype bfloat16) width=(--hidden 3584 --heads 28 --kv-heads 4 --intermediate 18944)
  short=(4096 8192 16384) sizes=(32768 65536) long=131072 shape=() slow=1 kern=partitioned
  anatomy=(--device cuda --tokens 32768) probe=(--device cuda --tokens 8192) rams=(32768 131072) decode=65536
fi
keeps=(--keep 0.05,0.1,0.2,0.5)

# step SECONDS NAME COMMAND...: run COMMAND with a time limit (x6 in a dry run); its output to the console and
# gpu.txt, its stderr to stderr.txt; say so when it fails or runs out of time; return its exit status.
step() {
  local limit=$(($1 * slow)) name=$2
  shift 2
  if [ "${LIMITS:-0}" = 1 ]; then  # list each step's limit, run nothing (tests/test_gpu_script.py sums them)
    echo "limit $limit $name"
    return 0
  fi
  echo "== $name (limit ${limit} s)" | tee -a "$out/gpu.txt"
  timeout "$limit" "$@" 2>>"$out/stderr.txt" | tee -a "$out/gpu.txt"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    failed=$((failed + 1))
    echo "$name did not finish (exit $rc$([ "$rc" = 124 ] && echo ": past its ${limit} s")); stderr.txt ends:" \
      | tee -a "$out/gpu.txt"
    tail -n 5 "$out/stderr.txt" | tee -a "$out/gpu.txt"
  fi
  return "$rc"
}

table() {  # the results folder's table.md: what docs/performance.md quotes (15 s of the prefill part's 480)
  if [ "${LIMITS:-0}" = 1 ]; then
    echo "limit $((15 * slow)) table"
    return 0
  fi
  {
    echo "# GPU results $(date -u +%Y-%m-%d) ($(grep -m1 '^GPU' "$out/gpu.txt" || echo 'GPU unknown'))"
    echo
    echo "## Kernel table"
    timeout $((15 * slow)) "$py" -m corelens bench hybrid --table "$out"/hybrid-gpu-*.json 2>>"$out/stderr.txt"
    echo
    echo "## Crossover"
    cat "$out/crossover.md" 2>/dev/null || echo "(not measured)"
    echo
    echo "## Anatomy"
    sed -n '/^anatomy/,/^  faster streaming/p' "$out/gpu.txt" || true
  } >"$out/table.md"
}

part=${1:-all}
failed=0  # steps that did not finish: the script exits 1 when any did, after writing what it has
if [ "$part" != probe ]; then
  [ "${LIMITS:-0}" = 1 ] || { : >"$out/gpu.txt" && : >"$out/stderr.txt"; }
  step 10 versions "$py" -c "
import torch, transformers
try:
    import triton; tv = triton.__version__
except ImportError:
    tv = 'none'
print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'cuDNN', torch.backends.cudnn.version(),
      'transformers', transformers.__version__, 'triton', tv)
print('GPU', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')
"
  if [ "${DRY:-0}" = 1 ]; then parity=(--dry-run); else parity=(); fi
  step 60 parity "$py" -m corelens.bench.kernel_parity "${parity[@]}" || {
    echo "kernel parity failed: no timing is worth running" | tee -a "$out/gpu.txt"
    exit 1
  }
  step 90 "anatomy" "$py" -m corelens.bench.stream_anatomy "${anatomy[@]}" --json "$out/anatomy.json"
  for n in "${short[@]}"; do
    step 30 "kernel table N=$n" "$py" -m corelens bench hybrid "${dev[@]}" --tokens "$n" "${width[@]}" "${shape[@]}" \
      "${keeps[@]}" --kernel $kern --no-prefill --no-flex --repeats 3 --json "$out/hybrid-gpu-$n.json"
  done
  limits=(60 75)
  for i in 0 1; do
    n=${sizes[$i]}
    step "${limits[$i]}" "hybrid N=$n" "$py" -m corelens bench hybrid "${dev[@]}" --tokens "$n" "${width[@]}" \
      "${shape[@]}" "${keeps[@]}" --kernel $kern --prefill-keep 0.2,0.5 --prefill-granularity query,kv \
      --no-flex --repeats 3 --layers 2 --json "$out/hybrid-gpu-$n.json"
  done
  step 60 "kernel table N=$long" "$py" -m corelens bench hybrid "${dev[@]}" --tokens "$long" "${width[@]}" \
    "${shape[@]}" "${keeps[@]}" --kernel $kern --no-prefill --no-flex --repeats 3 \
    --json "$out/hybrid-gpu-$long.json"
  anat=()
  [ -s "$out/anatomy.json" ] && anat=(--anatomy "$out/anatomy.json")
  step 15 crossover "$py" -m corelens.bench.crossover_table "$out"/hybrid-gpu-*.json --out "$out/crossover.json" \
    --markdown "$out/crossover.md" "${anat[@]}"
  table
fi
if [ "$part" != prefill ]; then
  [ "$part" = probe ] && [ "${LIMITS:-0}" != 1 ] && : >"$out/gpu.txt" && : >"$out/stderr.txt"
  step 80 "probe and decode parity" "$py" -m corelens.bench.probe_decode "${probe[@]}" || {
    echo "probe / decode parity failed: no timing is worth running" | tee -a "$out/gpu.txt"
    exit 1
  }
  limits=(115 155)
  for i in 0 1; do
    n=${rams[$i]}
    step "${limits[$i]}" "bench ram N=$n" "$py" -m corelens bench ram "${dev[@]}" --tokens "$n" "${width[@]}" \
      --layers 4 --no-eager --repeats 3 --json "$out/ram-gpu-$n.json"
  done
  step 130 "bench decode N=$decode" "$py" -m corelens bench decode "${dev[@]}" --tokens "$decode" "${width[@]}" \
    "${shape[@]}" --layers 4 --keep 0.2 --granularity kv --steps 64 --repeats 3 --json "$out/decode-gpu-$decode.json"
  [ "${LIMITS:-0}" = 1 ] || {  # the probe part's lines of table.md (no python: its limits add up to 480 s)
    [ -s "$out/table.md" ] || echo "# GPU results $(date -u +%Y-%m-%d) (probe part)"
    echo
    echo "## Probe and decode"
    grep -E '^(ram bench|decode bench|probe|decode)' "$out/gpu.txt" || true
  } >>"$out/table.md"
fi
if [ "$failed" != 0 ]; then
  echo "$failed step(s) did not finish (above): the tables hold only what finished" | tee -a "$out/gpu.txt"
  exit 1
fi
