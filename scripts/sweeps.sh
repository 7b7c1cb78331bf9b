#!/usr/bin/env bash
# Example sweeps, each followed by `tepo report`. Run one with
#     bash scripts/sweeps.sh <example> [output directory]
# examples:
#   smoke      tiny random model, GRPO and MPO x seeds 0 and 1, two local worker processes
#              (hydra/launcher=joblib), then the report: about a minute on a 2-core CPU
#   compare    the CPU comparison of docs/guides/sweeps.md: five objectives x three seeds (recipe=cpu_compare)
#   slurm      a paper-scale sweep on a SLURM cluster, one GPU node per job (hydra/launcher=slurm)
#   multinode  runs spanning two 8-GPU nodes, through the deepspeed launcher and a hostfile;
#              a sweep of them is a loop of runs under one directory, reported together
# TEPO=/path/to/tepo picks the executable (default: tepo on PATH).
set -euo pipefail
TEPO=${TEPO:-tepo}
example=${1:-}
out=${2:-multirun/${example}/$(date +%Y-%m-%d_%H-%M-%S)}

smoke() {
    "$TEPO" train -m model=tiny algo=grpo,mpo seed=0,1 \
        trainer.max_steps=2 benchmark.eval_size=4 trainer.save_final=false \
        hydra/launcher=joblib hydra.launcher.n_jobs=2 hydra.sweep.dir="$out"
    "$TEPO" report "$out"
}

compare() {
    # n_jobs=2: two jobs at a time, each with half of the cores (trainer.num_threads: null).
    "$TEPO" train -m recipe=cpu_compare algo=grpo,dapo,gspo,tepo,mpo seed=0,1,2 \
        hydra/launcher=joblib hydra.launcher.n_jobs=2 hydra.sweep.dir="$out"
    "$TEPO" report "$out" --threshold 0.5 --smooth 3
}

slurm() {
    # Each job: one node, trainer.nproc ranks on its GPUs (the recipe's 8), ZeRO-2.
    "$TEPO" train -m recipe=tepo_math algo=grpo,dapo,tepo seed=0,1,2 \
        hydra/launcher=slurm hydra.launcher.partition="${PARTITION:-gpu}" \
        hydra.launcher.gpus_per_node=8 trainer.nproc=8 hydra.sweep.dir="$out"
    "$TEPO" report "$out"
}

multinode() {
    # hostfile: one line per node, "<hostname> slots=<GPUs>"; the nodes reach each other by
    # passwordless ssh (the launcher's default, pdsh) and share "$out". Every rank gets the same
    # hydra.run.dir; trainer.nproc must equal the total number of ranks (here 2 x 8).
    # The launcher sets RANK and WORLD_SIZE, so tepo runs as one rank instead of re-launching.
    printf 'node0 slots=8\nnode1 slots=8\n' > hostfile
    "$TEPO" deepspeed-env   # TEPO_*, HF_* reach the other nodes only through .deepspeed_env
    for algo in grpo tepo mpo; do
        for seed in 0 1 2; do
            deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 8 --no_local_rank \
                --master_addr node0 --module tepo_cli train recipe=tepo_math \
                algo="$algo" seed="$seed" trainer.nproc=16 trainer.prompts_per_step=128 \
                deepspeed=zero3 hydra.run.dir="$out/${algo}_seed${seed}"
        done
    done
    "$TEPO" report "$out"   # groups by the overrides that differ (algo); seeds are the repeats
}

case "$example" in
    smoke | compare | slurm | multinode) "$example" ;;
    *)
        awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
        exit 2
        ;;
esac
