"""Scripts run from the repository root: `python -m scripts.gpu_check` (the one GPU check, through
scripts/gpu_check.sh) and scripts/step_old_vs_new.py (an older commit against the working tree)."""
