#!/usr/bin/env bash
# On the GPU machine: batch-1 decode of the qwen3-30b-a3b shape cut to LAYERS layers, for each
# folder of binaries given (each holding decode_bench): decode tok/s with bf16 and FP8 experts,
# then Nsight Compute's per-kernel duration and DRAM traffic of one decode step (graph replay).
#   bench/gpu/profile_decode.sh OUT_DIR LAYERS DIR...     e.g. ... $OUT 4 .device/base .device/bin
# Libraries in .device/lib (see docs/archive/benchmarks-2026-11-to-12-02.md); summaries by bench/gpu/ncu_summary.py.
set -uo pipefail
out=$1 layers=$2
shift 2
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64
model=/tmp/qwen3-30b-a3b-$layers
[ -d "$model" ] || python3 bench/gpu/make_hf_model.py --shape qwen3-30b-a3b --layers "$layers" \
  --out "$model" 2>&1 | tail -1
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
metrics+=,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread
metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active
for dir in "$@"; do
  tag=$(basename "$dir")
  for w in bf16 fp8; do
    "$dir/decode_bench" --model "$model" --model-name "q3-${layers}L-$tag" --weights "$w" \
      --runs 3 --output-len 256 2>"$out/decode-$tag-$w.log" | tail -1
  done
  # Prompt 64, 3 tokens: prefill, then two decode graph replays; the summary takes the last.
  timeout 300 ncu --clock-control none --print-kernel-base function --csv --page raw \
    --metrics "$metrics" --log-file "$out/ncu-$tag.csv" "$dir/decode_bench" --model "$model" \
    --weights bf16 --input-len 64 --output-len 3 --runs 1 --warmup 0 >"$out/ncu-$tag.log" 2>&1
  echo "ncu $tag: exit $?"
  python3 bench/gpu/ncu_summary.py "$out/ncu-$tag.csv" | tee "$out/ncu-$tag-summary.txt"
done
