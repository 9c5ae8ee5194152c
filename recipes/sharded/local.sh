#!/usr/bin/env bash
# The local stand-in for a scheduler: starts N shards as N processes with that scheduler's
# index variable set, waits for all, then merges their reports.
#
#   local.sh slurm|kubernetes|matrix N OUT conform --backend reference ...
#
# Exits non-zero if a shard or the merge does (a failing merged run included).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
SPECDEC=${SPECDEC:-specdec}
scheduler=$1 n=$2 out=$3
shift 3
case "$scheduler" in
    slurm) var=SLURM_ARRAY_TASK_ID ;;
    kubernetes) var=JOB_COMPLETION_INDEX ;;
    matrix) var=MATRIX_SHARD ;;
    *) echo "local.sh: unknown scheduler $scheduler (slurm, kubernetes or matrix)" >&2; exit 2 ;;
esac
mkdir -p "$out"
pids=()
for ((i = 0; i < n; i++)); do
    env "$var=$i" SHARDS="$n" OUT="$out" SPECDEC="$SPECDEC" "$here/run-shard.sh" "$@" > "$out/shard-$i.log" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
"$SPECDEC" report merge "$out"/shard-*/ --out "$out/merged" || status=1
exit $status
