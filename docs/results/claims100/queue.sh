#!/usr/bin/env bash
# Start or continue the pre-registered experiments this CPU runs, in this order, one run at a time
# from the one worktree pinned at their shared commit (../claims100-code): claims100's runs, then
# the 100-step DAPO runs in float32 and bf16 (precision/dapo100: issue #52's long-horizon check of
# the precision claims100 uses), KL-Cov's five (claims100_klcov: the published entropy method the
# decisive test reads TEPO against), then GSPO's five (claims100_gspo), MPO's ten
# (claims100_mpo) and GRPO without its KL term (claims100_beta0, added 2026-12-02). Runs an
# earlier protocol published are not trained again (--only). Records are committed as they come.
# Safe to run again after any interruption.
#
# Order changed 2026-11-29 (session 11): dapo100 went from second to after KL-Cov, so that the
# decisive test and its anchor finish first; no run's settings changed (claims100/log.md).
# Order changed again 2026-11-30 (session 20), with claims100 finished and kl_cov_seed10 running:
# dapo100 before KL-Cov's remaining runs. claims100's entropy gate failed (GRPO's entropy did not
# fall), and both of KL-Cov's primaries are gated on it, so they read "untestable" whatever its
# runs show; dapo100 is what issue #52 still waits for. A KL-Cov run stopped with a checkpoint
# resumes when the queue reaches it; no run's settings changed (claims100/log.md).
# claims100_mpo left the queue 2026-12-03 (session 37) with its seeds 10-12 in both arms: a K = 5
# run of seed 13 needs longer than a session, and the machine is replaced between sessions
# (claims100_mpo/protocol.md, deviation 2).
#
#     setsid nohup bash docs/results/claims100/queue.sh > /tmp/claims100.log 2>&1 &
set -euo pipefail
results=$(cd "$(dirname "$0")/.." && pwd)
main=$(cd "$results/../.." && pwd)
export COMMIT=${COMMIT-1} WORKTREE=${WORKTREE:-$main/../claims100-code}
for entry in claims100: precision/dapo100: claims100_klcov:^kl_cov_ claims100_gspo:^gspo_ \
    claims100_beta0:^grpo_beta0_; do
    name=${entry%%:*} only=${entry#*:}
    echo "== queue: $name $(date -u +%FT%TZ)"
    bash "$main/scripts/protocol_run.sh" "$results/$name/protocol.yaml" ${only:+--only "$only"} "$@"
done
