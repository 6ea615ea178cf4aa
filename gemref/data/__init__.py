"""Ads-event data: the jagged batch contract, the schema, manifests and dataset folders (folder.py:
what a folder says about its data; check.py: `gemref data check`), the synthetic generator and its
cache (shards.py), the Parquet loader, MovieLens-100K (movielens/), id-only baselines (baselines.py)."""
from ..runtime.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".config": ("DataConfig", "DatasetFolder"),
    ".jagged": ("HISTORY_FIELDS", "JaggedBatch", "lengths_to_offsets", "pad", "unpad")})
