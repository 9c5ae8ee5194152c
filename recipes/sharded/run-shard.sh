#!/usr/bin/env bash
# One shard of a sharded specdec campaign, as any scheduler starts it.
#
#   SHARDS=N OUT=DIR run-shard.sh conform --backend reference ...
#   SHARDS=N OUT=DIR run-shard.sh stats --sweep 20000
#
# The shard index comes from the scheduler's own variable: SLURM_ARRAY_TASK_ID (a Slurm
# job array, --array=0-(N-1)), JOB_COMPLETION_INDEX (a Kubernetes Indexed Job), or
# MATRIX_SHARD (a CI matrix value). The shard writes its JSON report to OUT/shard-I;
# `specdec report merge OUT/shard-*` makes the campaign's report once every shard is done.
set -euo pipefail
SPECDEC=${SPECDEC:-specdec}
: "${SHARDS:?set SHARDS to the number of shards}"
: "${OUT:?set OUT to the campaign folder}"
I=${SLURM_ARRAY_TASK_ID:-${JOB_COMPLETION_INDEX:-${MATRIX_SHARD:-}}}
if [ -z "$I" ]; then
    echo "run-shard.sh: no shard index: set SLURM_ARRAY_TASK_ID, JOB_COMPLETION_INDEX or MATRIX_SHARD" >&2
    exit 2
fi
command=$1
shift
case "$command" in
    conform) exec "$SPECDEC" conform --shard "$I/$SHARDS" --report "$OUT/shard-$I" "$@" ;;
    stats) exec "$SPECDEC" stats --shard "$I/$SHARDS" --out "$OUT/shard-$I" "$@" ;;
    *) echo "run-shard.sh: unknown command $command (conform or stats)" >&2; exit 2 ;;
esac
