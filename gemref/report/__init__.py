"""What gemref prints and records: tables and atomic JSON (tables.py), the figures (figures.py,
plotly, imported only where a figure is made), the ranking metrics NE and AUC (metrics.py), and
whether a trained variant lies inside a reference's seed-to-seed band (seed_band.py).

The table and file helpers are re-exported here because nearly every command uses them.
"""
from .tables import atomic_write_text, fmt, format_table, markdown_table, to_jsonable, write_json

__all__ = ["atomic_write_text", "fmt", "format_table", "markdown_table", "to_jsonable", "write_json"]
