"""The projection to thousands of GPUs: one step-time model, fed by measured runs.

    collectives.py  one collective's latency and bandwidth seconds with NCCL's algorithm choices, two tiers
    cost_model.py   hardware profiles, where a mesh dim's groups sit, published bus bandwidths, SMs held
    step_model.py   the step-time model: compute x imbalance + exposed comm (scaling ratio)
    projection.py   per-rung step time and E2E MFU = local MFU x scaling ratio at 8..4096 GPUs
    summary.py      findings, tables and GEM's band read from a projection
    validate.py     the same step-time model against measured gloo runs
"""
