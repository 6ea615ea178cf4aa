"""Readable tables and atomic JSON writes, shared by every command that prints or records."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
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


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """The same cells as `format_table`, as a GitHub-flavoured Markdown table."""
    columns = list(columns or (rows[0].keys() if rows else ()))
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"]
    out += ["| " + " | ".join(fmt(r.get(c)).replace("|", "\\|") for c in columns) + " |" for r in rows]
    return "\n".join(out)


def to_jsonable(obj: Any) -> Any:
    """Tuples, dataclasses' asdict output, tensors' python numbers: into plain JSON values."""
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    return obj


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write to a temp file in the same folder, then rename: a crash never leaves half a file.
    The file gets the permissions a plain open() would (mkstemp's are owner-only)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")
