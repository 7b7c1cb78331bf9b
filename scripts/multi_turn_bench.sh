#!/usr/bin/env bash
# Multi-turn episodes against one answer per prompt, on the same prompts (docs/results/multi_turn/):
# env=python_tool on word_math and env=code_feedback on mbpp, each beside env=single, with the
# embedded model and vLLM, a short run each. Records (never weights) and `tepo report` go to
# RESULTS_DIR; steps per second and peak memory are in the report, the reward curves in its plots.
#   bash scripts/multi_turn_bench.sh [RUNS_DIR] [RESULTS_DIR]
# Runs resume (resume=true) and a published run is skipped, so after an interruption the same
# command goes on. STEPS=N sets the steps of each run (default 6); SMOKE=1 runs each on the tiny
# model with rollout=hf, one step (CI). TEPO=/path/to/tepo picks the executable.
set -euo pipefail
TEPO=${TEPO:-tepo}
if ! command -v "$TEPO" >/dev/null; then
    echo "multi_turn_bench.sh: no '$TEPO' executable: activate the environment tepo is installed" \
        "in (e.g. source .venv/bin/activate), or set TEPO=/path/to/tepo. Nothing was run." >&2
    exit 2
fi
runs_dir=${1:-multirun/multi_turn}
results_dir=${2:-docs/results/multi_turn/runs}
common=(seed=0 trainer.max_steps="${STEPS:-6}" trainer.prompts_per_step=4 rollout.n=4
    rollout.temperature=0.7 rollout.max_new_tokens=192 trainer.lr=1e-5 trainer.warmup_steps=0
    trainer.eval_before=false trainer.eval_after=false trainer.save_every=2 trainer.save_final=false
    trainer.progress=false rollout=vllm rollout.engine.kv_cache_gib=2 env.max_turns=3)
if [[ -n "${SMOKE:-}" ]]; then
    common+=(model=tiny rollout=hf trainer.max_steps=1 rollout.n=2 trainer.prompts_per_step=2
        rollout.max_new_tokens=16)
fi
runs=(
    "single_word_math|benchmark=word_math reward=word_math env=single"
    "python_tool_word_math|benchmark=word_math reward=word_math env=python_tool"
    "single_mbpp|benchmark=mbpp env=single"
    "code_feedback_mbpp|benchmark=mbpp env=code_feedback"
)
mkdir -p "$runs_dir" "$results_dir"
for entry in "${runs[@]}"; do
    name=${entry%%|*}
    read -r -a overrides <<<"${entry#*|}"
    if [[ -f "$results_dir/$name/status.json" ]]; then
        echo "== $name: published already, skipped"
        continue
    fi
    echo "== $name: $TEPO train ${overrides[*]}"
    "$TEPO" train "${common[@]}" "${overrides[@]}" resume=true hydra.run.dir="$runs_dir/$name" \
        2>&1 | tee -a "$runs_dir/$name.console.log" || echo "== $name did not finish"
    if grep -q '"state": *"finished"' "$runs_dir/$name/status.json" 2>/dev/null; then
        mkdir -p "$results_dir/$name"
        cp "$runs_dir/$name"/{config.yaml,metrics.jsonl,samples.jsonl,summary.json,status.json} \
            "$results_dir/$name/"
        rm -rf "$runs_dir/$name/checkpoints"
    fi
done
"$TEPO" report "$results_dir"
