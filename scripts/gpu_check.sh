#!/usr/bin/env bash
# The GPU check: ONE command, at most ~8 minutes on a bare H100/H200, writing one summary JSON
# and one log to $OUT (default artifacts/gpu_check): ceilings, GDPA correctness, GDPA timing
# of every kernel variant, then the base preset's MFU rungs 0-2 (scripts/gpu_check/ says how:
# `python -m scripts.gpu_check`, run from the repository root with it on PYTHONPATH).
#
#     bash scripts/gpu_check.sh                    # on the GPU host, from the repository root
#     bash scripts/gpu_check.sh --sections timing  # one section again
#     bash scripts/gpu_check.sh --dry-run          # the same run on CPU (Triton interpreter)
#
# The GPU host (no internet; Python 3.12, torch, Triton, pyarrow, pyyaml, hypothesis, tqdm,
# narwhals) lacks torchao and plotly. Fetch their wheels for ITS Python (3.12), on any machine
# with internet, into .whl/. It is git-ignored (~13 MB of binaries are not committed), so it
# does not travel by itself: the device `run` call names it, carry: [".whl"]:
#
#     python3 -m pip download --only-binary=:all: --no-deps --python-version 3.12 \
#         --implementation cp --abi cp312 --abi abi3 --abi none \
#         --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
#         --platform manylinux2014_x86_64 --platform any \
#         -d .whl torchao==0.18.0 plotly==7.1.0 packaging
#
# (torchao 0.18.0 is a cp310-abi3 wheel, plotly and packaging are pure Python; ~13 MB.) They
# are installed with --no-index --no-deps into a scratch folder put on PYTHONPATH; if they are
# missing or do not install, the check goes on and the summary says so (no `set -e`).
set -uo pipefail
cd "$(dirname "$0")/.."
export GPU_CHECK_T0
GPU_CHECK_T0=$(date +%s.%N)
PYTHON=${PYTHON:-python3}
OUT=${OUT:-artifacts/gpu_check}
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
echo "gemref gpu_check $(date -u +%FT%TZ) args: $*" > "$LOG"

WHEEL_DIR=${WHEEL_DIR:-.whl}
SITE=$(mktemp -d "${TMPDIR:-/tmp}/gemref_wheels.XXXXXX")
trap 'rm -rf "$SITE"' EXIT
shopt -s nullglob
WHEELS=("$WHEEL_DIR"/*.whl)
if [ ${#WHEELS[@]} -eq 0 ]; then
  GPU_CHECK_WHEELS="missing: no $WHEEL_DIR/*.whl (sections go on; torchao/plotly may be absent)"
elif "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
       --disable-pip-version-check --target "$SITE" "${WHEELS[@]}" >> "$LOG" 2>&1; then
  GPU_CHECK_WHEELS="installed: $(cd "$WHEEL_DIR" && echo *.whl)"
else
  GPU_CHECK_WHEELS="failed to install $(cd "$WHEEL_DIR" && echo *.whl) (see the log; sections go on)"
fi
export GPU_CHECK_WHEELS GPU_CHECK_SITE="$SITE"
echo "wheels: $GPU_CHECK_WHEELS" | tee -a "$LOG"
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PYTHON" -m scripts.gpu_check --out "$OUT" "$@"
