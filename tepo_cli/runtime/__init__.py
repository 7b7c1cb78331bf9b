"""What keeps a training run alive, apart from what a step computes (that is `tepo_cli/train/`).

Checkpoints and resume
    checkpoint       resumable checkpoints: written whole, hashed, found again, pruned
    state            what a run carries from step to step (what a checkpoint saves)
    rng_and_streams  random-number states and prompt-stream positions, restored exactly
    resume           which directory a resumed run continues, and whether it is the same run
    atomic_dir       a directory written whole or not at all (core/atomic_write.py), or RunError
    finish           the end of a run: rank checksums, final/, the optimizer state dropped
    lora_files, critic_files   what final/ holds beside the model, per feature
Processes and devices
    distributed      process topology: one process, or ranks from the deepspeed launcher
    collective_timeout   every collective bounded in time, and the rank that never came named
    device_choice    `trainer.device`: decided once at start-up
    deepspeed_env    `tepo deepspeed-env` for multi-node launches
    host_memory      freed buffers back to the operating system
    thread_wait      how long torch's idle threads spin: less where the machine is busy at start
Engines and numbers
    engine           the DeepSpeed engine: parameters, optimizer, learning-rate schedule
    master_weights   float32 master weights for an optimizer outside DeepSpeed (MPO's warm-up)
    guards           an optimizer step with non-finite gradients does not happen
Signals, faults, logs
    stop             SIGINT/SIGTERM: finish the step, checkpoint, exit
    hooks            the run's hooks: what a run calls at its named points, passed down the recipe
    faults           fault injection at named points (one kind of hooks), for the kill tests
    clock            wall-clock seconds per phase of a step
    metrics          metrics.jsonl, samples.jsonl and the console
"""
