"""Files gemref writes: JSON-able values, and writes that are atomic (a temporary file, then a rename).

Every artefact (run records, figures, summaries, manifests, checkpoints' metadata) is written
through `atomic_write_text` / `write_json`, so an interrupted run leaves the old file or the
new one, never half of one. `private_path` is the trust check for caches gemref reads back
(compiled libraries, measured peaks). Nothing here imports another gemref module except
gemref.errors: every layer writes.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

from ..errors import UsageError

_stat = os.stat          # tests replace it to fake another owner or a group-writable mode


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


def private_path(folder: str | os.PathLike, name: str | None = None) -> Path:
    """`folder / name` (or `folder`) once the folder (created 0o700 where missing, parents
    too) and the file (where it exists) are owned by this user and not writable by group or
    others: ssh's rule for keys. A cache anyone else can write could plant a library gemref
    loads or a peak every MFU divides by, so otherwise: a UsageError naming the path and the fix."""
    folder = Path(folder)
    for missing in reversed([p for p in (folder, *folder.parents) if not p.exists()]):
        missing.mkdir(mode=0o700, exist_ok=True)
    path = folder / name if name else folder
    for p in dict.fromkeys((folder, path)):
        try:
            st = _stat(p)
        except FileNotFoundError:
            continue
        if st.st_uid != os.geteuid():
            raise UsageError(f"{p}: owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}): not trusted "
                             "as a cache; set GEMREF_CACHE_DIR to a folder of your own")
        if st.st_mode & 0o022:
            raise UsageError(f"{p}: writable by group or others (mode {st.st_mode & 0o777:o}): not trusted as a "
                             f"cache; run `chmod go-w {p}` or set GEMREF_CACHE_DIR to a private folder")
    return path


def atomic_write_text(path: str | os.PathLike, text: str, mode: int | None = None) -> Path:
    """Write to a temp file in the same folder, then rename: a crash never leaves half a file.
    The file gets the permissions a plain open() would (mkstemp's are owner-only), or `mode`."""
    return atomic_write_bytes(path, text.encode(), mode)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, mode: int | None = None) -> Path:
    """`atomic_write_text` for bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask if mode is None else mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | os.PathLike, obj: Any, mode: int | None = None) -> Path:
    return atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n", mode)
