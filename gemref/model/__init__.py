"""The GEM-like ranking model."""
from ..runtime.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {".config": ("ModelConfig",),
                                                        ".gem": ("TASKS", "GEMRef", "ranking_loss"),
                                                        ".layout": ("SequenceLayout",)})
