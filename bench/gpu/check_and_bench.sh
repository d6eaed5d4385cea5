#!/usr/bin/env bash
# On the GPU machine, one call: kernel_bench's checks and timings, the CUDA kernel and engine
# tests, the per-kernel profile of a 4-layer cut and decode tok/s of a LAYERS-layer cut (when
# time allows), for the binaries in .device/base (before) and .device/bin (after). Logs are
# packed into OUT_DIR/logs.tgz; a summary is printed last.
#   bench/gpu/check_and_bench.sh OUT_DIR [LAYERS]
set -uo pipefail
out=$1 layers=${2:-16}
work=$out/work
mkdir -p "$work"
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64
start=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >"$work/gpu.txt"
timeout 120 .device/bin/kernel_bench >"$work/kernel_bench.txt" 2>&1
echo "kernel_bench exit $?" >>"$work/summary.txt"
for t in cuda_ops_test cuda_engine_test; do
  timeout 300 .device/bin/$t >"$work/$t.log" 2>&1
  echo "$t exit $? ($(grep -E '^\[  (PASSED|FAILED)' "$work/$t.log" | tr '\n' ' '))" \
    >>"$work/summary.txt"
  grep -E "^\[  FAILED|Failure|rel err .* >" "$work/$t.log" | head -20 >>"$work/summary.txt"
done
grep -E "argmax" "$work/cuda_engine_test.log" >>"$work/summary.txt"
bash bench/gpu/profile_decode.sh "$work" 4 .device/base .device/bin >"$work/profile.txt" 2>&1
echo "after the profile: $((SECONDS - start)) s" >>"$work/summary.txt"
if (( SECONDS - start < 200 )); then
  bash bench/gpu/before_after.sh "$work" "$layers" .device/base .device/bin \
    >"$work/before_after.txt" 2>&1
fi
tar czf "$out/logs.tgz" -C "$work" . && cp "$work/summary.txt" "$out/"
grep -E "^(check|time)" "$work/kernel_bench.txt"
tail -3 "$work/kernel_bench.txt"
grep -E "^step|q3-4L" "$work/profile.txt"
cat "$work/before_after.txt" 2>/dev/null
cat "$work/summary.txt"
echo "total $((SECONDS - start)) s"
