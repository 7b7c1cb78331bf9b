"""Helpers of scripts/bench_step.py: tepo vs TRL's GRPOTrainer on one concrete job (what other
benchmarks share, child processes, timing, cells and tables, is scripts/benchlib).

job            the job both trainers run (one definition; tepo overrides and TRL settings from it)
options        bench_step.py's command line and presets
tepo_side      the tepo run: `tepo train` with timing probes for the forward/backward/optimizer split
trl_side       the TRL run: GRPOTrainer on the same model files, prompts, sampling and grader
evaluate       greedy held-out accuracy of any saved model, by tepo's own eval code
report         the short job: per-step numbers -> medians, ratios tepo/TRL, its table
long_job       `--job long` (issue 25): the sides under a memory limit; long_report its table
update_shapes  the token slots and padding of an update (both trainers counted the same way)
"""
