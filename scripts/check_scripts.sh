#!/usr/bin/env bash
# Every shell script of the tree parses (bash -n): the GPU benchmark scripts run only on the
# GPU machine, where a syntax error would cost device time instead of a CI run.
set -uo pipefail
cd "$(dirname "$0")/.."
failed=0 checked=0
while IFS= read -r script; do
  checked=$((checked + 1))
  if ! out=$(bash -n "$script" 2>&1); then
    echo "FAIL: $script does not parse: $out"
    failed=$((failed + 1))
  fi
done < <(git ls-files '*.sh')
echo "$checked shell scripts checked, $failed failed"
[ "$failed" -eq 0 ]
