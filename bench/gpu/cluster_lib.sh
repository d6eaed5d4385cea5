# Shared by the GPU cluster benchmarks (sourced): a summary line, one `strata up` started and
# stopped, and the table of a folder's bench JSON files. Expects $B (the binaries), $out (the
# logs), $sum (the summary file) and $start.

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

# One line per bench/results JSON file in folder $1 (decode tok/s, TTFT, throughput).
results_table() {
  python3 - "$1" <<'PY'
import glob, json, os, sys
print('file | conc | decode tok/s mean | P5 | P95 | TTFT ms | throughput tok/s')
for f in sorted(glob.glob(os.path.join(sys.argv[1], '*.json'))):
    try:
        r = json.load(open(f))
    except Exception:
        continue
    if 'decode_tok_s_mean' in r:
        print(f"{os.path.basename(f)} | {r.get('concurrency')} | {r['decode_tok_s_mean']:.1f} | "
              f"{r['decode_tok_s_p5']:.1f} | {r['decode_tok_s_p95']:.1f} | {r['ttft_ms']:.1f} | "
              f"{r.get('throughput_tok_s', float('nan')):.1f}")
PY
}
