#!/usr/bin/env bash
# Runs each libFuzzer target for a bounded time from its seed corpus (tests/fuzz/corpus/<name>/),
# writing new inputs to a scratch folder so that the repository's corpus is not changed. A crash,
# a leak-free abort or a timeout fails the run and leaves the input under the scratch folder.
#
#   tests/fuzz/run.sh BUILD_DIR SECONDS TARGET...
set -euo pipefail
dir="$1"; seconds="$2"; shift 2
corpus_root="$(cd "$(dirname "$0")" && pwd)/corpus"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/trainerd-fuzz.XXXXXX")"
status=0
for target in "$@"; do
  name="${target%_fuzz}"
  mkdir -p "$scratch/$name"
  echo "fuzz: $target for ${seconds}s"
  # -rss_limit_mb: the module check's target loads LibTorch; -timeout: one input, seconds.
  if ! ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
       "$dir/$target" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 \
         -print_final_stats=1 -artifact_prefix="$scratch/$name-" \
         "$scratch/$name" "$corpus_root/$name" > "$scratch/$name.log" 2>&1; then
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
