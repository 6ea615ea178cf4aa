#!/usr/bin/env bash
# Every GPU check in ONE run (< 8 min on one H100/H200), writing $OUT/gpu_check.json.
#
# On a lent GPU machine (no internet; torch + triton installed, no torchao/plotly): carry the
# wheels in .whl/ (see README, "GPU check") and run from the repository root:
#     bash scripts/gpu_check.sh
# Elsewhere, inside the project's venv on a CUDA machine: OUT=artifacts/gpu_check bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-artifacts/gpu_check}
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
exec python3 scripts/gpu_check.py --out "$OUT" "$@"
