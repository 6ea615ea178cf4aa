"""Measurements that build and step the composed model (`train.build_model`) to compare one
technique's variants: what the `gemref bench` commands print and the chapters plot. Each sits
here, above the training composition, because it trains in order to measure (docs/design.md,
layer 8); the pure parts (partition policies, byte counts, the timing of one layer) stay in
their technique's package. One module per comparison:

    bench.py            a bench: one preset's setup, a model per strategy built as training
                        builds it, the batches to time, training steps paired and interleaved
    autoac_sweep.py     AutoAC against no AC, full AC and PyTorch 2's budget at every memory budget
    autoac_batch.py     the largest batch a memory budget allows without and with AutoAC, timed
    autoac_regions.py   per-region AutoAC with compressed saved activations: fronts, memory,
                        step time, loss parity
    table_engines.py    gemref's sharded tables against TorchRec's, on gloo ranks
    balance_policies.py load-balance policies on the GEM model, measured on gloo ranks
    local_balance.py    local (per-rank pool) balancing: simulated at scale, measured on ranks
    compile_steps.py    eager vs regionally compiled training steps, and the region plan
    precision_step.py   fp32 vs bf16 (or another precision) training steps, interleaved over seeds
    quality.py          a technique's cost in eval NE/AUC over seeds (the fast ladder, MXFP8, a
                        window, compressed activations) beside simple baselines
"""
