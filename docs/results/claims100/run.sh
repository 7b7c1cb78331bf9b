#!/usr/bin/env bash
# Start or continue the claims100 runs (docs/results/claims100/protocol.md): from a git worktree
# pinned at the protocol's commit, so main can move while they train; published records land in
# this checkout's docs/results/claims100/runs/ (commit them as each run finishes). Safe to run
# again after any interruption: published runs are skipped, an unfinished one resumes.
#
#     bash docs/results/claims100/run.sh            # in the foreground
#     setsid nohup bash docs/results/claims100/run.sh > /tmp/claims100.log 2>&1 &
#
# WORKTREE (default ../claims100-code) holds the pinned code and its light virtual environment
# (the main checkout's .venv packages, this commit's tepo); RUNS (default ../claims100-runs) holds
# the runs' checkpoints and console logs, never committed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
main=$(cd "$here/../../.." && pwd)
protocol="$here/protocol.yaml"
commit=$(sed -n 's/^commit: *\([0-9a-f]*\).*/\1/p' "$protocol")
worktree=${WORKTREE:-$main/../claims100-code}
runs=${RUNS:-$main/../claims100-runs}
[ -n "$commit" ] || { echo "run.sh: $protocol pins no commit" >&2; exit 2; }
[ -x "$main/.venv/bin/python" ] || { echo "run.sh: no $main/.venv: run 'make install-vllm' first" >&2; exit 2; }
if [ ! -d "$worktree" ]; then
    git -C "$main" worktree prune
    git -C "$main" worktree add --detach "$worktree" "$commit"
fi
[ "$(git -C "$worktree" rev-parse HEAD)" = "$(git -C "$main" rev-parse "$commit")" ] || {
    echo "run.sh: $worktree is not at $commit" >&2; exit 2; }
if [ ! -x "$worktree/.venv/bin/tepo" ]; then
    python3 -m venv "$worktree/.venv"
    site=$(echo "$worktree"/.venv/lib/python3*/site-packages)
    echo "$(echo "$main"/.venv/lib/python3*/site-packages)" > "$site/zz_main_venv.pth"
    "$worktree/.venv/bin/python" -m pip install -q --no-deps -e "$worktree"
fi
mkdir -p "$runs"
cd "$worktree"
exec "$worktree/.venv/bin/tepo" protocol run "$protocol" --runs-dir "$runs" \
    --results-dir "$here/runs"
