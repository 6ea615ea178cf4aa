"""The projection to thousands of GPUs: one step-time model, fed by measured single-device runs.

    cost_model.py   alpha-beta time of collectives per link tier, hardware profiles
    projection.py   per-rung step time and MFU at 8..4096 GPUs
    summary.py      findings, tables and GEM's band read from a projection
    validate.py     the same model against measured gloo runs
"""
