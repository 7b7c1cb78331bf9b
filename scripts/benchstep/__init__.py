"""Helpers of scripts/bench_step.py: tepo vs TRL's GRPOTrainer on one concrete job.

job       the job both trainers run (one definition; tepo overrides and TRL settings come from it)
procs     child processes with their peak RSS (wait4) and wall time
tepo_side the tepo run: `tepo train` with timing probes for the forward/backward/optimizer split
trl_side  the TRL run: GRPOTrainer on the same model files, prompts, sampling settings and grader
evaluate  greedy held-out accuracy of any saved model, by tepo's own eval code
report    per-step numbers -> medians, ratios tepo/TRL, the Markdown table (no torch, no trl)
"""
