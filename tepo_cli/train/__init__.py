"""`tepo train`: the recipe (`recipe.py`, one step top-down) and the stages it calls, in order:
prompt_streams → sampling (with grading) → advantage_stage → experience (the no-grad scores) →
update (with micro_batches, micro_batch_objective, recompute) → step_records. `setup.py` builds a
run, `run.py` holds the plumbing behind the recipe's calls, `train_job.py` is the command. The
machinery that keeps a run alive (checkpoints, ranks, the engine, signals) is
`tepo_cli/runtime/`; the policy, the KL reference and the critic are `tepo_cli/models/`.
"""
