#!/usr/bin/env bash
# plot_saved.sh: the plots of docs/benchmarks.md that come from saved tables
# (docs/data/), not from a run: across agents (compare_multi.sh's tables)
# and the shaped-link cluster (bench/cluster/cluster.py's). headline.sh
# makes the one-node plot from its own run.
#   bench/plot_saved.sh [REPO_ROOT]
set -eu
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
. "$root/scripts/python-env.sh"  # KOLO_PYTHON: kolo's venv (it has matplotlib)
plot=("$KOLO_PYTHON" "$root/bench/plot_busbw.py")
a=$root/docs/data/across-agents
if [ -d "$a" ]; then
  s=()
  for k in 2 4; do
    # Every run kept (-a, -b, ...): each size takes its best run.
    runs() { ls "$a"/"$1"-*.table | paste -sd, -; }
    s+=(-s "K=$k agents x 1 rank|kolo, user memory=$(runs kolo-k$k-r1)"
        -s "K=$k agents x 1 rank|kolo, kolo_alloc_shared=$(runs kolo-zc-k$k-r1)"
        -s "K=$k agents x 1 rank|Gloo ring (tcp), in place=$(runs gloo-$k)"
        -s "K=$k agents x 1 rank|Open MPI (tcp), in place=$(runs mpi-$k)")
  done
  "${plot[@]}" "${s[@]}" --out "$root/docs/img/across_agents_busbw.png" --markdown "$a/headline.md" \
    --title "Across agents over TCP on loopback, allreduce float32 in place ($(cat "$a/DATE"))"
fi
c=$root/docs/data/cluster-2026-11-26
if [ -d "$c" ]; then
  s=()
  for k in 2 4 8; do
    s+=(-s "K=$k nodes|kolo, user memory=$(ls "$c"/kolo-user-k$k*.table | paste -sd, -)"
        -s "K=$k nodes|kolo, kolo_alloc_shared=$c/kolo-shared-k$k.table"
        -s "K=$k nodes|Gloo ring=$(ls "$c"/gloo-k$k*.table | paste -sd, -)"
        -s "K=$k nodes|Open MPI=$c/mpi-k$k.table")
  done
  "${plot[@]}" "${s[@]}" --rate-gbit 1 --linear --out "$root/docs/img/cluster_busbw.png" \
    --title "Cluster of K nodes on 1 Gbit/s shaped links, allreduce float32 out of place (2026-11-26, load 3-19)"
fi
