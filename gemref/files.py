"""Files gemref writes: JSON-able values, and writes that are atomic (a temporary file, then a rename).

Every artefact (run records, figures, summaries, manifests, checkpoints' metadata) is written
through `atomic_write_text` / `write_json`, so an interrupted run leaves the old file or the
new one, never half of one. Nothing here imports another gemref module: every layer writes.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping


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
    return atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """`atomic_write_text` for bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")
