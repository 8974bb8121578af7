#!/usr/bin/env bash
# Runs each fuzz target for SECONDS from its seeds and its kept corpus, and
# prints one line per target: seconds, executions, crashes. Usage:
#   fuzz/run_fuzz.sh BUILD_DIR SECONDS [TARGET...]   (make fuzz FUZZ_SECONDS=N)
# A crashing input is left in BUILD_DIR/fuzz-artifacts/TARGET/; copy it to
# fuzz/regressions/TARGET/ once fixed (make fuzz replays those first).
# Targets run FUZZ_JOBS at a time (default: the number of cores; each is one
# process on one core).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$1"
seconds="$2"
shift 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf safetensors tokenizer jinja request detokenizer)
python3 "$here/make_seeds.py" "$build/fuzz-seeds" >/dev/null
declare -A max_len=([gguf]=65536 [safetensors]=16384 [tokenizer]=32768 [jinja]=8192
  [request]=16384 [detokenizer]=4096)
declare -A dict=([safetensors]=json [tokenizer]=json [request]=json [jinja]=jinja)
# One target: its regressions, then SECONDS of fuzzing; one summary line, exit 1 on a failure.
fuzz_one() {
  local t="$1"
  local bin="$build/bin/fuzz_$t" corpus="$build/fuzz-corpus/$t" arts="$build/fuzz-artifacts/$t"
  mkdir -p "$corpus" "$arts"
  # the inputs that once crashed must pass before new ones are looked for
  if [ -d "$here/regressions/$t" ] &&
    ! "$bin" -runs=0 "$here/regressions/$t" >"$build/fuzz-$t.log" 2>&1; then
    echo "fuzz_$t: a regression input fails again (see $build/fuzz-$t.log)"
    return 1
  fi
  local opts=(-max_total_time="$seconds" -max_len="${max_len[$t]}" -timeout=20 -rss_limit_mb=2560
    -artifact_prefix="$arts/" -print_final_stats=1)
  [ -n "${dict[$t]:-}" ] && opts+=(-dict="$here/dict/${dict[$t]}.dict")
  local start rc took execs crashes
  start=$(date +%s)
  "$bin" "${opts[@]}" "$corpus" "$build/fuzz-seeds/$t" >"$build/fuzz-$t.log" 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz-$t.log" | grep -o '[0-9]*$')
  # slow-unit-* files are inputs slower than 10 s, kept for a look; not failures
  crashes=$(find "$arts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  echo "fuzz_$t: ${took}s, ${execs:-?} executions, corpus $(ls "$corpus" | wc -l), rc $rc, $crashes crashing inputs in $arts"
  [ $rc -eq 0 ]
}

jobs_max="${FUZZ_JOBS:-$(nproc)}"
if ! [[ "$jobs_max" =~ ^[1-9][0-9]*$ ]]; then
  echo "FUZZ_JOBS=$jobs_max: expected a whole number of targets at once, 1 or more" >&2
  exit 2
fi
declare -A pid_of
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
  fuzz_one "$t" >"$build/fuzz-$t.summary" &
  pid_of[$t]=$!
done
status=0
for t in "${targets[@]}"; do
  wait "${pid_of[$t]}" || status=1
  cat "$build/fuzz-$t.summary"
done
exit $status
