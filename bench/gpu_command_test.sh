#!/usr/bin/env bash
# bench/gpu_command_test.sh BUILD_DIR: the GPU command checked on a machine
# without a GPU (CUDA builds): bench/gpu_bundle.sh makes a complete bundle
# under the device tool's 64 MiB, `bench/gpu_issue16.sh BUNDLE --list` finds
# every input and lists every phase with its budget, and a real run of the
# phases that need no GPU (torch, kolo-status) passes from the bundle alone,
# writes its summary and logs, and leaves no process behind.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=$(cd "$1" && pwd)
work=$(mktemp -d /tmp/kolo-gpucmd.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$HERE/gpu_bundle.sh" "$BUILD" "$work/bundle" > "$work/bundle.log" 2>&1 || { cat "$work/bundle.log"; fail "gpu_bundle.sh"; }
[[ -f "$work/bundle/bundle.tar.xz" && ! -e "$work/bundle/bin" ]] || fail "the bundle is not packed"
mib=$(du -sm "$work/bundle" | cut -f1)
# What travels: the packed bundle and the working tree (tracked files).
tree=$(cd "$HERE/.." && git ls-files -z 2>/dev/null | xargs -0 du -cm 2>/dev/null | tail -1 | cut -f1)
(( mib + ${tree:-0} < 64 )) ||
  fail "the bundle (${mib} MiB) and the working tree (${tree} MiB) are over the device tool's 64 MiB"

list=$("$HERE/gpu_issue16.sh" "$work/bundle" --list) || { echo "$list"; fail "--list"; }
for p in env torch cxx-stream cxx-seam-cuda nccl-procs kolo-status py-ops py-zerocopy torch-dist \
         synth-ceiling-2 synth-kolo-2 synth-ddp-gloo-2 collectives-2 collectives-device-2 \
         nccl-cross-kolo-2 nccl-cross-staged-4 nccl-cross-torch-4 gpu-check; do
  grep -qE "^  $p +[0-9]+- *[0-9]+s" <<< "$list" || { echo "$list"; fail "phase $p not listed"; }
done
grep -q 'inputs present' <<< "$list" || fail "--list did not check the inputs"
need=$(sed -n 's/.*need at least \([0-9]*\)s of the \([0-9]*\)s budget.*/\1 \2/p' <<< "$list")
read -r need budget <<< "$need"
(( need < budget )) || fail "the regression phases need ${need}s of a ${budget}s budget"

# The phases that run without a GPU, from the bundle (its own libraries).
rm -f "$work/bundle/bin/kolo-agent.origin"
out="$work/out"
mkdir -p "$out"
start=$SECONDS
OUT=$out KOLO_GPU16_PHASES=torch,kolo-status "$HERE/gpu_issue16.sh" "$work/bundle" > "$work/run.log" 2>&1 || {
  cat "$work/run.log"; fail "the CPU phases failed"; }
grep -qE '^torch +rc=0 ' "$out/summary.txt" || { cat "$out/summary.txt"; fail "torch phase"; }
grep -qE '^kolo-status +rc=0 ' "$out/summary.txt" || { cat "$out/summary.txt" "$out/kolo-status.log"; fail "kolo-status phase"; }
grep -qE '^py-ops +not selected' "$out/summary.txt" || { cat "$out/summary.txt"; fail "unselected phases"; }
grep -q 'PASSED' "$out/kolo-status.log" || fail "kolo-status ran no test"
left=$(pgrep -f "$work/bundle/bin/" || true)
[[ -z $left ]] || fail "processes left behind: $left"
echo "gpu command: bundle ${mib} MiB, phases listed, CPU phases passed in $((SECONDS - start)) s, nothing left"
