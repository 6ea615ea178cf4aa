"""What gemref prints and records: tables (tables.py), the run record's schema (records.py), the
figures (figures/, plotly, imported only where a figure is made), the ranking metrics NE and
AUC (metrics.py), and whether a trained variant lies inside a reference's seed-to-seed band
(seed_band.py). Atomic file writes live below every layer, in gemref/runtime/files.py.

The table helpers are re-exported here because nearly every command uses them.
"""
from .tables import fmt, format_table, html_table, markdown_table

__all__ = ["fmt", "format_table", "html_table", "markdown_table"]
