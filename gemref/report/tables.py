"""Readable tables (text, Markdown, HTML), shared by every command and page that shows figures."""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence


def fmt(value: Any, digits: int = 3) -> str:
    """One table cell: None -> "N/A", floats with `digits` significant digits, the rest str()."""
    if value is None:
        return "N/A"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}g}" if abs(value) < 10 ** digits else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                 title: str | None = None) -> str:
    """A plain-text table, columns right-aligned except the first."""
    if not rows:
        return (title + "\n" if title else "") + "(no rows)"
    columns = list(columns or rows[0].keys())
    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]

    def line(values: Iterable[str]) -> str:
        parts = [v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths))]
        return "  ".join(parts).rstrip()

    out = [title] if title else []
    out += [line(columns), line("-" * w for w in widths)]
    out += [line(row) for row in cells]
    return "\n".join(out)


def html_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
               title: str | None = None, labels: Mapping[str, str] | None = None) -> str:
    """The same cells as `format_table`, as an HTML <table> (header names through `labels`,
    numbers right-aligned), for pages that wrap wide tables instead of breaking fixed-width text."""
    import html

    columns = list(columns or (rows[0].keys() if rows else ()))
    labels = labels or {}
    head = "".join(f"<th>{html.escape(labels.get(c, c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(
        f"<td style='text-align:{'left' if i == 0 or not isinstance(r.get(c), (int, float)) else 'right'}'>"
        f"{html.escape(fmt(r.get(c)))}</td>" for i, c in enumerate(columns)) + "</tr>" for r in rows)
    caption = f"<caption style='caption-side:top;text-align:left;font-weight:bold'>{html.escape(title)}</caption>" \
        if title else ""
    return (f"<table class='gemref-table' style='border-collapse:collapse'>{caption}<thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """The same cells as `format_table`, as a GitHub-flavoured Markdown table."""
    columns = list(columns or (rows[0].keys() if rows else ()))
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"]
    out += ["| " + " | ".join(fmt(r.get(c)).replace("|", "\\|") for c in columns) + " |" for r in rows]
    return "\n".join(out)
