#!/usr/bin/env bash
# Start or continue the pre-registered experiments this CPU runs, in this order, one run at a time
# from the one worktree pinned at their shared commit (../claims100-code): claims100's runs, then
# KL-Cov's five (claims100_klcov: the published entropy method the decisive test reads TEPO
# against), the 100-step DAPO runs in float32 and bf16 (precision/dapo100: issue #52's
# long-horizon check of the precision claims100 uses), then GSPO's five (claims100_gspo) and MPO's
# ten (claims100_mpo). Runs an earlier protocol published are not trained again (--only). Records
# are committed as they come. Safe to run again after any interruption.
#
# Order changed 2026-11-29 (session 11): dapo100 went from second to after KL-Cov, so that the
# decisive test and its anchor finish first; no run's settings changed (claims100/log.md).
#
#     setsid nohup bash docs/results/claims100/queue.sh > /tmp/claims100.log 2>&1 &
set -euo pipefail
results=$(cd "$(dirname "$0")/.." && pwd)
main=$(cd "$results/../.." && pwd)
export COMMIT=${COMMIT-1} WORKTREE=${WORKTREE:-$main/../claims100-code}
for entry in claims100: claims100_klcov:^kl_cov_ precision/dapo100: claims100_gspo:^gspo_ \
    claims100_mpo:; do
    name=${entry%%:*} only=${entry#*:}
    echo "== queue: $name $(date -u +%FT%TZ)"
    bash "$main/scripts/protocol_run.sh" "$results/$name/protocol.yaml" ${only:+--only "$only"} "$@"
done
