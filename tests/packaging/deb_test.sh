#!/usr/bin/env bash
# Builds the .deb with CPack (into a temp dir) and checks its contents and
# control fields with dpkg-deb. Exit 77 (skipped) without dpkg-deb.
# Inputs (set by tests/packaging/CMakeLists.txt): KOLO_PKG_BUILD_DIR,
# KOLO_PKG_CPACK, KOLO_PKG_LIBDIR, KOLO_PKG_VERSION, KOLO_PKG_PROGRAMS.
set -euo pipefail

build=${KOLO_PKG_BUILD_DIR:?}
cpack=${KOLO_PKG_CPACK:-cpack}
libdir=${KOLO_PKG_LIBDIR:-lib}
version=${KOLO_PKG_VERSION:?}
programs=${KOLO_PKG_PROGRAMS:-}

if ! command -v dpkg-deb >/dev/null; then
  echo "packaging deb test: SKIPPED: dpkg-deb is not installed"
  exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kolo-deb-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "packaging deb test: FAILED: $*" >&2; exit 1; }

echo "== cpack -G DEB (config $build/CPackConfig.cmake)"
(cd "$build" && "$cpack" -G DEB -B "$tmp") >"$tmp/cpack.log" 2>&1 ||
  { cat "$tmp/cpack.log" >&2; fail "cpack -G DEB (is the whole tree built?)"; }
shopt -s nullglob
debs=("$tmp"/kolo_*.deb)
[ ${#debs[@]} -eq 1 ] || { ls -la "$tmp" >&2; fail "expected one kolo_*.deb, got ${#debs[@]}"; }
deb=${debs[0]}
echo "package: $(basename "$deb")"

dpkg-deb -c "$deb" >"$tmp/contents"
has() { grep -qE " \./usr/$1( -> .*)?\$" "$tmp/contents" || { cat "$tmp/contents" >&2; fail "the .deb lacks /usr/$1"; }; }
has "bin/kolo-agent"
for p in $programs; do has "bin/$p"; done
has "$libdir/libkolo\.so\.1\.[0-9.]+"
has "$libdir/libkolo\.so\.1"
has "$libdir/libkolo\.so"
has "include/kolo/kolo_c\.h"
has "include/kolo/kolo\.hpp"
has "$libdir/cmake/kolo/koloConfig\.cmake"
has "$libdir/pkgconfig/kolo\.pc"
has "lib/systemd/system/kolo-agent\.service"
has "share/kolo/agent\.conf\.example"
has "share/doc/kolo/operations\.md"

field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = kolo ] || fail "Package: $(field Package)"
[ "$(field Version)" = "$version" ] || fail "Version: $(field Version), expected $version"
[ -n "$(field Maintainer)" ] || fail "no Maintainer"
[ -n "$(field Description)" ] || fail "no Description"
echo "Depends: $(field Depends)"
if command -v dpkg-shlibdeps >/dev/null; then
  [[ "$(field Depends)" == *libc6* ]] || fail "Depends was not computed by dpkg-shlibdeps"
fi
# The pkg-config file in the package names the package's prefix.
# (Captured first: `... | grep -q` under pipefail fails at random when grep
# leaves early and the writer gets SIGPIPE.)
pc=$(dpkg-deb --fsys-tarfile "$deb" | tar -xO "./usr/$libdir/pkgconfig/kolo.pc")
grep -qx "prefix=/usr" <<<"$pc" || fail "kolo.pc in the .deb does not say prefix=/usr"
# Maintainer scripts.
dpkg-deb -e "$deb" "$tmp/control"
for s in postinst prerm postrm shlibs; do
  [ -f "$tmp/control/$s" ] || fail "the .deb has no $s"
done
grep -q "libkolo 1" "$tmp/control/shlibs" || fail "shlibs does not describe libkolo.so.1"
echo "packaging deb test: OK"
