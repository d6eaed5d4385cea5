#!/usr/bin/env bash
# Strata and llama.cpp on the same checkpoint and card, in two GPU-machine calls made back to back
# (the second must find the machine still warm: llama.cpp's build and GGUFs stay on it):
#   a: builds llama.cpp (.peer/llama-peer, made by bench/gpu/prepare_peer.sh: the recipe, llama-bench
#      taking -p/-n from PP/TG) into /tmp/peer-build in the background, makes the model
#      (strata make-model, as tiers_call.sh's `model` line would) and llama.cpp's tokenizer and
#      bf16 GGUF, and meanwhile runs TESTS (cuda_ops_test filters) and the kernel benches
#      KERNEL_BENCHES (.device-ipc paths); then waits for the build.
#   b: llama.cpp's q8_0 and llama-bench (every expert on the GPU, and -ncmoe under the expert
#      budget), then the Strata PLAN (tiers_call.sh format) on the same model directory.
# Run `a` again if it printed RERUN (the build ran past its deadline). Everything of the call
# lands in OUT_DIR.tgz (a call brings back few files). Carries what prefill_call.sh does, and .peer.
#   STAGE=a bash bench/gpu/peer_call.sh OUT_DIR PLAN
#   STAGE=b bash bench/gpu/peer_call.sh OUT_DIR PLAN
set -uo pipefail
final=$1 plan=$2
source "$(dirname "${BASH_SOURCE[0]}")/unpack_device.sh"
peer=.peer/llama-peer res=/tmp/peer-res
export PEER_BUILD=/tmp/peer-build PP=${PP:-512,4096} TG=${TG:-128} REPS=${REPS:-3}
export STRATA=$PWD/.device-ipc/bin/strata
# Variants of single binaries (variants/BINARY.NAME): .device-ipc/NAME is the bundle with it.
if [ -f .device-ipc/variants.tar.xz ]; then
  tar xJf .device-ipc/variants.tar.xz -C .device-ipc
  for v in .device-ipc/variants/*.*; do
    [ -e "$v" ] || continue
    f=$(basename "$v") && mkdir -p ".device-ipc/${f##*.}" && cp .device-ipc/bin/* ".device-ipc/${f##*.}/"
    cp "$v" ".device-ipc/${f##*.}/${f%.*}"
  done
fi
# The plan's model line names the checkpoint: SHAPE DTYPE LAYERS -> tiers_call.sh's directory.
read -r shape dtype layers < <(awk '$1 == "model" {print $2, $3, $4; exit}' "$plan")
model=/dev/shm/$shape-$dtype-${layers}L
export LAYERS=$layers SHAPE=$shape
if [ "${STAGE:-a}" = a ]; then
  export PEER_T0=$(date +%s) DEADLINE=${DEADLINE:-500}
  UNPACK_ONLY=1 bash $peer/build.sh || exit 1
  JOBS=${JOBS:-16} bash $peer/build.sh >"$final/build.log" 2>&1 &
  build=$!
  if [ ! -f "$model/config.json" ]; then
    "$STRATA" make-model --shape "$shape" --dtype "$dtype" --layers "$layers" --skew zipf:1.0 \
      --out "$model" --threads 16 >"$final/make.log" 2>&1
    echo "made $model ($(du -sh "$model" | cut -f1))"
  fi
  STAGE=prep bash $peer/bench.sh "$model" "$res" >"$final/prep.log" 2>&1
  echo "llama.cpp prep exit $? ($(tail -1 "$final/prep.log"))"
  for t in ${TESTS:-}; do  # [VARIANT/]BINARY:GTEST_FILTER (bin/ when no variant is named)
    bin=${t%%:*} && [[ $bin == */* ]] || bin=bin/$bin
    log="$final/${bin//\//-}.log"
    timeout 200 ".device-ipc/$bin" --gtest_filter="${t#*:}" >"$log" 2>&1
    echo "$t exit $? ($(grep -E '^\[  (PASSED|FAILED)' "$log" | tr '\n' ' '))"
    grep -E "^\[  FAILED|Failure" "$log" | head -8
  done
  for b in ${KERNEL_BENCHES:-}; do
    name=$(echo "${b#.device-ipc/}" | tr / -)
    timeout 120 "$b" --json "$final/$name.json" >"$final/$name.txt" 2>&1
    echo "== $name exit $?"
    grep -E "^time|^check" "$final/$name.txt" | grep -v "CUDA cores" | sed 's/  */ /g'
  done
  wait $build
  echo "llama.cpp build exit $? ($(tail -1 "$final/build.log"))"
else
  export PEER_T0=$(date +%s) DEADLINE=${DEADLINE:-300}
  timeout "${PEER_TIMEOUT_S:-320}" bash $peer/bench.sh "$model" "$res" >"$final/llama.log" 2>&1
  echo "llama.cpp bench exit $?"
  cp -r "$res" "$final/llama"
  OUT_LEN=16 RUNS=2 timeout "${STRATA_TIMEOUT_S:-250}" bash bench/gpu/tiers_call.sh "$final/strata" \
    "$plan" >"$final/strata.log" 2>&1
  echo "strata plan exit $?"
  tail -14 "$final/llama.log"
  cat "$final/strata/summary.txt" 2>/dev/null
fi
tar czf "$final.tgz" -C "$final" . && rm -rf "$final"
