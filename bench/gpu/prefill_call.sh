#!/usr/bin/env bash
# One GPU-machine call for the long-prompt work, each part optional:
#   cuda_ops_test        the kernels against the CPU reference (OPS_FILTER narrows it; "none"
#                        skips it)
#   EXTRA_TESTS          other GPU test binaries, BINARY[:GTEST_FILTER] words
#   prefill_kernel_bench attention and grouped experts of a prefill against the kernels before
#                        them, JSON to OUT_DIR/prefill-kernels.json (KERNEL_FLAGS, e.g.
#                        --attention-only; "none" skips it)
#   PLAN                 whole-model runs through tiers_call.sh (e.g. bench/gpu/plans/prefill.txt)
# Carries what trust_call.sh does (.device-ipc, .device-demo, .device-base; models/ and
# tests/data/oracles/ moved aside). OUT_DIR gets summary.txt and the logs.
#   PLAN=bench/gpu/plans/prefill.txt bash bench/gpu/prefill_call.sh OUT_DIR
set -uo pipefail
final=$1
source "$(dirname "${BASH_SOURCE[0]}")/unpack_device.sh"
if [ "${OPS_FILTER:-}" != none ]; then
  timeout 300 .device-ipc/bin/cuda_ops_test --gtest_filter="${OPS_FILTER:-*}" \
    >"$final/cuda_ops_test.log" 2>&1
  echo "cuda_ops_test exit $? ($(grep -E '^\[  (PASSED|FAILED)' "$final/cuda_ops_test.log" | tr '\n' ' '))" |
    tee -a "$sum"
  grep -E "^\[  FAILED|Failure|FAIL " "$final/cuda_ops_test.log" | head -12 | tee -a "$sum"
fi
for t in ${EXTRA_TESTS:-}; do  # GPU test binaries, BINARY[:GTEST_FILTER]
  filter=(); [[ $t == *:* ]] && filter=("--gtest_filter=${t#*:}")
  timeout 300 ".device-ipc/bin/${t%%:*}" "${filter[@]}" >"$final/${t%%:*}.log" 2>&1
  echo "$t exit $? ($(grep -E '^\[  (PASSED|FAILED)' "$final/${t%%:*}.log" | tr '\n' ' '))" | tee -a "$sum"
  grep -E "^\[  FAILED|Failure" "$final/${t%%:*}.log" | head -8 | tee -a "$sum"
done
if [ -x .device-ipc/bin/prefill_kernel_bench ] && [ "${KERNEL_FLAGS:-}" != none ]; then
  timeout 240 .device-ipc/bin/prefill_kernel_bench --json "$final/prefill-kernels.json" ${KERNEL_FLAGS:-} \
    >"$final/prefill-kernels.txt" 2>&1
  echo "prefill_kernel_bench exit $?" | tee -a "$sum"
fi
if [ -n "${PLAN:-}" ]; then
  OUT_LEN=${OUT_LEN:-16} RUNS=${RUNS:-2} bash bench/gpu/tiers_call.sh "$final/ab" "$PLAN"
fi
echo "--- kernels"
grep -E "^time|^check|PASSED|FAILED|SMs" "$final/prefill-kernels.txt" 2>/dev/null
cat "$final/ab/summary.txt" 2>/dev/null
