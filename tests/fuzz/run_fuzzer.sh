#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SEEDS WORKDIR [LIBFUZZER FLAGS...] — one bounded fuzzing run (a ctest
# test; docs/fuzzing.md).
#
# Runs FUZZER for KRAB_FUZZ_SECONDS (default 15) from the seed corpus SEEDS (read only: new
# inputs go to WORKDIR/corpus, which later runs start from too). A crash, sanitizer report
# (UBSan made fatal here), timeout or finding leaves its input in WORKDIR/artifacts/ and fails
# the test. Prints one summary line: executions, inputs saved, out-of-memory skipped, corpus.
set -uo pipefail
fuzzer=$1 seeds=$2 work=$3
shift 3
seconds=${KRAB_FUZZ_SECONDS:-15}
name=$(basename "$fuzzer")
mkdir -p "$work/corpus" "$work/artifacts"
touch "$work/log.start"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$(dirname "$0")/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
# timeout(1) guards the wall clock for the whole process group (fork mode's children too): a
# child that runs out of memory while LibTorch fills a forged allocation can hang in its report.
timeout -k 10 $((seconds + 120)) \
  "$fuzzer" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" "$@" "$work/corpus" "$seeds" >"$work/log" 2>&1
rc=$?
((rc == 124 || rc == 137)) && echo "fuzz $name: cut by the wall-clock guard after $((seconds + 120)) s"
# -fork=1 prints running totals ("#123: cov: ... oom/timeout/crash: 1/0/0 ...") instead of stats.
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
[[ -n $execs ]] || execs=$(sed -n 's/^#\([0-9]*\): cov:.*/\1/p' "$work/log" | tail -1)
ooms=$(sed -n 's|.*oom/timeout/crash: \([0-9]*\)/.*|\1|p' "$work/log" | tail -1)
inputs=$(find "$work/artifacts" -type f -newer "$work/log.start" 2>/dev/null | wc -l)
echo "fuzz $name: ${execs:-?} executions in ${seconds} s, exit $rc, $inputs input(s) saved" \
  "to artifacts/${ooms:+ ($ooms ignored out-of-memory)}, corpus $(find "$work/corpus" -type f |
  wc -l) + $(find "$seeds" -type f | wc -l) seeds"
# In fork mode the exit status is the last child's, crash or not: the replay below decides.
if ((rc != 0)) && [[ " $* " != *" -ignore_crashes=1 "* ]]; then
  tail -n 60 "$work/log"
  exit 1
fi
# With -ignore_crashes (no target passes it since the state files became records; it was for
# targets that fed LibTorch's archive loader, see CMakeLists.txt) a crash does not stop the run:
# replay each one saved and accept it only if it happened inside LibTorch's archive
# loader (an allocation ASan refused, or a fault whose innermost frame is in libtorch_cpu);
# anything else, krab's code included, fails the test.
status=0
while IFS= read -r input; do
  if "$fuzzer" "$input" >"$work/replay" 2>&1; then continue; fi
  if grep -qE "AddressSanitizer: (out-of-memory|allocation-size-too-big|requested allocation size)" \
      "$work/replay"; then
    echo "  $(basename "$input"): an allocation LibTorch asked for and ASan refused (known limit)"
  elif grep -qE "AddressSanitizer: (SEGV|stack-overflow)" "$work/replay" &&
      grep -aE "^ +#0 " "$work/replay" | head -1 | grep -q "libtorch_cpu.so"; then
    echo "  $(basename "$input"): a fault inside LibTorch's archive loader (known limit)"
  else
    echo "  $(basename "$input"): a finding"
    tail -n 60 "$work/replay"
    status=1
  fi
done < <(find "$work/artifacts" -name 'crash-*' -newer "$work/log.start")
exit $status
