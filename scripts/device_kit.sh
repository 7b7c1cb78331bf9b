#!/usr/bin/env bash
# Build .device-kit/: the wheels a bare GPU image lacks for tepo, for CPython 3.12 on x86-64 Linux,
# at most 40 MiB (scripts/device_kit.py --help). Carry .device-kit to the node with the repository
# and run scripts/device_check.sh there (docs/guides/distributed.md, "On an air-gapped or lent GPU").
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
exec "$python" scripts/device_kit.py "$@"
