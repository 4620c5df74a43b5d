#!/usr/bin/env bash
# Runs each libFuzzer target for a bounded time from its seed corpus (tests/fuzz/corpus/<name>/),
# writing new inputs to a scratch folder so that the repository's corpus is not changed. A crash,
# a leak-free abort or a timeout fails the run and leaves the input under the scratch folder.
# FUZZ_JOBS targets run at once (default: the number of cores); each target is one process on one
# core, so running them side by side gives each the same time as running them in turn, in less
# wall time.
#
#   tests/fuzz/run.sh BUILD_DIR SECONDS TARGET...
set -euo pipefail
dir="$1"; seconds="$2"; shift 2
jobs="${FUZZ_JOBS:-$(nproc)}"
# A positive count (0, a negative or a word would never start a target, or never stop waiting).
[[ "$jobs" =~ ^[1-9][0-9]{0,3}$ ]] || { echo "fuzz: FUZZ_JOBS must be 1-9999, not '$jobs'" >&2; exit 2; }
corpus_root="$(cd "$(dirname "$0")" && pwd)/corpus"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/trainerd-fuzz.XXXXXX")"

run_one() {  # run_one TARGET: 0 when it ran its time without a finding
  local target="$1" name="${1%_fuzz}"
  mkdir -p "$scratch/$name"
  # -rss_limit_mb: the module check's target loads LibTorch; -timeout: one input, seconds.
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    "$dir/$target" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 \
      -print_final_stats=1 -artifact_prefix="$scratch/$name-" \
      "$scratch/$name" "$corpus_root/$name" > "$scratch/$name.log" 2>&1
}

declare -A pids=()
for target in "$@"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  echo "fuzz: $target for ${seconds}s"
  run_one "$target" &
  pids[$target]=$!
done

status=0
for target in "$@"; do
  name="${target%_fuzz}"
  if ! wait "${pids[$target]}"; then
    echo "fuzz: $target FAILED; its log and the failing input are under $scratch:" >&2
    tail -40 "$scratch/$name.log" >&2
    status=1
    continue
  fi
  grep -E "stat::number_of_executed_units|stat::new_units_added" "$scratch/$name.log" |
    tr '\n' ' ' | sed "s/^/fuzz: $target /"; echo
done
[ "$status" -eq 0 ] && rm -rf "$scratch"
exit "$status"
