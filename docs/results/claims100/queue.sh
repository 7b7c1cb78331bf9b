#!/usr/bin/env bash
# Start or continue the pre-registered experiments this CPU runs, in this order, one run at a time
# from the one worktree pinned at their shared commit (../claims100-code): claims100's run in
# progress, the 100-step DAPO run in bf16 (precision/dapo100: issue #52's long-horizon check of
# the precision claims100 uses), claims100's other runs, then its follow-up arms: KL-Cov's five
# (claims100_klcov), GSPO's five (claims100_gspo) and MPO's ten (claims100_mpo). Runs an earlier
# protocol published are not trained again (--only). Records are committed as they come. Safe to
# run again after any interruption.
#
#     setsid nohup bash docs/results/claims100/queue.sh > /tmp/claims100.log 2>&1 &
set -euo pipefail
results=$(cd "$(dirname "$0")/.." && pwd)
main=$(cd "$results/../.." && pwd)
export COMMIT=${COMMIT-1} WORKTREE=${WORKTREE:-$main/../claims100-code}
# claims100's grpo_seed11 was in progress when this queue was set up: it finishes first.
for entry in 'claims100:^grpo_seed11$' precision/dapo100: claims100: claims100_klcov:^kl_cov_ \
    claims100_gspo:^gspo_ claims100_mpo:; do
    name=${entry%%:*} only=${entry#*:}
    echo "== queue: $name $(date -u +%FT%TZ)"
    bash "$main/scripts/protocol_run.sh" "$results/$name/protocol.yaml" ${only:+--only "$only"} "$@"
done
