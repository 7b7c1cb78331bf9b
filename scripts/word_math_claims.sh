#!/usr/bin/env bash
# The seeds' claims on word_math (docs/results/word_math/): every run of the comparison, one after
# another, each resumable. A finished run's records (never weights) are copied into RESULTS_DIR,
# its checkpoints deleted, and `tepo report` rewritten there; run it again after any interruption:
# published runs are skipped, the unfinished one resumes from its last checkpoint.
#
#     bash scripts/word_math_claims.sh [RUNS_DIR] [RESULTS_DIR]
#         RUNS_DIR     where the runs train (default multirun/word_math; holds checkpoints)
#         RESULTS_DIR  default multirun/word_math_results (a fresh folder: all 23 runs train;
#                      docs/results/word_math/runs, the committed records, would skip them all)
# ONLY=REGEX runs only the runs whose name matches; LIST=1 prints the runs and their overrides;
# SMOKE=1 runs two on the tiny model, two steps each, rollout=hf (CI); TEPO picks the executable.
# Needs vLLM (make install-vllm) and a CPU left to itself (about 9.5 hours on 2 cores).
set -euo pipefail
source "$(dirname "$0")/shell/options.sh"  # -h/--help: the usage; another option: refused
TEPO=${TEPO:-tepo}
if [[ -z "${LIST:-}" ]] && ! command -v "$TEPO" >/dev/null; then
    echo "word_math_claims.sh: no '$TEPO' executable: activate the environment tepo is installed in" \
        "(e.g. source .venv/bin/activate), or set TEPO=/path/to/tepo. Nothing was run." >&2
    exit 2
fi
runs_dir=${1:-multirun/word_math}
results_dir=${2:-multirun/word_math_results}
only=${ONLY:-}
smoke=()
if [[ -n "${SMOKE:-}" ]]; then
    smoke=(model=tiny rollout=hf trainer.max_steps=2 trainer.warmup_steps=0 benchmark.eval_size=4
        rollout.n=2 trainer.prompts_per_step=2 rollout.max_new_tokens=16 trainer.save_every=1)
    only=${only:-'^(grpo_seed0|tepo_mb4_nomask_seed0)$'}
fi

# name|overrides. Seeds outermost: after each round every objective has the same number of seeds.
runs=()
for seed in 0 1 2; do
    for algo in grpo dapo gspo tepo mpo; do
        runs+=("${algo}_seed${seed}|algo=${algo} seed=${seed}")
    done
done
# Off-policy, 4 updates per rollout (as TEPO's and GSPO's papers train: ratios away from 1, so
# clipping and GSPO's sequence ratio act): GRPO and GSPO, beside TEPO's rows below; one seed each.
for algo in grpo gspo; do
    runs+=("${algo}_mb4_seed0|algo=${algo} trainer.minibatches=4 seed=0")
done
# TEPO in its own setting: 4 updates per rollout (off-policy ratios), each mask criterion, and
# no mask (KL on every token); one seed each.
for criterion in covariance first_order; do
    runs+=("tepo_mb4_${criterion}_seed0|algo=tepo trainer.minibatches=4 algo.mask_criterion=${criterion} seed=0")
done
runs+=("tepo_mb4_nomask_seed0|algo=tepo trainer.minibatches=4 algo.kl_mask=none seed=0")
# MPO's block size K (the preset's K = 5 is in the objectives' rows); one seed each.
for k in 2 4 8; do
    runs+=("mpo_k${k}_seed0|algo=mpo k=${k} seed=0")
done

publish() {  # the records of one run, never its weights
    local from=$1 to=$2
    mkdir -p "$to"
    cp -r "$from/.hydra" "$to/"
    for file in config.yaml metrics.jsonl eval.jsonl eval_samples.jsonl samples.jsonl status.json \
        summary.json train.log; do
        [[ -f "$from/$file" ]] && cp "$from/$file" "$to/"
    done
    return 0
}

if [[ -z "${LIST:-}" ]]; then
    echo "== training in $runs_dir; each finished run's records and the report go to $results_dir"
fi
skipped=0
trained=0
for entry in "${runs[@]}"; do
    name=${entry%%|*}
    read -r -a overrides <<< "${entry#*|}"
    [[ -n "$only" && ! "$name" =~ $only ]] && continue
    if [[ -n "${LIST:-}" ]]; then
        echo "$name: recipe=word_math ${overrides[*]}"
        continue
    fi
    run="$runs_dir/$name"
    if [[ -f "$results_dir/$name/status.json" ]]; then
        # Published when it finished: its records stay as they were (a new invocation would
        # rewrite its .hydra/ with today's composition).
        echo "== $name: finished and published already, skipped"
        skipped=$((skipped + 1))
        continue
    fi
    trained=$((trained + 1))
    mkdir -p "$runs_dir"
    echo "== $name: $TEPO train recipe=word_math ${overrides[*]} resume=true hydra.run.dir=$run"
    # The console beside the run (a directory made before the run would read as a failed start).
    # A run that fails is reported by its status and left for the next invocation; the others go on.
    "$TEPO" train recipe=word_math "${overrides[@]}" "${smoke[@]}" resume=true \
        hydra.run.dir="$run" 2>&1 | tee -a "$run.console.log" || echo "== $name did not finish"
    state=$(sed -n 's/.*"state": *"\([a-z]*\)".*/\1/p' "$run/status.json" 2>/dev/null || true)
    if [[ "$state" == finished ]]; then
        rm -rf "$run/checkpoints"
        publish "$run" "$results_dir/$name"
        cp "$run.console.log" "$results_dir/$name/console.log"
        "$TEPO" report "$results_dir" --reference "algo=grpo trainer.minibatches=1"
    fi
done
if [[ -z "${LIST:-}" && $trained -eq 0 && $skipped -gt 0 ]]; then
    echo "== nothing trained: every selected run is published in $results_dir already. To" \
        "reproduce them, name a results folder that does not hold them (the default," \
        "multirun/word_math_results, unless an earlier reproduction filled it)."
fi
