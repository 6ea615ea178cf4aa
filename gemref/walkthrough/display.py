"""What a chapter shows besides its figures: tables as HTML, and predictions answered behind a reveal.

Every output carries `text/html` (what JupyterLab and the reading copy render) and
`text/plain` (what a terminal, papermill's logs and the tests read):

* `show_table(rows, ...)`: an HTML table (wide tables wrap in a page instead of breaking a
  fixed-width line), and the same cells as text (gemref.report.format_table).
* `prediction_bundle(question, guess, measured, ...)`: the reader's guess (a parameter, None
  until they set it) with the measured value behind a "click to reveal" in HTML, so a reader of
  the reading copy can commit to an answer before seeing it; the text line shows both
  (`Chapter.close` shows one per prediction).
"""
from __future__ import annotations

import html
import numbers
from typing import Any, Mapping, Sequence

import numpy as np

from ..report import format_table, html_table


def _display(bundle: dict) -> None:
    from IPython.display import display

    display(bundle, raw=True)


def show(bundle: dict) -> None:
    """Display a ready MIME bundle ({"text/html": ..., "text/plain": ...}), e.g. a calculator."""
    _display(bundle)


def show_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None, title: str | None = None,
               labels: Mapping[str, str] | None = None) -> None:
    """Display rows as an HTML table (header names through `labels`) with a text twin."""
    _display({"text/html": html_table(rows, columns, title, labels),
              "text/plain": format_table(rows, columns, title)})


def is_number(value) -> bool:
    """A real number (numpy's included), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def formatted_value(value, fmt: str, unit: str) -> str:
    """A number through `fmt` with its unit; anything else (a bool, a name) as text."""
    return f"{value:{fmt}}{unit}" if is_number(value) else str(value)


def prediction_bundle(question: str, guess, measured, fmt: str = ".3g", unit: str = "",
                      parameter: str = "") -> tuple[str, str]:
    """(HTML, text line) of the reader's guess beside the measured value."""
    shown = "-" if guess is None else formatted_value(guess, fmt, unit)
    value = formatted_value(measured, fmt, unit)
    hint = f"  (set {parameter} in the parameters cell to commit to a guess)" if guess is None and parameter else ""
    line = f"{question}  your guess: {shown}  |  measured: {value}{hint}"
    page = (f"<div class='gemref-prediction' style='margin:4px 0'><b>Prediction:</b> {html.escape(question)}: "
            f"your guess <b>{html.escape(shown)}</b>{html.escape(hint)}"
            f"<details><summary style='cursor:pointer'>the measured answer (click to reveal)</summary>"
            f"<b>{html.escape(value)}</b></details></div>")
    return page, line
