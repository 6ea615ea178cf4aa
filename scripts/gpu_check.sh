#!/usr/bin/env bash
# The GPU check: ONE command that fits one device call (default budget 300 s, 5 minutes, the wheel
# install included: --budget S or GEMREF_GPU_BUDGET_S=S), writing one summary JSON and one log to
# $OUT (default artifacts/gpu_check). Its sections run in priority order: ceilings (precision
# gates, GEMM peak), GDPA correctness, GDPA timing of every kernel variant, then MFU of rungs
# 0-2, rung 2 in float8 and rung 3 on an 80 GB-sized GPU preset (scripts/gpu_check/ says how:
# `python -m scripts.gpu_check`, run from the repository root with it on PYTHONPATH). A section
# whose estimate no longer fits the time left is skipped with that reason; each has its own cap of
# at most 5 minutes, so a failed or skipped one reruns alone with --sections NAME; the summary
# gets every row the moment it is measured, and is rewritten after every section.
#
#     bash scripts/gpu_check.sh                    # on the GPU host, from the repository root
#     bash scripts/gpu_check.sh --sections timing  # one section again
#     bash scripts/gpu_check.sh --dry-run          # the same run on CPU (Triton interpreter)
#
# The GPU host (no internet; Python 3.12, torch, Triton, numpy, pyarrow, pyyaml, hypothesis,
# tqdm, narwhals: the lent H100/H200 image's packages) lacks torchao and plotly. The kernel
# sections need only torch and Triton; the rungs section's data pipeline needs numpy, pyarrow
# and tqdm, and is skipped, saying which, where one is missing. Fetch the wheels for ITS Python
# (3.12), on any machine with internet, into .whl/. It is git-ignored (~13 MB of binaries are not committed), so it
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
# The driver runs in the background so that a SIGTERM to this script (or its process group)
# reaches it and the script still waits while it ends its sections and writes the summary.
"$PYTHON" -m scripts.gpu_check --out "$OUT" "$@" &
DRIVER=$!
trap 'kill -TERM "$DRIVER" 2>/dev/null' TERM INT
wait "$DRIVER"; rc=$?
while kill -0 "$DRIVER" 2>/dev/null; do wait "$DRIVER"; rc=$?; done   # a trapped signal ends `wait` early
exit "$rc"
