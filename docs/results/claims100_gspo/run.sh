#!/usr/bin/env bash
# Start or continue claims100, its KL-Cov arm and then its GSPO arm (protocol.md here), one run
# at a time from the same pinned worktree (../claims100-code); GSPO's GRPO runs are claims100's.
# Records are committed as they come. Safe to run again after any interruption.
#
#     setsid nohup bash docs/results/claims100_gspo/run.sh > /tmp/claims100.log 2>&1 &
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
main=$(cd "$here/../../.." && pwd)
bash "$here/../claims100_klcov/run.sh"
export COMMIT=${COMMIT-1} WORKTREE=${WORKTREE:-$main/../claims100-code}
exec bash "$main/scripts/protocol_run.sh" "$here/protocol.yaml" --only '^gspo_' "$@"
