"""Scripts run from the repository root: `python -m scripts.gpu_check` (the one GPU check, through
scripts/gpu_check.sh), scripts/step_old_vs_new.py (an older commit against the working tree) and
scripts/best_rung_profile.py (a waterfall record's best rung, profiled op by op)."""
