#!/usr/bin/env bash
# One GPU-machine call for the expert tiers on the GPU path, driven by a plan file: the CUDA
# tests named in TESTS (from .device-ipc/bin; "base:NAME" from .device-base/bin), then the
# plan's lines in order:
#   model SHAPE DTYPE LAYERS   make-model SHAPE (Zipf(1.0)-skewed routing; LAYERS 0: all) into
#                              /dev/shm, unless there; later runs use it
#   run NAME|BIN_DIR|WEIGHTS|UP FLAGS|BENCH FLAGS|ENV   one cluster (tiers_ipc_bench.sh), the
#                              checkpoint mapped in place; ENV: VAR=VALUE words for its
#                              processes (optional)
#   drop                       deletes the current model (the next may not fit beside it)
#   budget SECONDS             skips the rest once the call has run this long
# Unpacks .device-ipc/bundle.tar.xz, .device-ipc/oracles.tar.xz, .device-demo/demo.tar.xz and
# .device-base/base-bin.tar.xz.
# The device tool brings back at most 8 files: everything lands in /tmp/tiers-out, packed into
# OUT_DIR/results.tgz, with summary.txt.
#   TESTS="cuda_ipc_test" bash bench/gpu/tiers_call.sh OUT_DIR PLAN_FILE
set -uo pipefail
final=$1 plan=$2 out=/tmp/tiers-out
mkdir -p "$final" "$out" .device-ipc
tar xJf .device-ipc/bundle.tar.xz -C .device-ipc
[ -f .device-ipc/oracles.tar.xz ] && tar xJf .device-ipc/oracles.tar.xz
[ -f .device-demo/demo.tar.xz ] && tar xJf .device-demo/demo.tar.xz  # the demo model's tests
[ -f .device-base/base-bin.tar.xz ] && tar xJf .device-base/base-bin.tar.xz -C .device-base
export LD_LIBRARY_PATH=$PWD/.device-ipc/lib:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
start=$SECONDS
sum=$out/summary.txt
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
for t in ${TESTS:-}; do
  bin=.device-ipc/bin/$t
  [[ $t == base:* ]] && bin=.device-base/bin/${t#base:}
  log=$out/${t/:/-}.log
  timeout "${TEST_TIMEOUT_S:-60}" "$bin" >"$log" 2>&1
  echo "$t exit $? ($(grep -E '^\[  (PASSED|FAILED)' "$log" | tr '\n' ' '))" | tee -a "$sum"
  grep -E "^\[  FAILED|Failure" "$log" | head -5 | tee -a "$sum"
done
dir="" limit=100000 n=0
while read -r word rest; do
  case "$word" in
    ""|"#"*) continue ;;
    budget) limit=$rest ;;
    model)
      read -r shape dtype layers <<<"$rest"
      dir=/dev/shm/$shape-$dtype; args=()
      [ "$layers" != 0 ] && dir=$dir-${layers}L && args=(--layers "$layers")
      if (( SECONDS - start < limit )) && [ ! -f $dir/config.json ]; then
        t0=$SECONDS
        .device-ipc/bin/strata make-model --shape "$shape" --dtype "$dtype" "${args[@]}" \
          --skew zipf:1.0 --out $dir --threads 16 >>"$out/make.log" 2>&1
        echo "made $dir ($(du -sh $dir | cut -f1)) in $((SECONDS - t0)) s" | tee -a "$sum"
      fi ;;
    drop) rm -rf "$dir" ;;
    run)
      if (( SECONDS - start >= limit )); then echo "skipped: $rest" | tee -a "$sum"; continue; fi
      IFS='|' read -r name bin weights flags bench_flags env_words <<<"$rest"
      n=$((n + 1))
      bash bench/gpu/tiers_ipc_bench.sh "$out/$n-$name" \
        "$name|$bin|$dir|$weights|--expert-store in-place $flags|$bench_flags|$env_words" \
        >"$out/$n-$name.txt" 2>&1
      tail -1 "$out/$n-$name/summary.txt" 2>/dev/null | sed 's/^/  /'
      grep -E "^$name \|" "$out/$n-$name/summary.txt" | tee -a "$sum" ;;
  esac
done <"$plan"
echo "total $((SECONDS - start)) s" | tee -a "$sum"
cp "$sum" "$final/"
tar czf "$final/results.tgz" -C "$out" .
