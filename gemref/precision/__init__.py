"""Rung 7: low-precision GEMMs.

    apply.py          the precision switch: fp32, bf16 autocast, float8 (torchao), MXFP8 (torchao or emulated)
    mx_reference.py   the MX block format written out in plain torch (the numerics spec on any device)
    sqnr.py           judging a precision by SQNR against a high-precision twin with copied weights
"""
