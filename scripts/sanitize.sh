#!/usr/bin/env bash
# Sanitizer builds and test runs.
#
#   scripts/sanitize.sh            # both
#   scripts/sanitize.sh asan       # build-asan: -fsanitize=address,undefined; ctest labels
#                                  #   unit, coordinator, agent, integration(-*)
#   scripts/sanitize.sh tsan       # build-tsan: -fsanitize=thread; ctest labels agent, unit
#                                  #   (the common event loop and worker pool), integration(-*)
#   scripts/sanitize.sh asan --build-only
#
# Every process a test starts (kolo-agent, kolo-coordinator, trainers)
# inherits the sanitizer options and writes its reports to
# <build>/sanitizer-logs/<kind>.<pid> (child processes' output would
# otherwise vanish with their temp dirs); the script prints a summary of
# them and of the failing tests, and exits non-zero if there was either.
#
# Environment: SAN_JOBS (ninja -j, 2), SAN_TEST_JOBS (ctest -j, 1),
# SAN_CC/SAN_CXX (gcc/g++), CCACHE_DIR, SAN_CTEST_ARGS (extra ctest args).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=${SAN_JOBS:-2}
test_jobs=${SAN_TEST_JOBS:-1}
cc=${SAN_CC:-gcc}
cxx=${SAN_CXX:-g++}

kinds=()
build_only=0
for a in "$@"; do
  case "$a" in
    asan|tsan) kinds+=("$a") ;;
    all) kinds=(asan tsan) ;;
    --build-only) build_only=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "sanitize.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
[ ${#kinds[@]} -gt 0 ] || kinds=(asan tsan)

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

# The executables of the test folders behind the labels, and the daemons
# they start.
test_targets() {  # folders...
  local d
  for d in "$@"; do
    [ -f "tests/$d/CMakeLists.txt" ] &&
      grep -ho 'add_executable([A-Za-z0-9_-]*' "tests/$d/CMakeLists.txt" | sed 's/add_executable(//'
  done
  echo kolo-agent
  echo kolo-coordinator
}
mapfile -t asan_targets < <(test_targets unit coordinator agent integration)
mapfile -t tsan_targets < <(test_targets unit agent integration)

configure() {  # dir flags
  local dir=$1 flags=$2
  if [ -f "$dir/build.ninja" ]; then return 0; fi
  CC="$cc" CXX="$cxx" cmake -S . -B "$dir" -G Ninja "${launcher[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKOLO_BUILD_BENCH=OFF -DKOLO_BUILD_TESTS=ON \
    -DKOLO_WITH_CUDA=OFF -DKOLO_WITH_NCCL=OFF \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags"
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
  if ! nice ninja -C "$dir" -j"$jobs" -k 0 "${have[@]}"; then
    echo "sanitize.sh: some targets did not build (see above); testing the others" >&2
  fi
}

summarize() {  # dir kind ctest_status
  local dir=$1 kind=$2 status=$3 logs="$1/sanitizer-logs"
  local report="$dir/sanitizer-report.txt"
  {
    echo "== $kind: ctest exit status $status"
    if [ -f "$dir/Testing/Temporary/LastTestsFailed.log" ] && [ "$status" != 0 ]; then
      echo "-- failed tests:"
      sed 's/^/   /' "$dir/Testing/Temporary/LastTestsFailed.log"
    fi
    local files=()
    mapfile -t files < <(find "$logs" -type f -size +0 2>/dev/null | sort)
    echo "-- sanitizer reports: ${#files[@]} file(s) in $logs"
    if [ ${#files[@]} -gt 0 ]; then
      # One line per distinct finding: the headline and the first frame in kolo's code.
      for f in "${files[@]}"; do
        awk -v file="$(basename "$f")" -v src="$root/" '
          /^(==[0-9]+==)?ERROR: (Address|Leak)Sanitizer|^WARNING: ThreadSanitizer|runtime error:/ {
            if (head != "" && frame != "") print head " @ " frame; head = $0; frame = ""; next }
          head != "" && frame == "" && index($0, src) > 0 {
            sub(/^.* in /, ""); frame = $0 }
          END { if (head != "") print head " @ " frame }' "$f"
      done | sed "s#$root/##g" | sort | uniq -c | sort -rn | head -60
    fi
  } | tee "$report"
  [ "$status" = 0 ] && [ -z "$(find "$logs" -type f -size +0 2>/dev/null)" ]
}

run_kind() {
  local kind=$1 dir flags targets labels
  case "$kind" in
    asan)
      dir=build-asan
      flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
      targets=("${asan_targets[@]}")
      labels='(^|;)(unit|coordinator|agent|integration(-[a-z]+)?)(;|$)'
      ;;
    tsan)
      dir=build-tsan
      flags="-fsanitize=thread -fno-omit-frame-pointer"
      targets=("${tsan_targets[@]}")
      labels='(^|;)(agent|unit|integration(-[a-z]+)?)(;|$)'
      ;;
  esac
  echo "=== $kind: configure + build $dir"
  configure "$dir" "$flags" || return 1
  build "$dir" "${targets[@]}"
  [ "$build_only" = 1 ] && return 0

  local logs="$root/$dir/sanitizer-logs"
  rm -rf "$logs"
  mkdir -p "$logs"
  # Suppressions for what is not ours (uninstrumented system libraries).
  cat > "$root/$dir/lsan.supp" <<'SUPP'
# gRPC/protobuf/UCX keep process-lifetime singletons
leak:libgrpc
leak:libgpr
leak:libprotobuf
leak:libucs
leak:libucp
leak:libuct
SUPP
  cat > "$root/$dir/tsan.supp" <<'SUPP'
# System libraries are built without -fsanitize=thread, so TSan cannot see
# their synchronisation: what they touch through interceptors (memmove in
# absl's mutex deadlock graph, malloc) and races whose top frame is their
# code (gRPC's C++ headers inlined into ours, racing with libgrpc++) are
# noise. race_top (not race): a gRPC handler's stack has gRPC frames below
# kolo's, and kolo's own races there must still be reported.
race_top:^grpc::
race_top:^grpc_core::
race_top:^grpc_
race_top:^absl::
race_top:^google::protobuf::
race_top:libgrpc
race_top:libgpr
race_top:libabsl
race_top:libprotobuf
race_top:libucs
race_top:libucp
race_top:libuct
# libucs unlocks a mutex it never locked in its ELF destructor, at exit.
mutex:_dl_call_fini
SUPP
  # called_from_lib wants one pattern per library (a pattern matching two
  # is an error): list the ones our binaries load.
  local lib
  for lib in $(for b in "$dir"/bin/*; do ldd "$b" 2>/dev/null; done |
               grep -o 'lib\(absl_[a-z0-9_]*\|grpc++\|grpc\|gpr\|upb\|protobuf\|re2\|cares\|address_sorting\|ssl\|crypto\|ucs\|ucp\|uct\|ucm\)\.so[.0-9]*' |
               sort -u); do
    echo "called_from_lib:$lib"
  done >> "$root/$dir/tsan.supp"
  export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=0"
  export LSAN_OPTIONS="suppressions=$root/$dir/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1"
  export TSAN_OPTIONS="log_path=$logs/tsan:suppressions=$root/$dir/tsan.supp:second_deadlock_stack=1:halt_on_error=0"
  if [ "$kind" = tsan ]; then
    # UCX's memory hooks (libucm) intercept mmap/madvise, also in glibc's
    # thread exit, and take a lock there that TSan intercepts after it has
    # torn down the thread: the agent dies with SIGSEGV inside TSan. Not
    # needed for host-memory tests.
    export UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none
  fi
  echo "=== $kind: ctest -L '$labels' (full output in $dir/ctest.log)"
  # shellcheck disable=SC2086
  ctest --test-dir "$dir" -L "$labels" -E '_NOT_BUILT$' -j"$test_jobs" --output-on-failure \
    --timeout 900 ${SAN_CTEST_ARGS:-} > "$dir/ctest.log" 2>&1
  local status=$?
  grep -E '^[0-9]+% tests passed|\*\*\*(Failed|Timeout|Exception)|Not Run' "$dir/ctest.log"
  unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS UCX_MEM_EVENTS UCX_MEM_MALLOC_HOOKS \
    UCX_MEM_MMAP_HOOK_MODE
  summarize "$dir" "$kind" "$status"
}

overall=0
for k in "${kinds[@]}"; do
  run_kind "$k" || overall=1
done
exit $overall
