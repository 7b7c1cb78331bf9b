#!/usr/bin/env bash
# Start or continue the claims100 runs (docs/results/claims100/protocol.md): scripts/protocol_run.sh
# on this protocol (a worktree pinned at its commit, ../claims100-code; checkpoints in
# ../claims100-runs; records published into runs/ here and committed as they come). Safe to run
# again after any interruption.
#
#     bash docs/results/claims100/run.sh            # in the foreground
#     setsid nohup bash docs/results/claims100/run.sh > /tmp/claims100.log 2>&1 &
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export COMMIT=${COMMIT-1}  # commit runs/ as records are published (COMMIT= to leave it to you)
exec bash "$here/../../../scripts/protocol_run.sh" "$here/protocol.yaml" "$@"
