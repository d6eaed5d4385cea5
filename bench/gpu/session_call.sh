#!/usr/bin/env bash
# One GPU-machine call of several parts, in order, each optional: the host-to-device copy
# rate (bench/gpu/h2d_rate.py; H2D=0 skips it), the GPU tests of TESTS (tiers_call.sh's TESTS,
# GTEST_FILTER), the sampled-decode A/B of profile_sampled.sh between the binaries in
# .device-ipc/bin and decode_bench_base, or of two environments (SAMPLED=1, SAMPLED_ENV="A|B";
# ONLY, NCU as there), then a tiers plan
# (PLAN), stopped after PLAN_S seconds (by default what is left of CALL_S, 580, since the call
# began; what ran is kept).
# Everything lands in /tmp/session-out, packed again into OUT_DIR/all.tgz after each part (the
# device tool brings back few files, and what a call killed at its limit left), with
# OUT_DIR/summary.txt.
#   TESTS=cuda_ops_test SAMPLED=1 PLAN=bench/gpu/plans/deepseek-prefetch.txt \
#     bash bench/gpu/session_call.sh OUT_DIR
set -uo pipefail
final=$1 work=/tmp/session-out
mkdir -p "$final" "$work" .device-ipc
tar xJf .device-ipc/bundle.tar.xz -C .device-ipc
export LD_LIBRARY_PATH=$PWD/.device-ipc/lib:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
pack() { cp "$work/summary.txt" "$final/" 2>/dev/null; tar czf "$final/all.tgz" -C "$work" .; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$work/summary.txt"
# The host-to-device copy rate the tiers' copy bound divides by (H2D=0 skips it).
if [ "${H2D:-1}" = 1 ]; then
  python3 bench/gpu/h2d_rate.py "$work/h2d_rate.json" 2>&1 | tee -a "$work/summary.txt"
fi
if [ -n "${TESTS:-}" ]; then
  bash bench/gpu/tiers_call.sh "$work/tests" /dev/null 2>&1 | tail -12 | tee -a "$work/summary.txt"
  pack
fi
if [ "${SAMPLED:-0}" = 1 ]; then
  # Base and new: decode_bench_base against .device-ipc/bin, or (SAMPLED_ENV="A|B") the same
  # binaries under the environment words A, then B.
  base_bin=.device-ipc/base base_env="" new_env=""
  if [ -n "${SAMPLED_ENV:-}" ]; then
    base_bin=.device-ipc/bin base_env=${SAMPLED_ENV%%|*} new_env=${SAMPLED_ENV#*|}
  fi
  mkdir -p .device-ipc/base "$work/sampled-base" "$work/sampled-new"
  [ -f .device-ipc/bin/decode_bench_base ] && cp .device-ipc/bin/decode_bench_base .device-ipc/base/decode_bench
  # shellcheck disable=SC2086
  env $base_env NCU=0 bash bench/gpu/profile_sampled.sh "$work/sampled-base" 4 $base_bin 2>&1 |
    sed "s/^/base $base_env /" | tee -a "$work/summary.txt"
  pack
  # shellcheck disable=SC2086
  env $new_env NCU=${NCU:-0} bash bench/gpu/profile_sampled.sh "$work/sampled-new" 4 .device-ipc/bin 2>&1 |
    sed "s/^/new $new_env /" | tee -a "$work/summary.txt"
  pack
fi
if [ -n "${PLAN:-}" ]; then
  rm -rf /tmp/tiers-out
  TESTS="" timeout "${PLAN_S:-$((${CALL_S:-580} - SECONDS))}" bash bench/gpu/tiers_call.sh "$work/plan" "$PLAN" 2>&1 |
    tail -12 | tee -a "$work/summary.txt"
  mkdir -p "$work/plan" && cp -r /tmp/tiers-out/. "$work/plan/"
  pack
fi
