#!/usr/bin/env bash
# Start or continue a pre-registered experiment (docs/guides/sweeps.md, "Pre-registered
# experiments") from a git worktree pinned at its protocol's commit, so main can move while it
# trains. Published records land in runs/ beside the protocol (commit them as each run finishes).
# Safe to run again after any interruption: published runs are skipped, an unfinished one resumes.
#
#     bash scripts/protocol_run.sh PROTOCOL.yaml [tepo protocol run options, e.g. --list]
#     setsid nohup bash scripts/protocol_run.sh docs/results/claims100/protocol.yaml > log 2>&1 &
#
# WORKTREE (default ../NAME-code, NAME the protocol's name) holds the pinned code and its light
# virtual environment (this checkout's .venv packages, the pinned commit's tepo); RUNS (default
# ../NAME-runs) holds the runs' checkpoints and console logs, never committed. COMMIT=1 commits
# the published records (runs/ beside the protocol, in the git checkout that holds it) as they
# come: a watcher checks every COMMIT_EVERY seconds (default 60) while the runner lives, and once
# after it ends; it commits only that folder, whatever else is staged.
set -euo pipefail
[ $# -ge 1 ] && [ -f "$1" ] || {
    echo "protocol_run.sh: the first argument must be a protocol.yaml file (got '${1:-nothing}')." \
        "Nothing was run." >&2
    exit 2
}
protocol=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
shift
main=$(cd "$(dirname "$0")/.." && pwd)
name=$(sed -n 's/^name: *\([A-Za-z0-9_.-]*\).*/\1/p' "$protocol")
commit=$(sed -n 's/^commit: *\([0-9a-f]*\).*/\1/p' "$protocol")
worktree=${WORKTREE:-$main/../$name-code}
runs=${RUNS:-$main/../$name-runs}
[ -n "$name" ] || { echo "protocol_run.sh: $protocol has no 'name:'. Nothing was run." >&2; exit 2; }
[ -n "$commit" ] || { echo "protocol_run.sh: $protocol pins no commit. Nothing was run." >&2; exit 2; }
[ -x "$main/.venv/bin/python" ] || {
    echo "protocol_run.sh: no $main/.venv: run 'make install-vllm' first. Nothing was run." >&2; exit 2; }
if [ ! -d "$worktree" ]; then
    git -C "$main" worktree prune
    git -C "$main" worktree add --detach "$worktree" "$commit"
fi
[ "$(git -C "$worktree" rev-parse HEAD)" = "$(git -C "$main" rev-parse "$commit")" ] || {
    echo "protocol_run.sh: $worktree is not at $commit. Nothing was run." >&2; exit 2; }
if [ ! -x "$worktree/.venv/bin/tepo" ]; then
    python3 -m venv "$worktree/.venv"
    site=$(echo "$worktree"/.venv/lib/python3*/site-packages)
    echo "$(echo "$main"/.venv/lib/python3*/site-packages)" > "$site/zz_main_venv.pth"
    "$worktree/.venv/bin/python" -m pip install -q --no-deps -e "$worktree"
fi
mkdir -p "$runs"
results=$(dirname "$protocol")/runs
commit_records() {  # the records' folder as it is now, if git does not hold it yet
    mkdir -p "$results"
    git -C "$results" add -- . || { echo "protocol_run.sh: could not stage $results" >&2; return; }
    git -C "$results" diff --cached --quiet -- . && return
    local what
    what=$(git -C "$results" diff --cached --name-only --relative -- . | cut -d/ -f1 | sort -u |
        tr '\n' ' ')
    git -C "$results" commit -q -m "$name: published ${what% } (protocol_run.sh)" -- . ||
        echo "protocol_run.sh: could not commit $results (tried again at the next check)" >&2
}
cd "$worktree"
run=("$worktree/.venv/bin/tepo" protocol run "$protocol" --runs-dir "$runs" --results-dir "$results" "$@")
[ -n "${COMMIT:-}" ] || exec "${run[@]}"
stop=$(mktemp -u)  # the watcher's stop flag: it never stops mid-commit
(
    while :; do
        for ((i = 0; i < ${COMMIT_EVERY:-60}; i++)); do [ -e "$stop" ] && exit 0; sleep 1; done
        commit_records
    done
) &
watcher=$!
"${run[@]}" && code=0 || code=$?  # in the foreground: Ctrl-C reaches the run
touch "$stop"
wait "$watcher" || true
rm -f "$stop"
commit_records
exit "$code"
