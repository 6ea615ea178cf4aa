"""The pure-PyTorch CPU GDPA kernel family (`kernel="cpu_jagged"`, every activation).

    op.py     the torch custom ops over bucketed, chunked batched matmuls (registers "cpu_jagged")
    plan.py   which pieces of which buckets cover every allowed (query, key) pair once
    tiles.py  the padded operands, masks and activations of a piece
"""
from . import op  # noqa: F401  (registers the kernel)
