#!/usr/bin/env bash
# Start or continue claims100 and then its KL-Cov arm (protocol.md here): claims100's own runner
# first (it returns once all ten of its runs are published), then this protocol's kl_cov runs from
# the same pinned worktree (../claims100-code); its GRPO and TEPO runs are claims100's. Records
# are committed as they come. Safe to run again after any interruption.
#
#     setsid nohup bash docs/results/claims100_klcov/run.sh > /tmp/claims100.log 2>&1 &
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
main=$(cd "$here/../../.." && pwd)
bash "$here/../claims100/run.sh"
export COMMIT=${COMMIT-1} WORKTREE=${WORKTREE:-$main/../claims100-code}
exec bash "$main/scripts/protocol_run.sh" "$here/protocol.yaml" --only '^kl_cov_' "$@"
