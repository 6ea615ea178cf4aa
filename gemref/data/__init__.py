"""Ads-event data: the jagged batch contract, the schema, manifests and dataset folders (folder.py:
what a folder says about its data; check.py: `gemref data check`), the synthetic generator and its
cache (shards.py), the Parquet loader, MovieLens-100K (movielens/), id-only baselines (baselines.py)."""
from .jagged import HISTORY_FIELDS, JaggedBatch, lengths_to_offsets, pad, unpad

__all__ = ["JaggedBatch", "HISTORY_FIELDS", "lengths_to_offsets", "pad", "unpad"]
