#!/usr/bin/env bash
# Stop the queue (queue.sh) at the end of the training step in progress, with a checkpoint there,
# so that the next start resumes from that step rather than from the last `trainer.save_every`
# checkpoint (up to 10 steps, ~7 minutes of this CPU, trained again). `tepo train` takes SIGTERM
# as Ctrl-C: it finishes the step, writes a checkpoint and exits 143 (docs/guides/resume.md); the
# protocol runner then stops before the next run and queue.sh with it. A resume is exact, and the
# protocol's journal records the stop and the resume.
#
#     bash docs/results/claims100/stop.sh      # waits until the run has written its checkpoint
set -euo pipefail
runner=$(pgrep -f 'bin/tepo protocol run' | head -1) || { echo "stop.sh: no protocol runner is running"; exit 1; }
train=$(pgrep -P "$runner" -f 'tepo_cli train' | head -1) || { echo "stop.sh: the runner has no training run now"; exit 1; }
echo "stop.sh: SIGTERM to tepo train (pid $train) at $(date -u +%T) UTC; waiting for its checkpoint"
kill -TERM "$train"
while kill -0 "$train" 2>/dev/null; do sleep 2; done
while kill -0 "$runner" 2>/dev/null; do sleep 1; done
echo "stop.sh: stopped at $(date -u +%T) UTC"
