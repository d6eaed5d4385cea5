#!/usr/bin/env bash
# On the GPU machine: what sampling adds to a batch-1 decode step. decode_bench on the
# qwen3-30b-a3b shape cut to LAYERS layers (FP8), greedy against each sampled setting, then
# Nsight Compute's per-kernel durations of one greedy and one sampled decode step (graph
# replay; bench/gpu/ncu_summary.py takes the last step of each).
# ONLY="greedy t07p09rep" limits the settings timed; NCU=0 skips the profiles.
#   bench/gpu/profile_sampled.sh OUT_DIR LAYERS BIN_DIR
set -uo pipefail
out=$1 layers=$2 bin=$3
model=/tmp/qwen3-30b-a3b-$layers
[ -d "$model" ] || python3 bench/gpu/make_hf_model.py --shape qwen3-30b-a3b --layers "$layers" \
  --out "$model" 2>&1 | tail -1
settings=("greedy|--temperature 0"
          "t1|--temperature 1"
          "t07p09|--temperature 0.7 --top_p 0.9"
          "t07p09rep|--temperature 0.7 --top_p 0.9 --repetition_penalty 1.1"
          "t07k50p09|--temperature 0.7 --top_k 50 --top_p 0.9")
for s in "${settings[@]}"; do
  name=${s%%|*} flags=${s#*|}
  [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]] && continue
  # shellcheck disable=SC2086
  "$bin/decode_bench" --model "$model" --model-name "q3-${layers}L-$name" --weights fp8 \
    --runs 3 --output-len 256 $flags --out "$out/decode-$name.json" 2>"$out/decode-$name.log" |
    tail -1 | sed "s/^/$name: /"
done
[ "${NCU:-1}" = 0 ] && exit 0
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
metrics+=,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread
metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active
for s in "greedy|--temperature 0" "t07p09rep|--temperature 0.7 --top_p 0.9 --repetition_penalty 1.1"; do
  name=${s%%|*} flags=${s#*|}
  # shellcheck disable=SC2086
  timeout 300 ncu --clock-control none --print-kernel-base function --csv --page raw \
    --metrics "$metrics" --log-file "$out/ncu-$name.csv" "$bin/decode_bench" --model "$model" \
    --weights fp8 --input-len 64 --output-len 3 --runs 1 --warmup 0 $flags \
    >"$out/ncu-$name.log" 2>&1
  echo "ncu $name: exit $?"
  python3 bench/gpu/ncu_summary.py "$out/ncu-$name.csv" >"$out/ncu-$name-summary.txt"
  tail -4 "$out/ncu-$name-summary.txt"
done
