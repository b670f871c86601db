#!/usr/bin/env bash
# Sanitizer builds and test runs; scripts/test.sh (CI) runs both after the
# main suite.
#
#   scripts/sanitize.sh              # both
#   scripts/sanitize.sh asan         # build-asan: gcc -fsanitize=address,undefined
#   scripts/sanitize.sh tsan         # build-tsan: gcc -fsanitize=thread
#   scripts/sanitize.sh asan --build-only
#   scripts/sanitize.sh --list       # each kind's targets and ctest labels
#
# Each kind builds only the targets its tests need (with the daemons they
# start), at -O1 -g1 (line tables: full stacks, a third less compile time
# than -O2 -g), and runs those ctest labels:
#   asan  unit, agent, client, fusion, backend, coordinator, integration,
#         integration-multiagent, integration-collectives, device-emulation
#         (the device protocol through real daemons over the host-emulated
#         device, the pinned staging, several emulated GPUs; the sanitizer
#         builds have no CUDA and so no NCCL: the NCCL emulation's tests,
#         the NCCL route across agents and the node-local NCCL cases skip
#         or are not built there)
#   tsan  unit (event loop, worker pool, staging pool), agent (negotiation
#         join: CrossJob over real peers), integration, integration-multiagent
#         (the agent's threads under real jobs, one and several agents)
# (device-emulation is not under TSan yet.)
#
# Every process a test starts (kolo-agent, kolo-coordinator, trainers)
# inherits the sanitizer options and writes its reports to
# <build>/sanitizer-logs/<kind>.<pid> (child processes' output would
# otherwise vanish with their temp dirs); the script prints a summary of
# them and of the failing tests, and exits non-zero if there was either.
# Suppressions (what is not kolo's): scripts/sanitizers/*.supp.
#
# Environment: SAN_JOBS (ninja -j, 2), SAN_TEST_JOBS (ctest -j, 2),
# SAN_CC/SAN_CXX (gcc/g++), CCACHE_DIR, SAN_CTEST_ARGS (extra ctest args),
# SAN_BUDGET_S_asan / SAN_BUDGET_S_tsan: wall-clock budget in seconds of
# that kind's build and tests together (0 or unset: none); past it the kind
# is stopped and fails, saying so.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=${SAN_JOBS:-2}
test_jobs=${SAN_TEST_JOBS:-2}
cc=${SAN_CC:-gcc}
cxx=${SAN_CXX:-g++}

# Targets: the tests' executables and what they start.
asan_targets=(kolo-agent kolo-coordinator kolo_check
  kolo_unit_tests kolo_agent_tests kolo_client_tests kolo_client_abi_tests kolo_fusion_tests
  kolo_timeline_tests kolo_stall_tests kolo_autotuner_tests
  kolo_backend_tests kolo_backend_test_peer kolo_coordinator_tests
  kolo_integration_tests kolo_shm_attack_tests kolo_multi_agent_tests kolo_autotune_tests
  kolo_collectives_tests
  kolo_gpu_seam_tests kolo_gpu_seam_rank kolo_gpu_staging_tests kolo_nccl_comm_tests
  kolo_nccl_emu_process_tests kolo_gpu_nccl_rank kolo_gpu_several_tests kolo_gpu_emu_gpus_tests
  kolo_gpu_nccl_cross_tests)
asan_labels='^(unit|agent|client|fusion|backend|coordinator|integration|integration-multiagent|integration-collectives|device-emulation)$'
tsan_targets=(kolo-agent kolo-coordinator kolo_check
  kolo_unit_tests kolo_agent_tests kolo_integration_tests kolo_shm_attack_tests kolo_multi_agent_tests
  kolo_autotune_tests)
tsan_labels='^(unit|agent|integration|integration-multiagent)$'

kinds=()
build_only=0
for a in "$@"; do
  case "$a" in
    asan|tsan) kinds+=("$a") ;;
    all) kinds=(asan tsan) ;;
    --build-only) build_only=1 ;;
    --list)
      echo "asan targets: ${asan_targets[*]}"; echo "asan labels: $asan_labels"
      echo "tsan targets: ${tsan_targets[*]}"; echo "tsan labels: $tsan_labels"
      exit 0 ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "sanitize.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
[ ${#kinds[@]} -gt 0 ] || kinds=(asan tsan)

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

# Seconds left of this kind's budget ("" when it has none).
budget_left() {
  [ "${budget:-0}" -gt 0 ] || return 0
  local left=$((budget - (SECONDS - kind_start)))
  [ $left -gt 0 ] || left=1
  echo $left
}
# Runs a command within what is left of the budget; 124 when it ran out.
within_budget() {
  local left
  left=$(budget_left)
  if [ -n "$left" ]; then timeout --signal=TERM --kill-after=30 "$left" "$@"; else "$@"; fi
}

configure() {  # dir flags
  local dir=$1 flags=$2
  # A build dir configured with other flags (an older version of this
  # script) is configured again.
  if [ -f "$dir/build.ninja" ] && [ "$(cat "$dir/sanitize-flags" 2>/dev/null)" = "$flags -O1 -g1" ]; then
    return 0
  fi
  rm -f "$dir/CMakeCache.txt" "$dir/sanitize-flags"
  CC="$cc" CXX="$cxx" cmake -S . -B "$dir" -G Ninja "${launcher[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DKOLO_BUILD_BENCH=OFF -DKOLO_BUILD_TESTS=ON \
    -DKOLO_WITH_CUDA=OFF -DKOLO_WITH_NCCL=OFF \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" &&
    echo "$flags -O1 -g1" > "$dir/sanitize-flags"
}

# Builds the targets that exist in this tree (a folder may be absent).
build() {  # dir targets...
  local dir=$1
  shift
  local have=() t
  local known
  known=$(ninja -C "$dir" -t targets all 2>/dev/null | cut -d: -f1)
  for t in "$@"; do
    if grep -qx "$t" <<<"$known"; then have+=("$t"); else echo "sanitize.sh: no target $t, skipped"; fi
  done
  # Keep going past a target that does not compile (another folder may be
  # half-written): its tests show up as *_NOT_BUILT and are left out below.
  local st=0
  within_budget nice ninja -C "$dir" -j"$jobs" -k 0 "${have[@]}" || st=$?
  if [ $st = 124 ] || [ $st = 137 ]; then
    echo "sanitize.sh: $kind: the build ran past the budget of ${budget} s" >&2
    return 124
  elif [ $st != 0 ]; then
    echo "sanitize.sh: some targets did not build (see above); testing the others" >&2
  fi
  return 0
}

summarize() {  # dir kind ctest_status
  local dir=$1 kind=$2 status=$3 logs="$1/sanitizer-logs"
  local report="$dir/sanitizer-report.txt"
  local files=()
  mapfile -t files < <(find "$logs" -type f -size +0 2>/dev/null | sort)
  # In-process reports (a test binary's own UBSan/ASan errors) may land in
  # ctest's output instead of log_path: count that file too.
  if grep -qE 'runtime error:|ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer' "$dir/ctest.log" 2>/dev/null; then
    files+=("$dir/ctest.log")
  fi
  {
    echo "== $kind: ctest exit status $status"
    if [ -f "$dir/Testing/Temporary/LastTestsFailed.log" ] && [ "$status" != 0 ]; then
      echo "-- failed tests:"
      sed 's/^/   /' "$dir/Testing/Temporary/LastTestsFailed.log"
      # What each failed test said (ctest.log stays in the build dir, which
      # CI does not keep): its assertion lines and rank lines, capped.
      local n
      while IFS=: read -r n _; do
        echo "-- test #$n, excerpt:"
        awk -v n="$n" '
          $0 ~ "^ *[0-9]+/[0-9]+ Test +#" n ":" && /\*\*\*/ { on = 1; next }
          on && (/^ *[0-9]+\/[0-9]+ Test +#/ || /^ *Start +[0-9]+:/) { on = 0 }
          on' "$dir/ctest.log" |
          grep -E 'Failure|FAIL|rror|Expected|Which is|Value of|Actual|rank [0-9]+|init failed|signal|Sanitizer' |
          cut -c1-400 | head -60 | sed 's/^/   | /'
      done < "$dir/Testing/Temporary/LastTestsFailed.log"
    fi
    echo "-- sanitizer reports: ${#files[@]} file(s) (in $logs and $dir/ctest.log)"
    if [ ${#files[@]} -gt 0 ]; then
      # One line per distinct finding: the headline and the first frame in
      # kolo's code (paths absolute or relative to the build dir).
      for f in "${files[@]}"; do
        awk -v src="$root/" '
          /^(==[0-9]+==)?ERROR: (Address|Leak)Sanitizer|^WARNING: ThreadSanitizer|runtime error:/ {
            if (head != "") print head " @ " frame; head = $0; frame = ""; next }
          head != "" && frame == "" && / in / && (index($0, src) > 0 || index($0, " ../") > 0) {
            sub(/^.* in /, ""); frame = $0 }
          END { if (head != "") print head " @ " frame }' "$f"
      done | sed -e "s#$root/##g" -e 's#^==[0-9]*==##' | sort | uniq -c | sort -rn | head -60
    fi
  } | tee "$report"
  [ "$status" = 0 ] && [ ${#files[@]} = 0 ]
}

run_kind() {
  local kind=$1 dir flags targets labels
  kind_start=$SECONDS
  budget=0
  case "$kind" in
    asan)
      dir=build-asan
      flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
      targets=("${asan_targets[@]}")
      labels=$asan_labels
      budget=${SAN_BUDGET_S_asan:-0}
      ;;
    tsan)
      dir=build-tsan
      flags="-fsanitize=thread -fno-omit-frame-pointer"
      targets=("${tsan_targets[@]}")
      labels=$tsan_labels
      budget=${SAN_BUDGET_S_tsan:-0}
      ;;
  esac
  local note=""
  [ "$budget" -gt 0 ] && note=", budget $budget s for build and tests"
  echo "=== $kind: configure + build $dir (${#targets[@]} targets$note)"
  configure "$dir" "$flags" || return 1
  build "$dir" "${targets[@]}" || return 1
  echo "=== $kind: built in $((SECONDS - kind_start)) s"
  [ "$build_only" = 1 ] && return 0

  local logs="$root/$dir/sanitizer-logs"
  rm -rf "$logs"
  mkdir -p "$logs"
  # called_from_lib wants one pattern per library (a pattern matching two
  # is an error): list the uninstrumented ones our binaries load.
  cp scripts/sanitizers/tsan.supp "$root/$dir/tsan.supp"
  local lib
  for lib in $(for b in "$dir"/bin/*; do ldd "$b" 2>/dev/null; done |
               grep -o 'lib\(absl_[a-z0-9_]*\|grpc++\|grpc\|gpr\|upb\|protobuf\|re2\|cares\|address_sorting\|ssl\|crypto\|ucs\|ucp\|uct\|ucm\)\.so[.0-9]*' |
               sort -u); do
    echo "called_from_lib:$lib"
  done >> "$root/$dir/tsan.supp"
  export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=0"
  export LSAN_OPTIONS="suppressions=$root/scripts/sanitizers/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1"
  export TSAN_OPTIONS="log_path=$logs/tsan:suppressions=$root/$dir/tsan.supp:second_deadlock_stack=1:halt_on_error=0"
  local wrap=()
  if [ "$kind" = tsan ]; then
    # UCX's memory hooks (libucm) intercept mmap/madvise, also in glibc's
    # thread exit, and take a lock there that TSan intercepts after it has
    # torn down the thread: the agent dies with SIGSEGV inside TSan. Not
    # needed for host-memory tests.
    export UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none
    # gcc's TSan cannot map its shadow with more than 28 bits of mmap
    # randomisation (newer kernels default to 32): run without ASLR there.
    local bits
    bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)
    if [ "$bits" -gt 28 ]; then wrap=(setarch "$(uname -m)" -R); fi
  fi
  echo "=== $kind: ctest -L '$labels' -j$test_jobs (full output in $dir/ctest.log)"
  local test_start=$SECONDS status=0
  # shellcheck disable=SC2086
  within_budget "${wrap[@]}" ctest --test-dir "$dir" -L "$labels" -E '_NOT_BUILT$' -j"$test_jobs" \
    --output-on-failure --timeout 900 ${SAN_CTEST_ARGS:-} > "$dir/ctest.log" 2>&1 || status=$?
  grep -E '^[0-9]+% tests passed|\*\*\*(Failed|Timeout|Exception)|Not Run' "$dir/ctest.log"
  if [ $status = 124 ] || [ $status = 137 ]; then
    echo "sanitize.sh: $kind: the tests ran past the budget of ${budget} s (see $dir/ctest.log)" >&2
  fi
  echo "=== $kind: tests took $((SECONDS - test_start)) s; $kind in all $((SECONDS - kind_start)) s"
  unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS UCX_MEM_EVENTS UCX_MEM_MALLOC_HOOKS \
    UCX_MEM_MMAP_HOOK_MODE
  summarize "$dir" "$kind" "$status"
}

overall=0
for k in "${kinds[@]}"; do
  run_kind "$k" || overall=1
done
exit $overall
