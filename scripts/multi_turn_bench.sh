#!/usr/bin/env bash
# Multi-turn episodes against one answer per prompt, on the same prompts (docs/results/multi_turn/):
# env=python_tool on word_math and env=code_feedback on mbpp, each beside env=single, embedded
# model, vLLM, a short run each; records (never weights) and `tepo report` go to RESULTS_DIR.
#   bash scripts/multi_turn_bench.sh [RUNS_DIR] [RESULTS_DIR]
# Resumable (published runs skipped). STEPS=N (default 6); SMOKE=1: tiny model, rollout=hf, one
# step (CI); TEPO picks the executable. OBJECTIVES=1: env=python_tool on word_math with every
# objective on both back-ends instead (ALGOS, BACKENDS narrow it; STEPS default 2). TURN_CACHE=1:
# 4-turn python_tool episodes with each back-end's reuse of a conversation's keys and values on and
# off (rollout=hf: rollout.turn_cache, and the old path: no cache, float32; vLLM: its prefix caching;
# model.dtype at its default otherwise; BACKENDS narrows; STEPS default 2).
set -euo pipefail
source "$(dirname "$0")/shell/options.sh"  # -h/--help: the usage; another option: refused
TEPO=${TEPO:-tepo}
if ! command -v "$TEPO" >/dev/null; then
    echo "multi_turn_bench.sh: no '$TEPO' executable: activate the environment tepo is installed" \
        "in (e.g. source .venv/bin/activate), or set TEPO=/path/to/tepo. Nothing was run." >&2
    exit 2
fi
if [[ -n "${OBJECTIVES:-}" ]]; then
    runs_dir=${1:-multirun/multi_turn_objectives}
    results_dir=${2:-docs/results/multi_turn/objectives}
    steps=${STEPS:-2}
elif [[ -n "${TURN_CACHE:-}" ]]; then
    runs_dir=${1:-multirun/multi_turn_cache}
    results_dir=${2:-docs/results/multi_turn/turn_cache}
    steps=${STEPS:-2}
    turns=4
else
    runs_dir=${1:-multirun/multi_turn}
    results_dir=${2:-docs/results/multi_turn/runs}
    steps=${STEPS:-6}
fi
common=(seed=0 trainer.max_steps="$steps" trainer.prompts_per_step=4 rollout.n=4
    rollout.temperature=0.7 rollout.max_new_tokens=192 trainer.lr=1e-5 trainer.warmup_steps=0
    trainer.eval_before=false trainer.eval_after=false trainer.save_every=2 trainer.save_final=false
    trainer.progress=false env.max_turns=${turns:-3})
# the matrix's runs smaller: rollout=hf generates one token per forward, ~10× vLLM's time here
[[ -z "${OBJECTIVES:-}" ]] || common+=(trainer.prompts_per_step=2 rollout.max_new_tokens=128 env.max_turns=2)
vllm="rollout=vllm rollout.engine.kv_cache_gib=2"
hf="rollout=hf"
if [[ -n "${SMOKE:-}" ]]; then
    vllm=$hf
    common+=(model=tiny trainer.max_steps=1 rollout.n=2 trainer.prompts_per_step=2
        rollout.max_new_tokens=16)
fi
failed=()
# MBPP's training split lives on the hub; offline, its prepared test split is the training stream
# (no held-out evaluation runs here: the comparison is of steps, memory and training reward).
mbpp_train="benchmark.train_split=test benchmark.allow_test_split=true"
runs=()
check_backend() {
    [[ $1 == hf || $1 == vllm ]] || {
        echo "multi_turn_bench.sh: BACKENDS holds hf and/or vllm, not '$1'." >&2
        exit 2
    }
}
if [[ -n "${TURN_CACHE:-}" ]]; then
    tool="benchmark=word_math reward=word_math env=python_tool"
    for backend in ${BACKENDS:-hf vllm}; do
        check_backend "$backend"
        if [[ $backend == hf ]]; then
            # hf_fresh_float32: the path before the turn cache and bf16 (issue #54's 346 s step)
            runs+=("hf_kept|$hf $tool rollout.turn_cache=true"
                "hf_fresh|$hf $tool rollout.turn_cache=false"
                "hf_fresh_float32|$hf $tool rollout.turn_cache=false model.dtype=float32")
        else
            runs+=("vllm_prefix|$vllm $tool rollout.engine.prefix_caching=true"
                "vllm_no_prefix|$vllm $tool rollout.engine.prefix_caching=false")
        fi
    done
elif [[ -z "${OBJECTIVES:-}" ]]; then
    runs=(
        "single_word_math|$vllm benchmark=word_math reward=word_math env=single"
        "python_tool_word_math|$vllm benchmark=word_math reward=word_math env=python_tool"
        "single_mbpp|$vllm benchmark=mbpp env=single $mbpp_train"
        "code_feedback_mbpp|$vllm benchmark=mbpp env=code_feedback $mbpp_train"
    )
else
    # DAPO's dynamic sampling off: a 135M model's tool episodes are all wrong in most groups,
    # and the question here is whether each objective's loss trains on episodes
    tool="benchmark=word_math reward=word_math env=python_tool algo.dynamic_sampling=false"
    for backend in ${BACKENDS:-hf vllm}; do
        check_backend "$backend"
        for algo in ${ALGOS:-grpo dapo gspo tepo mpo}; do
            runs+=("${algo}_$backend|${!backend} $tool algo=$algo")
        done
    done
fi
if [[ -z "${OBJECTIVES:-}${TURN_CACHE:-}" ]]; then  # the mbpp runs read its prepared test split
    "$TEPO" data check mbpp --for multi_turn_bench.sh || exit 2
fi
mkdir -p "$runs_dir" "$results_dir"
for entry in "${runs[@]}"; do
    name=${entry%%|*}
    read -r -a overrides <<<"${entry#*|}"
    if [[ -f "$results_dir/$name/status.json" ]]; then
        echo "== $name: published already, skipped"
        continue
    fi
    echo "== $name: $TEPO train ${overrides[*]}"
    "$TEPO" train "${common[@]}" "${overrides[@]}" resume=true \
        hydra.run.dir="$runs_dir/$name" 2>&1 | tee -a "$runs_dir/$name.console.log" || true
    if grep -q '"state": *"finished"' "$runs_dir/$name/status.json" 2>/dev/null; then
        mkdir -p "$results_dir/$name"
        cp -r "$runs_dir/$name"/{.hydra,config.yaml,metrics.jsonl,samples.jsonl,summary.json} \
            "$runs_dir/$name/status.json" "$results_dir/$name/"
        rm -rf "$runs_dir/$name/checkpoints"
    else
        echo "== $name did not finish (the same command resumes it)"
        failed+=("$name")
    fi
done
"$TEPO" report "$results_dir"
if ((${#failed[@]})); then
    echo "multi_turn_bench.sh: not finished: ${failed[*]}" >&2
    exit 1
fi
