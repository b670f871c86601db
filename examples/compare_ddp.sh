#!/usr/bin/env bash
# Runs the synthetic training benchmark with kolo (under kolorun) and with
# torch DistributedDataParallel over gloo, for each rank count, in the same
# invocation on the same machine, and prints a side-by-side table.
#
#   examples/compare_ddp.sh [--build-dir DIR] [--np "2 4"] [--python PY]
#                           [--zero-copy] [-- extra benchmark options]
#
# --python defaults to $KOLO_PYTHON (scripts/python-env.sh: kolo's venv).
#
# Benchmark options default to a short CPU run (resnet18, batch 16, 64x64
# images, 2 warm-up batches, 3 iterations of 3 batches); anything after --
# is passed to both benchmarks (e.g. -- --model resnet50 --image-size 224).
# Exit status: non-zero if any run fails.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/.." && pwd)"
build_dir="${repo}/build"
np_list="2 4"
# kolo's Python environment ($KOLO_PYTHON, scripts/python-env.sh)
. "${repo}/scripts/python-env.sh"
python=$KOLO_PYTHON
kolo_extra=()
bench_args=(--model resnet18 --batch-size 16 --image-size 64 --num-warmup-batches 2
            --num-batches-per-iter 3 --num-iters 3)

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --np) np_list="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --zero-copy) kolo_extra+=(--zero-copy); shift ;;
    --) shift; bench_args+=("$@"); break ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "compare_ddp.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

build_dir="$(cd "${build_dir}" && pwd)"
kolorun="${build_dir}/bin/kolorun"
libkolo="${build_dir}/lib/libkolo.so"
for f in "${kolorun}" "${libkolo}"; do
  [[ -e "$f" ]] || { echo "compare_ddp.sh: missing $f (build kolo_client kolorun kolo-agent kolo-coordinator)" >&2; exit 1; }
done
export PYTHONPATH="${repo}/client_lib/python${PYTHONPATH:+:${PYTHONPATH}}"
export KOLO_LIBRARY="${libkolo}"
logdir="$(mktemp -d "${TMPDIR:-/tmp}/kolo-compare-ddp.XXXXXX")"
trap 'rm -rf "${logdir}"' EXIT

result_field() {  # result_field FILE KEY
  grep -o "RESULT .*" "$1" | tail -n 1 | tr ' ' '\n' | sed -n "s/^$2=//p"
}

echo "# kolo vs DDP(gloo): $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "# benchmark options: ${bench_args[*]} ${kolo_extra[*]}"
rows=()
for np in ${np_list}; do
  echo "## np=${np}: kolo"
  if ! timeout 900 "${kolorun}" -np "${np}" -- "${python}" "${here}/pytorch_synthetic_benchmark.py" \
        "${bench_args[@]}" "${kolo_extra[@]}" 2>&1 | tee "${logdir}/kolo-${np}.log"; then
    echo "compare_ddp.sh: the kolo run with np=${np} failed" >&2; exit 1
  fi
  echo "## np=${np}: DDP over gloo"
  if ! timeout 900 "${python}" "${here}/ddp_synthetic_benchmark.py" --np "${np}" "${bench_args[@]}" \
        2>&1 | tee "${logdir}/ddp-${np}.log"; then
    echo "compare_ddp.sh: the DDP run with np=${np} failed" >&2; exit 1
  fi
  k="$(result_field "${logdir}/kolo-${np}.log" img_sec_total)"
  d="$(result_field "${logdir}/ddp-${np}.log" img_sec_total)"
  [[ -n "$k" && -n "$d" ]] || { echo "compare_ddp.sh: no RESULT line for np=${np}" >&2; exit 1; }
  rows+=("${np} ${k} ${d}")
done

echo
echo "# total img/sec (sum over ranks of each rank's mean)"
printf "%4s %14s %14s %12s\n" np kolo ddp-gloo kolo/ddp
for r in "${rows[@]}"; do
  set -- $r
  printf "%4s %14.1f %14.1f %12.2f\n" "$1" "$2" "$3" "$(awk -v a="$2" -v b="$3" 'BEGIN{print (b>0)?a/b:0}')"
done
