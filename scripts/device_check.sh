#!/usr/bin/env bash
# The GPU verdict on a node that reaches no package index: the kit that scripts/device_kit.sh built
# (.device-kit/, carried beside the repository) installed with pip --no-index --no-deps --target,
# the repository put on the path, then scripts/gpu_check.py on the one GPU with the tiny model and
# the CUDA-only tests, and the log-prob kernel benchmark at Liger's shapes in bf16. Everything worth keeping lands in OUT as
# at most 8 files: gpu_check.md/.json, bench_logprob.md/.json, environment.txt (GPU, driver, the
# image's pip list), pip-check.txt, and logs.tar.gz (every check's log). Exit 1 when a check failed.
#
#     bash scripts/device_check.sh OUT [SECONDS]     # SECONDS: the whole budget (default 420)
#
# Environment: PYTHON (python3), KIT (.device-kit), GPU_CHECK_ARGS and BENCH_ARGS replace the two
# runs' arguments (CI smoke-runs this script on CPU ranks with a kit built for its own Python).
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(mkdir -p "${1:?usage: device_check.sh OUT [SECONDS]}" && cd "$1" && pwd)
budget=${2:-420}
started=$SECONDS
scratch=$(mktemp -d "${TMPDIR:-/tmp}/tepo-device-check.XXXXXX")
trap 'rm -rf "$scratch"' EXIT  # its logs go into OUT (logs.tar.gz) first
python=${PYTHON:-python3}
kit=$(realpath -m "${KIT:-.device-kit}")
# The tiny model with the embedded model's tokenizer, which the kit carries.
gpu_check_args="${GPU_CHECK_ARGS:---device cuda --model tiny} --tokenizer $kit/tokenizer"
bench_args=${BENCH_ARGS:---device cuda --cases liger-b2 liger-b4 liger-b8 --backends matmul,naive,torch,triton,liger --repeats 3}
export PYTHONUNBUFFERED=1

if ! compgen -G "$kit/*.whl" >/dev/null; then
    echo "device_check: no wheels in $kit/: run 'bash scripts/device_kit.sh' where a package index is reachable, then carry .device-kit with the repository" >&2
    exit 2
fi
"$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$scratch/site" "$kit"/*.whl || exit 2
export PYTHONPATH="$scratch/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"

{
    echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -srm)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    "$python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
    echo "# pip list (the image's packages and the kit's; refreshes scripts/devicekit/image_packages.txt)"
    "$python" -m pip list --format=freeze 2>/dev/null
} >"$out/environment.txt" 2>&1
"$python" -m pip check >"$out/pip-check.txt" 2>&1

# gpu_check gets what is left of the budget less the CUDA tests' and the benchmark's (about 120 s).
left=$((budget - (SECONDS - started) - 120))
# shellcheck disable=SC2086  # the arguments are words
timeout --kill-after=10 "$((left + 30))" "$python" scripts/gpu_check.py $gpu_check_args \
    --out "$scratch/runs" --markdown "$out/gpu_check.md" --timeout 150 --budget "$left"
verdict=$?
cp "$scratch/runs/gpu_check.json" "$out/" 2>/dev/null || echo "gpu_check wrote no JSON (exit $verdict)" >>"$out/gpu_check.md"

# The CUDA-only tests, in bf16: FlashAttention's varlen path against the padded batch, and the
# chunked log-prob path in TF32 against the naive one.
cuda_tests=(tests/test_packing.py tests/test_kernels.py)
TEPO_TEST_TOKENIZER="$kit/tokenizer" timeout --kill-after=5 60 "$python" -m pytest -q \
    -p no:cacheprovider "${cuda_tests[@]}" -k cuda >"$scratch/pytest_cuda.log" 2>&1
tested=$?
echo "" >>"$out/gpu_check.md"
echo "CUDA tests (pytest ${cuda_tests[*]} -k cuda): $(tail -1 "$scratch/pytest_cuda.log")" \
    >>"$out/gpu_check.md"
[ "$tested" -eq 0 ] || verdict=1

left=$((budget - (SECONDS - started) - 10))
# shellcheck disable=SC2086
timeout --kill-after=10 "$((left > 30 ? left : 30))" "$python" scripts/bench_logprob.py $bench_args \
    --markdown "$out/bench_logprob.md" --json "$out/bench_logprob.json" 2>"$scratch/bench_logprob.log"
echo "bench_logprob exit $?" >>"$scratch/bench_logprob.log"

tar -czf "$out/logs.tar.gz" -C "$scratch" --exclude='*/checkpoints' --exclude='*.safetensors' \
    --exclude='*.pt' --exclude='*/final' runs bench_logprob.log pytest_cuda.log 2>/dev/null
echo "device_check: $((SECONDS - started)) s; results in $out"
exit $verdict
