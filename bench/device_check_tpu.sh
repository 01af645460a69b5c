#!/usr/bin/env bash
# The prepared device check for the first TPU host (bench/device_check_tpu.py says what each step verifies): at most
# 9 minutes, nothing downloaded; each step prints what it verified; results to bench/results/device_check_tpu.json.
# On a host where torch_tpu finds no chip it refuses at once: "no TPU here", exit status 2.
#   bench/device_check_tpu.sh              on a TPU VM with torch_tpu installed (pip install -e '.[tpu]')
# Extra arguments go to device_check_tpu.py (--out DIR, --budget-s S).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
# the autoload off (each process loads torch_tpu only when it uses a TPU), no Hub, no cloud metadata server retries
export TORCH_DEVICE_BACKEND_AUTOLOAD=0 HF_HUB_OFFLINE=1 TPU_SKIP_MDS_QUERY=1
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore:<TorchTpu/Performance/TcMalloc/}"
exec timeout --kill-after=10 540 "$PY" bench/device_check_tpu.py "$@"
