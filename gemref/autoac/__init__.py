"""Rung 4: AutoAC, automatic activation checkpointing under a memory budget.

    solver.py    plans (which block saves what), the knapsack solver, applying a plan to a model
    profile.py   measuring each block's saved bytes and recompute FLOPs
    batch_search.py  the largest batch a memory budget allows without and with AutoAC (one search)
    compress.py  saved activations stored as FP8 / MXFP8 and expanded in backward (the hooks)
    regions.py   per-region budgets with compression as an option, one global fraction, Pareto fronts
"""
