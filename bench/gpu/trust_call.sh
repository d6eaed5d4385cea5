#!/usr/bin/env bash
# One GPU-machine call for the trust work: the CUDA IPC and GPU cluster tests (among them a
# worker stopped while decode steps replay graphs), then bench/gpu/plans/trust.txt, decode
# through the GPU cluster before and after. Carries .device-ipc (bench/gpu/pack_device.sh
# BUILD_DIR), .device-demo and .device-base/base-bin.tar.xz (the base build's strata,
# strata-router, strata-worker and strata-expert-store under bin/, and COMMIT), with models/ and
# tests/data/oracles/ moved aside for the call. OUT_DIR gets summary.txt, the tests' logs and
# ab/ (tiers_call.sh's results.tgz and summary).
#   bash bench/gpu/trust_call.sh OUT_DIR [BUILD_DIR_NAME]
set -uo pipefail
final=$1 build=${2:-build-cuda}
source "$(dirname "${BASH_SOURCE[0]}")/unpack_device.sh"
for t in cuda_ipc_test:120 cuda_cluster_test:300 cuda_tiers_test:300; do
  limit=${t#*:} t=${t%:*}
  timeout "$limit" ".device-ipc/bin/$t" >"$final/$t.log" 2>&1
  echo "$t exit $? ($(grep -E '^\[  (PASSED|FAILED)' "$final/$t.log" | tr '\n' ' '))" | tee -a "$sum"
  grep -E "^\[  FAILED|Failure|stopped worker|killed worker" "$final/$t.log" | head -8 | tee -a "$sum"
done
OUT_LEN=128 RUNS=2 bash bench/gpu/tiers_call.sh "$final/ab" bench/gpu/plans/trust.txt
