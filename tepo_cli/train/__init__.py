"""`tepo train`: the recipe (`recipe.py`, one step top-down) and the stages it calls, in order:
prompts → sampling (with grading) → advantage → experience (the no-grad scores) → update (with
micro_batches, micro_batch_objective, recompute) → records. `setup.py` builds a run, `run.py`
holds the plumbing behind the recipe's calls, `job.py` is the command. The machinery that keeps
a run alive (checkpoints, ranks, the engine, signals) is `tepo_cli/runtime/`; the policy, the KL
reference and the critic are `tepo_cli/models/`.
"""
