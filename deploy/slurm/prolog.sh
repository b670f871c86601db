#!/bin/sh
# kolo's Slurm prolog (slurm.conf: Prolog=/etc/kolo/slurm/prolog.sh). Runs as
# root on every node of a job before its first step (slurmd sets
# SLURM_JOB_ID and SLURM_JOB_UID). It writes the job's kolo token to
# $KOLO_JOB_TOKEN_DIR/<job id>.token (default /run/kolo/jobs), readable by
# the job's user only, so that ranks started by srun (docs/slurm.md, direct
# launch) share a secret no other user can read. Every node derives the same
# token from the site key (/etc/kolo/slurm-job.key: the same random bytes on
# every node, mode 0400 root, distributed like munge.key) and the job id, so
# the nodes need not talk to each other.
set -eu
dir=${KOLO_JOB_TOKEN_DIR:-/run/kolo/jobs}
key=${KOLO_SLURM_JOB_KEY:-/etc/kolo/slurm-job.key}
[ -n "${SLURM_JOB_ID:-}" ] || { echo "kolo prolog: SLURM_JOB_ID is not set" >&2; exit 1; }
[ -r "$key" ] || { echo "kolo prolog: cannot read the site key $key" >&2; exit 1; }
mkdir -p "$dir"
chmod 0755 "$dir"
tmp="$dir/.$SLURM_JOB_ID.token.$$"
umask 077
# sha256(key || job id): the key has a fixed length, and no job id can be
# built from another's by length extension (ids are digits, the padding is not).
{ cat "$key"; printf '%s' "$SLURM_JOB_ID"; } | sha256sum | cut -c1-32 > "$tmp"
chown "${SLURM_JOB_UID:-0}" "$tmp"
chmod 0400 "$tmp"
mv -f "$tmp" "$dir/$SLURM_JOB_ID.token"
