#!/usr/bin/env bash
# Installs a built kolo tree into a temp prefix, checks the layout, then
# builds and runs an external program against it twice: through
# find_package(kolo) (consumer/CMakeLists.txt) and through pkg-config.
# Inputs (set by tests/packaging/CMakeLists.txt): KOLO_PKG_BUILD_DIR,
# KOLO_PKG_CONSUMER_DIR, KOLO_PKG_CMAKE, KOLO_PKG_GENERATOR, KOLO_PKG_CXX,
# KOLO_PKG_LIBDIR, KOLO_PKG_VERSION, KOLO_PKG_PROGRAMS.
set -euo pipefail

build=${KOLO_PKG_BUILD_DIR:?}
consumer=${KOLO_PKG_CONSUMER_DIR:?}
cmake=${KOLO_PKG_CMAKE:-cmake}
generator=${KOLO_PKG_GENERATOR:-}
cxx=${KOLO_PKG_CXX:-c++}
libdir=${KOLO_PKG_LIBDIR:-lib}
version=${KOLO_PKG_VERSION:?}
programs=${KOLO_PKG_PROGRAMS:-}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kolo-pkg-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "packaging test: FAILED: $*" >&2; exit 1; }
step() { echo "== $*"; }

step "cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; fail "cmake --install (is the whole tree built?)"; }

step "installed layout"
for p in $programs; do
  [ -x "$prefix/bin/$p" ] || fail "bin/$p is not installed"
done
[ -f "$prefix/include/kolo/kolo_c.h" ] || fail "include/kolo/kolo_c.h missing"
[ -f "$prefix/include/kolo/kolo.hpp" ] || fail "include/kolo/kolo.hpp missing"
lib=$prefix/$libdir
[ -L "$lib/libkolo.so" ] || fail "$libdir/libkolo.so (development link) missing"
[ -L "$lib/libkolo.so.1" ] || fail "$libdir/libkolo.so.1 (SONAME link) missing"
real=$(readlink -f "$lib/libkolo.so")
[ -f "$real" ] && [ "$(dirname "$real")" = "$(readlink -f "$lib")" ] ||
  fail "libkolo.so does not resolve to a file in $libdir"
case "$(basename "$real")" in libkolo.so.1.*) ;; *) fail "unexpected library file $real" ;; esac
[ "$(readlink -f "$lib/libkolo.so.1")" = "$real" ] || fail "libkolo.so.1 and libkolo.so differ"
if command -v objdump >/dev/null; then
  # Not `objdump | grep -q`: under pipefail, grep -q leaving at the first
  # match can SIGPIPE objdump and fail the check at random.
  headers=$(objdump -p "$real")
  grep -q 'SONAME *libkolo\.so\.1$' <<<"$headers" || fail "SONAME of $real is not libkolo.so.1"
fi
for f in "$libdir/cmake/kolo/koloConfig.cmake" "$libdir/cmake/kolo/koloConfigVersion.cmake" \
         "$libdir/cmake/kolo/koloTargets.cmake" "$libdir/pkgconfig/kolo.pc" \
         lib/systemd/system/kolo-agent.service lib/systemd/system/kolo-coordinator.service \
         lib/sysusers.d/kolo.conf share/kolo/agent.conf.example \
         share/kolo/coordinator.conf.example share/doc/kolo/operations.md \
         share/doc/kolo/packaging.md share/doc/kolo/metrics.md; do
  [ -f "$prefix/$f" ] || fail "$f is not installed"
done
grep -qx "prefix=$prefix" "$lib/pkgconfig/kolo.pc" ||
  { cat "$lib/pkgconfig/kolo.pc" >&2; fail "kolo.pc does not name the install prefix"; }
# Installed programs find libkolo (and everything else) without help.
for p in $programs; do
  out=$(env -u LD_LIBRARY_PATH ldd "$prefix/bin/$p" 2>&1) || fail "ldd bin/$p: $out"
  if grep -q "not found" <<<"$out"; then echo "$out" >&2; fail "bin/$p has unresolved libraries"; fi
  used=$(awk '$1 == "libkolo.so.1" && $2 == "=>" {print $3}' <<<"$out")
  if [ -n "$used" ] && [ "$(readlink -f "$used")" != "$real" ]; then
    echo "$out" >&2; fail "bin/$p loads $used, not the installed libkolo.so.1"
  fi
done

# Runs a consumer binary: with no KOLO_* at all (kolo_init: invalid
# argument), and as if under kolorun but with no agent listening
# (kolo_init: unavailable).
run_consumer() {
  local bin=$1
  env -i PATH="$PATH" "$bin" || fail "$bin (no KOLO_* variables)"
  env -i PATH="$PATH" KOLO_AGENT_SOCKET="$tmp/no-agent.sock" KOLO_JOB_ID=pkgtest KOLO_SIZE=1 \
      KOLO_LOCAL_RANK=0 KOLO_LOCAL_SIZE=1 KOLO_START_TIMEOUT=2 "$bin" >"$tmp/run.out" 2>&1 ||
    { cat "$tmp/run.out" >&2; fail "$bin (no agent)"; }
  cat "$tmp/run.out"
  grep -q "KOLO_ERR_UNAVAILABLE" "$tmp/run.out" || fail "$bin: kolo_init did not report UNAVAILABLE"
}

step "consumer built with find_package(kolo)"
gen_args=()
[ -n "$generator" ] && gen_args=(-G "$generator")
"$cmake" -S "$consumer" -B "$tmp/consumer-cmake" "${gen_args[@]}" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
  >"$tmp/consumer-configure.log" 2>&1 ||
  { cat "$tmp/consumer-configure.log" >&2; fail "configuring the consumer"; }
grep -q "kolo $version from $prefix/$libdir/cmake/kolo" "$tmp/consumer-configure.log" ||
  { cat "$tmp/consumer-configure.log" >&2; fail "find_package(kolo) did not use the installed copy"; }
"$cmake" --build "$tmp/consumer-cmake" >"$tmp/consumer-build.log" 2>&1 ||
  { cat "$tmp/consumer-build.log" >&2; fail "building the consumer"; }
run_consumer "$tmp/consumer-cmake/kolo_consumer"

step "consumer built with pkg-config"
command -v pkg-config >/dev/null || fail "pkg-config is not installed"
export PKG_CONFIG_LIBDIR="$lib/pkgconfig"   # ours only
unset PKG_CONFIG_PATH
[ "$(pkg-config --modversion kolo)" = "$version" ] || fail "pkg-config --modversion kolo"
flags=$(pkg-config --cflags --libs kolo)
echo "pkg-config --cflags --libs kolo: $flags"
# shellcheck disable=SC2086
"$cxx" -std=c++17 "$consumer/main.cc" -o "$tmp/consumer-pc" $flags \
  -Wl,-rpath,"$(pkg-config --variable=libdir kolo)" || fail "g++ \$(pkg-config --cflags --libs kolo)"
run_consumer "$tmp/consumer-pc"

echo "packaging test: OK"
