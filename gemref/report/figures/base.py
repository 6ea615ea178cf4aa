"""What every figure shares: the template, colours, log-axis ticks, and writing a figure (HTML, PNG)."""
from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import plotly.graph_objects as go

from ...runtime.files import atomic_write_bytes, atomic_write_text

log = logging.getLogger(__name__)
TEMPLATE = "plotly_white"
COLORS = ("#636efa", "#ef553b", "#00cc96")   # plotly's first three: one per variant, the same in every panel
MB = 2 ** 20
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def log_ticks(values) -> dict:
    """Axis settings for a log axis over `values`: ticks at the 1-2-5 values inside their range,
    labelled in full ("20", not a minor "2"); with few values, ticks at the values themselves."""
    vals = sorted({float(v) for v in values if v and v > 0})
    if 1 < len(vals) <= 8 and all(float(v).is_integer() for v in vals):
        ticks = vals
    else:
        lo, hi = (math.floor(math.log10(v)) for v in (vals[0], vals[-1])) if vals else (0, 0)
        ticks = [m * 10.0 ** e for e in range(lo, hi + 1) for m in (1, 2, 5) if vals[0] / 1.01 <= m * 10.0 ** e <= vals[-1] * 1.01]
        ticks = ticks or vals
    return dict(type="log", tickvals=ticks, ticktext=[f"{t:,.4g}" for t in ticks], minor=dict(showgrid=False))


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome on PATH (kaleido's static export drives it), or None."""
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def save_figure(fig: go.Figure, stem: str | Path, *, png: bool = True) -> list[Path]:
    """Write stem.html (plotly.js inlined, opens offline) and, when a Chromium is available
    for kaleido, stem.png. Returns the paths written; a missing Chromium is logged, not fatal."""
    stem = Path(stem)
    written = [atomic_write_text(stem.with_suffix(".html"), fig.to_html(include_plotlyjs=True))]
    if png:
        if find_chromium() is None:
            log.warning("no Chromium on PATH: skipped %s.png (apt-get install -y chromium)", stem)
        else:
            written.append(atomic_write_bytes(stem.with_suffix(".png"),
                                              fig.to_image(format="png", width=1100, height=600, scale=1)))
    return written


DEFAULT_COLORS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3")


