#!/bin/sh
# Prints, one per line, the Debian packages that provide the shared
# libraries needed by the ELF files under STAGE_DIR (a `cmake --install`
# DESTDIR). The container's runtime stage installs exactly these, so it
# never carries -dev packages and never misses a library when a dependency
# changes. Libraries that live in STAGE_DIR itself (libkolo) are skipped.
# Fails, naming the file, if a library cannot be found or has no package.
set -eu
stage=${1:?usage: runtime-deps.sh STAGE_DIR}
stage=$(cd "$stage" && pwd)

# Let ldd resolve the staged libraries too.
libpath=$(find "$stage" -type f -name '*.so*' -exec dirname {} \; | sort -u | tr '\n' ':')

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: > "$tmp/libs"
find "$stage" -type f | sort | while read -r f; do
  # Only ELF files: "\177ELF" magic.
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  out=$(LD_LIBRARY_PATH="$libpath" ldd "$f" 2>/dev/null) || continue   # static: nothing to do
  if printf '%s\n' "$out" | grep -q 'not found'; then
    echo "runtime-deps.sh: $f: missing libraries:" >&2
    printf '%s\n' "$out" | grep 'not found' >&2
    exit 1
  fi
  printf '%s\n' "$out" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' >> "$tmp/libs"
done

sort -u "$tmp/libs" > "$tmp/unique"
: > "$tmp/packages"
while read -r lib; do
  case "$lib" in "$stage"/*) continue ;; esac
  # Debian 12 is merged-/usr: a package may record /lib/... or /usr/lib/...,
  # and ldd may print either; try the path, its /usr twin, then the target.
  pkg=
  for p in "$lib" "/usr$lib" "${lib#/usr}" "$(readlink -f "$lib")"; do
    pkg=$(dpkg-query -S "$p" 2>/dev/null | head -n 1 | cut -d: -f1) && [ -n "$pkg" ] && break
  done
  if [ -z "$pkg" ]; then
    echo "runtime-deps.sh: no Debian package provides $lib" >&2
    exit 1
  fi
  echo "$pkg" >> "$tmp/packages"
done < "$tmp/unique"
sort -u "$tmp/packages"
