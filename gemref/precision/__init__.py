"""How the model's Linear GEMMs run: the fastest fp32 path on CPU, and rung 7's low precision.

    config.py         the switches (PrecisionConfig: --precision, --precision-kernel, --precision-min-dim)
    apply.py          the precision switch: fp32, bf16 autocast, float8 (torchao), MXFP8 (torchao or emulated),
                      on the Linears a filter keeps (module_filter, min_dim, filter_fqns), with a report
    torchao_layers.py torchao's Float8Linear conversion and gemref's MXFP8Linear over torchao's wrapper
    mx_reference.py   the MX block format written out in plain torch (the numerics spec on any device)
    fast_linear.py    fp32 Linear GEMMs on the fastest path this CPU offers (BLAS or oneDNN, measured)
    sqnr.py           judging a precision by SQNR against a high-precision twin with copied weights
    linear_compare.py one Linear's forward+backward per precision: time and SQNR (`gemref bench precision`)
"""
