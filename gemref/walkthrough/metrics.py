"""Metrics a notebook records: shown as a table and attached to the cell's output.

Inside a notebook, `record_metrics({...})` displays the metrics as a table and attaches them
to the cell output under the MIME type `METRICS_MIME`, so any executed copy of the notebook
(papermill, nbmake, JupyterLab) carries its metrics without side files; `read_metrics` reads
them back from an executed copy.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..report import format_table

METRICS_MIME = "application/vnd.gemref.metrics+json"


def record_metrics(metrics: dict[str, Any]) -> None:
    """Show metrics as a table and attach them to the output (called at a notebook's end)."""
    from IPython.display import display

    clean = json.loads(json.dumps(metrics, default=float))
    text = format_table([{"metric": k, "value": v} for k, v in clean.items()])
    display({METRICS_MIME: clean, "text/plain": text}, raw=True)


def read_metrics(executed_notebook: str | Path) -> dict[str, Any]:
    """The metrics an executed notebook recorded (merged over its cells)."""
    nb = json.loads(Path(executed_notebook).read_text())
    found: dict[str, Any] = {}
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            found.update(output.get("data", {}).get(METRICS_MIME, {}))
    return found
