"""scripts/bench_step.py's pieces: job (both trainers' job), options, tepo_side and trl_side (each
trainer's timed process), evaluate, report (normalised steps; the short job's table), long_job
and long_report (`--job long`), update_shapes (an update's token slots, both counted alike).
"""
