#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time (ctest label `fuzz`, and
# scripts/fuzz.sh):  run_fuzzer.sh BINARY SEED_CORPUS_DIR SECONDS ARTIFACT_DIR
# New inputs go to a scratch dir (the checked-in seeds are read, not
# changed); a crashing input is kept in ARTIFACT_DIR and the exit status is
# non-zero.
set -euo pipefail
bin=$1 seeds=$2 secs=$3 artifacts=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/kolo-fuzz-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$artifacts"
# FUZZ_RUNS=N (and FUZZ_SEED, default 1): a fixed number of inputs from a
# fixed seed instead of a time budget, so a run is repeatable (CI uses it:
# the same inputs pass here and there); SECONDS stays as a backstop.
if [ -n "${FUZZ_RUNS:-}" ]; then
  args=(-runs="$FUZZ_RUNS" -seed="${FUZZ_SEED:-1}" -max_total_time="$secs")
else
  args=(-max_total_time="$secs")
fi
args+=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/" "$work")
[ -d "$seeds" ] && args+=("$seeds")
"$bin" "${args[@]}"
