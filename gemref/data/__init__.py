"""Ads-event data: the jagged batch contract, the synthetic generator, the Parquet loader."""
from .jagged import HISTORY_FIELDS, JaggedBatch, lengths_to_offsets, pad, unpad

__all__ = ["JaggedBatch", "HISTORY_FIELDS", "lengths_to_offsets", "pad", "unpad"]
