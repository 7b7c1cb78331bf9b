#!/usr/bin/env bash
# RSS during RL steps 2-4 of the default job's MPO (k=4, rollout=vllm, warm-up on samples): before
# (worktree at 74031f4: the warm-up samples with hf, the engine built after DeepSpeed) and after (main).
#     git worktree add --detach /tmp/memab_old 74031f4 && bash docs/results/mtp_warmup/memory/ab.sh
# Records in /tmp/memab/{before,after}; committed in memory/{before,after} (main at ee6a72c) and in
# memory/fixed/{before,after} (main with vLLM's kept tracebacks dropped: rollout/kept_tracebacks.py).
mkdir -p /tmp/memab; cd /tmp/memab
args="algo=mpo k=4 rollout=vllm trainer.max_steps=4 trainer.eval_before=false trainer.eval_after=false trainer.save_final=false trainer.save_every=0 trainer.progress=false"
for side in before after; do
  if [ $side = before ]; then pp=/tmp/memab_old; else pp=/work/main; fi
  rm -rf /tmp/memab/$side
  PYTHONPATH=$pp /work/main/.venv/bin/python -m tepo_cli train $args hydra.run.dir=/tmp/memab/$side > /tmp/memab/$side.log 2>&1 &
  pid=$!
  : > /tmp/memab/$side.rss
  while kill -0 $pid 2>/dev/null; do
    steps=$(grep -c '"step"' /tmp/memab/$side/metrics.jsonl 2>/dev/null || echo 0)
    kb=$(ps -o rss= -p $(pgrep -P $pid -f tepo_cli | head -1) 2>/dev/null || ps -o rss= -p $pid)
    echo "$(date +%s.%N) $steps $kb" >> /tmp/memab/$side.rss
    sleep 0.5
  done
  wait $pid; echo "$side rc $?" >> /tmp/memab/done.txt
done
