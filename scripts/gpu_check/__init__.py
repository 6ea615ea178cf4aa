"""The GPU check (run by scripts/gpu_check.sh as `python -m scripts.gpu_check`, from the
repository root): sections in priority order within one overall time budget (one device call),
each in child processes with its own cap, one summary JSON and one log.

    __main__.py     the driver: arguments, the sections in priority order, the summary and the winner
    budget.py       the one overall time budget: which section still fits its estimate (a clock parameter)
    children.py     starting a section's children in their own sessions, budgets, killing groups
    summary.py      the environment record, the summary file, the console headline
    common.py       what the section children share: arguments, result file, device, timer
    ceilings.py     bf16 8192^3 GEMM TFLOP/s, device-to-device copy GB/s, optional packages
    correctness.py  the Triton GDPA kernel on CUDA at fixed tiles against the float64
                    reference, every variant, plus repeat-run determinism; split over parallel
                    shards, which also compiles every kernel the timing section needs
    timing.py       forward and backward of every variant at L = 2048, D = 128, bf16, fixed
                    and skewed lengths, beside torch's flash/cuDNN attention for softmax
    rungs.py        rungs 0-2 (padded, jagged, fused attention) in bf16, then rung 2 in row-wise
                    float8 and rung 3 (every region compiled) on its batch, MFU of each, on the GPU preset (the base model with
                    its tables cut to fit 80 GB) and one small generated shard; one rung alive at
                    a time, each at the batch its memory estimate fits, halved on out of memory

The variants every section runs and the correctness items are gemref.attention.testing's
(VARIANTS, DRY_VARIANTS, correctness_items, shard_items); the rule that names the fastest
correct variant ("gdpa_default" in the summary) is gemref.attention.triton.variant's
choose_winner. This file imports nothing, so a section child starts without the driver's code.
"""
