#!/usr/bin/env bash
# The prepared device check for a machine with a CUDA GPU (bench/device_check.py says what it measures):
# at most 8 minutes, nothing downloaded; numbers to bench/results/device_check.json and bench/README.md.
#   bench/device_check.sh              on the GPU
#   bench/device_check.sh --dry-run    on the pretend device, small sizes (what make test runs)
# Extra arguments go to device_check.py (--out DIR, --budget-s S).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
export TORCH_DEVICE_BACKEND_AUTOLOAD=0 HF_HUB_OFFLINE=1
exec timeout --kill-after=10 480 "$PY" bench/device_check.py "$@"
