"""Measurements that train a model to measure it, behind the benchmark commands and the chapters.

    bench.py           a bench: one preset's setup, a model per strategy built as training builds
                       it, the batches to time, training steps paired and interleaved
    autoac_sweep.py    AutoAC against no AC, full AC and PyTorch 2's budget at every memory budget
    autoac_batch.py    the largest batch a memory budget allows without and with AutoAC, timed
    autoac_regions.py  per-region AutoAC with compressed saved activations: fronts, memory, step
                       time, loss parity
"""
