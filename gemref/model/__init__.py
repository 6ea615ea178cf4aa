"""The GEM-like ranking model."""
from .gem import TASKS, GEMRef, ranking_loss
from .layout import SequenceLayout

__all__ = ["GEMRef", "ranking_loss", "SequenceLayout", "TASKS"]
