#!/usr/bin/env bash
# The first command to run on a GPU node: short runs of every path tepo takes on GPUs (hf and vLLM
# rollouts, ZeRO-2/3, offload, bf16, LoRA, MPO with MTP modules, GAE, DAPO, resume, eval) on 1 and
# on all visible GPUs, then a pass/fail table with step times. Arguments go to scripts/gpu_check.py
# (--help); the exit code is 1 when any check failed.
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3
if [ -x .venv/bin/python ]; then
    python=.venv/bin/python
    export PATH="$PWD/.venv/bin:$PATH"
fi
exec "$python" scripts/gpu_check.py "$@"
