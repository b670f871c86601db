#!/usr/bin/env bash
# Checks that every C, C++ and CUDA line changed since the base commit
# recorded in .ci/format-base (committed or not: the work tree against the
# base) is formatted as .clang-format says, with `git clang-format --diff`.
# Lines older than the base, and files only moved since, are left as they
# are. Fails listing the hunks
# clang-format would change; fix them with `git clang-format <base>`.
# Run by ctest (test FormatChangedLines), so CI's test command runs it; it
# needs the checkout's history back to the base (CI clones main whole).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  echo "check-format: $*" >&2
  exit 1
}

base=$(grep -v '^[[:space:]]*\(#\|$\)' .ci/format-base | head -n1 | tr -d '[:space:]')
[ -n "$base" ] || fail ".ci/format-base names no commit"
git rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
  fail "$(pwd) is not a git checkout: the check compares the work tree with the base commit $base"
git cat-file -e "${base}^{commit}" 2>/dev/null ||
  fail "the base commit $base (.ci/format-base) is not in this checkout's history (a shallow clone?): fetch the history back to it (git fetch --unshallow) and run again"
git merge-base --is-ancestor "$base" HEAD ||
  fail "the base commit $base (.ci/format-base) is not an ancestor of HEAD ($(git rev-parse --short HEAD))"

clang_format=$(command -v clang-format || command -v clang-format-14 || true)
git_clang_format=$(command -v git-clang-format || command -v git-clang-format-14 || true)
[ -n "$clang_format" ] && [ -n "$git_clang_format" ] ||
  fail "clang-format and git-clang-format are needed (apt-get install clang-format; scripts/install-deps.sh installs it)"

# The files changed since the base, less deleted ones and pure moves (a file
# renamed unchanged has no changed line, though git clang-format would see
# every line of it as new).
mapfile -t files < <(git diff --name-status -M "$base" -- |
  awk -F'\t' '$1 != "R100" && $1 !~ /^D/ { print $NF }')
if [ "${#files[@]}" -eq 0 ]; then
  echo "check-format: no file changed since $(git rev-parse --short "$base")"
  exit 0
fi
out=$("$git_clang_format" --binary "$clang_format" --extensions c,cc,cpp,cxx,h,hh,hpp,cu,cuh \
  --diff "$base" -- "${files[@]}" 2>&1) || fail "git clang-format failed: $out"
case "$out" in
  "no modified files to format" | "clang-format did not modify any files")
    echo "check-format: the C/C++/CUDA lines changed since $(git rev-parse --short "$base") are formatted"
    exit 0
    ;;
esac
echo "$out"
echo >&2
fail "the hunks above are not formatted as .clang-format says (lines changed since $(git rev-parse --short "$base")); run: git clang-format $base"
