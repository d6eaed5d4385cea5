# Shared by the GPU cluster benchmarks (sourced): a summary line, and one `strata up` started and
# stopped. Expects $B (the binaries), $out (the logs), $sum (the summary file) and $start.

note() { echo "$*" | tee -a "$sum"; }

# Starts `strata up` with the given flags and waits up to $UP_WAIT_S (default 120) seconds for
# its READY line; sets $addr (empty on failure) and $up.
up() {
  local name=$1; shift
  "$B/strata" up "$@" >"$out/up-$name.out" 2>"$out/up-$name.log" &
  up=$!
  addr=
  for _ in $(seq 1 $((2 * ${UP_WAIT_S:-120}))); do
    addr=$(awk '/^READY/{print $2}' "$out/up-$name.out")
    [ -n "$addr" ] && break
    kill -0 $up 2>/dev/null || break
    sleep 0.5
  done
  [ -n "$addr" ] || { note "$name: no READY after $((SECONDS - start)) s"; tail -5 "$out/up-$name.log" | tee -a "$sum"; }
}

down() { kill -TERM $up 2>/dev/null; wait $up; note "$1: strata up exit $?"; }
