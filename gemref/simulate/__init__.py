"""The projection to thousands of GPUs: one step-time model, fed by measured runs.

    cost_model.py   alpha-beta time of one collective per link tier, hardware profiles
    step_model.py   the step-time model: compute x imbalance + exposed comm (scaling ratio)
    projection.py   per-rung step time and E2E MFU = local MFU x scaling ratio at 8..4096 GPUs
    summary.py      findings, tables and GEM's band read from a projection
    validate.py     the same step-time model against measured gloo runs
"""
