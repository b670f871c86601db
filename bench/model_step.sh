#!/usr/bin/env bash
# model_step.sh: the model-step figures. kolo-bench --model-step for each model
# (bench/models/*.txt) at each rank count, on one agent and across agents,
# with the agents' default Tensor Fusion and (across agents) with fusion
# disabled (KOLO_FUSION_THRESHOLD_MB=0 in the agents' environment); prints
# every run's table and a summary with the target:
#   step time within 1.25x of one flat allreduce of the same total size.
#
#   bench/model_step.sh --build-dir build-bench
#   bench/model_step.sh --build-dir build-bench --models resnet50 --np "2 4 8" --agents "1 2 4"
#
# Exit status: 0 when every run succeeded and verified (a missed target is
# reported, not a failure), 1 if a run failed, 2 for bad usage.
set -u -o pipefail
export LC_ALL=C

usage() {
  cat <<'EOF'
Usage: model_step.sh [options]
  --build-dir DIR       build tree with bin/kolo-bench, bin/kolo-agent, bin/kolo-coordinator
                        (default: this script's directory's parent if it is a build's bin/, else ./build)
  --models "A B"        model names in --models-dir (default "resnet50"; "resnet50 bert_large"
                        for both: BERT-large adds ~5 min on an idle 2-core machine, more under load)
  --models-dir DIR      where NAME.txt lives (default: models/ next to this script)
  --np "N1 N2"          rank counts (default "2 4")
  --agents "K1 K2"      agent counts (default "1 2"); pairs with N % K != 0 are skipped
  --fusion-off-everywhere  also run fusion off on one agent (default: only across agents,
                        since one agent does not fuse)
  -w, --warmup N        warm-up steps (default 1)
  -n, --iters N         timed steps (default 10, cut by -T)
  -T, --max-time S      cut the timed steps to ~S seconds (default 1; at least 3 run)
  -c, --check 0|1       verify one step and one flat allreduce (default 1)
  --zero-copy           gradients in kolo_alloc_shared memory
  --timeout S           per-run limit in seconds (default 600)
  --out DIR             keep logs and JSON (default: a temporary directory, removed)
Cross-agent runs use UCX_TLS=tcp UCX_NET_DEVICES=lo unless UCX_TLS / UCX_NET_DEVICES are set.
EOF
}

script_dir=$(cd "$(dirname "$0")" && pwd)
if [ -x "$script_dir/kolo-bench" ]; then build_dir=$(dirname "$script_dir"); else build_dir=./build; fi
models="resnet50"
models_dir=$script_dir/models  # bench/models, or <build>/bin/models (copied there by CMake)
nps="2 4" agent_counts="1 2" fusion_off_everywhere=0
warmup=1 iters=10 maxtime=1 check=1 zero_copy=0 run_timeout=600 out_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --models-dir) models_dir=$2; shift 2 ;;
    --np) nps=$2; shift 2 ;;
    --agents) agent_counts=$2; shift 2 ;;
    --fusion-off-everywhere) fusion_off_everywhere=1; shift ;;
    -w|--warmup) warmup=$2; shift 2 ;;
    -n|--iters) iters=$2; shift 2 ;;
    -T|--max-time) maxtime=$2; shift 2 ;;
    -c|--check) check=$2; shift 2 ;;
    --zero-copy) zero_copy=1; shift ;;
    --timeout) run_timeout=$2; shift 2 ;;
    --out) out_dir=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "model_step.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bad() { echo "model_step.sh: $*" >&2; exit 2; }
for v in $nps $agent_counts; do
  case "$v" in ''|*[!0-9]*|0) bad "--np and --agents take positive numbers" ;; esac
done
bin=$build_dir/bin
for p in kolo-bench kolo-agent kolo-coordinator; do
  [ -x "$bin/$p" ] || bad "$bin/$p not found (build it, or pass --build-dir)"
done
for m in $models; do
  [ -f "$models_dir/$m.txt" ] || bad "no model file $models_dir/$m.txt (bench/models/gen_models.py writes them)"
done

tmp_out=""
trap '[ -z "$tmp_out" ] || rm -rf "$tmp_out"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [ -n "$out_dir" ]; then
  mkdir -p "$out_dir" || exit 2
else
  out_dir=$(mktemp -d "${TMPDIR:-/tmp}/kolo-model-step.XXXXXX") || exit 2
  tmp_out=$out_dir
fi

ucx_tls=${UCX_TLS:-tcp} ucx_dev=${UCX_NET_DEVICES:-lo}
echo "# model_step.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores," \
  "$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)," \
  "$(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# cross-agent transport: UCX_TLS=$ucx_tls UCX_NET_DEVICES=$ucx_dev"

status=0
summary=()
bargs=(-w "$warmup" -n "$iters" -T "$maxtime" -c "$check")
[ "$zero_copy" = 1 ] && bargs+=(--zero-copy)
for m in $models; do
  for k in $agent_counts; do
    for n in $nps; do
      if [ "$n" -lt "$k" ] || [ $((n % k)) -ne 0 ]; then continue; fi
      fusions=(default)
      if [ "$k" -gt 1 ] || [ "$fusion_off_everywhere" = 1 ]; then fusions+=(off); fi
      for f in "${fusions[@]}"; do
        tag=$m-n$n-k$k-fusion-$f
        env_arg=()
        [ "$f" = off ] && env_arg=(--agent-env KOLO_FUSION_THRESHOLD_MB=0)
        cmd=("$script_dir/multi_agent_run.sh" --build-dir "$build_dir" --agents "$k"
             --ranks-per-agent $((n / k)) --timeout "$run_timeout" "${env_arg[@]}"
             -- "$bin/kolo-bench" --model-step "$models_dir/$m.txt" "${bargs[@]}" --json "$out_dir/$tag.json")
        echo
        echo "## $m, N=$n on K=$k agent(s), fusion $f: UCX_TLS=$ucx_tls UCX_NET_DEVICES=$ucx_dev ${cmd[*]}"
        UCX_TLS=$ucx_tls UCX_NET_DEVICES=$ucx_dev timeout -k 30 $((run_timeout + 30)) "${cmd[@]}" \
          >"$out_dir/$tag.log" 2>&1
        rc=$?
        sed -n 's/^\[0\]<stdout>://p' "$out_dir/$tag.log" >"$out_dir/$tag.table"
        cat "$out_dir/$tag.table"
        if [ "$rc" -ne 0 ]; then
          echo "## kolo-bench --model-step FAILED (exit $rc); last lines of its output:"
          tail -n 30 "$out_dir/$tag.log"
          status=1
          summary+=("$(printf '%12s %3s %3s %8s  FAILED (exit %s)' "$m" "$n" "$k" "$f" "$rc")")
          continue
        fi
        # model tensors params size fusion step algbw busbw flat flat-busbw ratio wrong
        line=$(awk -v m="$m" '$1 == m && NF == 12 {
                 printf "%12s %3s %3s %8s %13.1f %11.2f %13.1f %11.2f %10.2f  %s",
                        $1, N, K, F, $6, $8, $9, $10, $11, ($11 <= 1.25 ? "met" : "MISSED") }' \
                 N="$n" K="$k" F="$f" "$out_dir/$tag.table")
        summary+=("${line:-$(printf '%12s %3s %3s %8s  no row' "$m" "$n" "$k" "$f")}")
      done
    done
  done
done

echo
echo "## Summary: step = all tensors, reverse order, async then synchronize all;" \
  "flat = one allreduce of the same bytes; target step/flat <= 1.25"
printf '#%11s %3s %3s %8s %13s %11s %13s %11s %10s  %s\n' model N K fusion "step(us)" "step busbw" \
  "flat(us)" "flat busbw" step/flat target
for s in "${summary[@]}"; do echo "$s"; done
[ "$status" = 0 ] || echo "## model_step.sh: at least one run FAILED" >&2
exit "$status"
