"""gemref: how an LLM-scale ads ranking model (GEM-like) is trained efficiently."""
__version__ = "0.1.0"
