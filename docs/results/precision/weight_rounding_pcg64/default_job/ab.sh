# The default job, 6 steps, the SR change before (worktree at 68d1e34) and after (main's tree), alternated twice.
cd /tmp/wr_ab
args="trainer.max_steps=6 trainer.eval_before=false trainer.eval_after=false trainer.save_final=false trainer.progress=false"
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then pp=/tmp/wr_old; else pp=/work/main; fi
    PYTHONPATH=$pp /work/main/.venv/bin/python -m tepo_cli train $args hydra.run.dir=/tmp/wr_ab/${side}_$round > /tmp/wr_ab/${side}_$round.log 2>&1
    echo "$side $round rc $?" >> /tmp/wr_ab/done.txt
  done
done
