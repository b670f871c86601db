#!/bin/sh
# kolo's Slurm epilog (slurm.conf: Epilog=/etc/kolo/slurm/epilog.sh). Runs as
# root on every node of a job after it ended (scancel included): removes the
# job's token. The agent has already ended the job's kolo jobs when their
# ranks' sockets closed (slurmd kills the job's processes before the epilog).
set -eu
dir=${KOLO_JOB_TOKEN_DIR:-/run/kolo/jobs}
[ -n "${SLURM_JOB_ID:-}" ] || exit 0
rm -f "$dir/$SLURM_JOB_ID.token"
