#!/usr/bin/env bash
# Builds kolo's libFuzzer targets (fuzz/) with clang into build-fuzz, the
# whole tree instrumented with -fsanitize=fuzzer-no-link,address,undefined,
# and runs each target for FUZZ_SECONDS (default 30) starting from its seed
# corpus in fuzz/corpus/<target>/. Crashing inputs are kept under
# build-fuzz/fuzz/artifacts/<target>/ and the script exits non-zero.
#
#   scripts/fuzz.sh                     # all targets
#   FUZZ_SECONDS=600 scripts/fuzz.sh kolo_fuzz_coordinator
#   scripts/fuzz.sh --build-only
#   scripts/fuzz.sh --available         # exit 0 iff clang can link libFuzzer (installs nothing)
#
# Environment: FUZZ_SECONDS, FUZZ_BUILD_DIR (build-fuzz), FUZZ_JOBS (2),
# CCACHE_DIR (used when ccache is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
build=${FUZZ_BUILD_DIR:-build-fuzz}
jobs=${FUZZ_JOBS:-2}
all_targets=(kolo_fuzz_frame_decoder kolo_fuzz_client_desc kolo_fuzz_cross_requests
             kolo_fuzz_coordinator kolo_fuzz_shm)
build_only=0
available_only=0
targets=()
for a in "$@"; do
  case "$a" in
    --build-only) build_only=1 ;;
    --available) available_only=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) targets+=("$a") ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")

cxx=$(command -v clang++-14 || command -v clang++ || true)
cc=$(command -v clang-14 || command -v clang || true)
if [ -z "$cxx" ] || [ -z "$cc" ]; then
  echo "fuzz.sh: clang is needed (apt-get install clang-14)" >&2
  exit 1
fi

# libFuzzer's runtime is in libclang-rt-14-dev, which only fuzzing needs (so
# it is installed here, not by scripts/install-deps.sh).
probe_dir=$(mktemp -d)
trap 'rm -rf "$probe_dir"' EXIT
probe() {
  echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
    > "$probe_dir/p.cc"
  "$cxx" -fsanitize=fuzzer,address,undefined "$probe_dir/p.cc" -o "$probe_dir/p" >/dev/null 2>&1
}
if [ "$available_only" = 1 ]; then
  if probe; then echo "fuzz.sh: $cxx links libFuzzer"; exit 0; fi
  echo "fuzz.sh: $cxx cannot link -fsanitize=fuzzer (libclang-rt-14-dev missing?)" >&2
  exit 1
fi
if ! probe; then
  pkg=libclang-rt-14-dev
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "fuzz.sh: install $pkg (as root)" >&2; exit 1; }
    sudo=sudo
  fi
  echo "fuzz.sh: installing $pkg (libFuzzer runtime)"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg"
  probe || { echo "fuzz.sh: $cxx still cannot link -fsanitize=fuzzer" >&2; exit 1; }
fi

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -gline-tables-only"
if [ ! -f "$build/build.ninja" ]; then
  CC="$cc" CXX="$cxx" cmake -S . -B "$build" -G Ninja "${launcher[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKOLO_BUILD_FUZZERS=ON -DKOLO_BUILD_BENCH=OFF \
    -DKOLO_WITH_CUDA=OFF -DKOLO_WITH_NCCL=OFF \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags"
fi
nice ninja -C "$build" -j"$jobs" "${targets[@]}"
[ "$build_only" = 1 ] && exit 0

failed=()
for t in "${targets[@]}"; do
  runs_var="FUZZ_RUNS_${t#kolo_fuzz_}"
  runs=${!runs_var:-${FUZZ_RUNS:-}}
  echo "=== $t: ${FUZZ_SECONDS} s${runs:+ at most, $runs inputs from seed ${FUZZ_SEED:-1}}"
  if ! FUZZ_RUNS="$runs" "$root/fuzz/run_fuzzer.sh" "$build/bin/$t" "$root/fuzz/corpus/$t" "$FUZZ_SECONDS" \
       "$root/$build/fuzz/artifacts/$t" 2>&1 | tail -n 40; then
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]} (inputs in $build/fuzz/artifacts/)" >&2
  exit 1
fi
if [ -n "${FUZZ_RUNS:-}${FUZZ_RUNS_frame_decoder:-}${FUZZ_RUNS_client_desc:-}${FUZZ_RUNS_cross_requests:-}${FUZZ_RUNS_coordinator:-}${FUZZ_RUNS_shm:-}" ]; then
  echo "fuzz.sh: every target ran its fixed input count (seed ${FUZZ_SEED:-1}) without a finding"
else
  echo "fuzz.sh: every target ran ${FUZZ_SECONDS} s without a finding"
fi
