"""manifest.json: a dataset folder's list of shards, checked before any shard is read.

A dataset folder is untrusted input (data/README.md). `load_manifest` checks the schema:

    {"splits": {"train": [{"file": "train-00000.parquet", "rows": 4096, "bytes": 812345,
                           "sha256": "<64 hex digits>", ...}, ...], "eval": [...]}}

`verified_shards(folder, split)` confines every `file` to the folder (relative, no `..`, and
still inside once symlinks are resolved; no file listed twice), and checks each shard's size
(bytes) and row count every time and its sha256 at least once: a verified digest is cached
in `.verified.json` next to the manifest, keyed by the file's size, mtime, ctime and inode,
so a file that was rewritten, replaced or swapped with another is hashed again. The cache
only saves work: whoever can write it can write the manifest too (it is not a signature).
`write_manifest` lists your own shards with their rows, bytes and sha256.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path, PurePosixPath

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import UsageError
from ..runtime.files import atomic_write_text, write_json

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
VERIFIED_CACHE = ".verified.json"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REQUIRED = {"file": str, "rows": int, "bytes": int, "sha256": str}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _check_entry(entry, where: str) -> None:
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: must be an object with {', '.join(_REQUIRED)}, got {type(entry).__name__}")
    for key, kind in _REQUIRED.items():
        if key not in entry:
            raise UsageError(f"{where}: no {key!r} (each shard needs {', '.join(_REQUIRED)}; "
                             "gemref.data.manifest.write_manifest writes them)")
        value = entry[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise UsageError(f"{where}: {key!r} must be {kind.__name__}, got {value!r}")
    if entry["rows"] < 1 or entry["bytes"] < 1:
        raise UsageError(f"{where}: rows and bytes must be >= 1, got {entry['rows']} and {entry['bytes']}")
    if not _SHA256.match(entry["sha256"]):
        raise UsageError(f"{where}: 'sha256' must be 64 lowercase hex digits, got {entry['sha256']!r}")
    name = PurePosixPath(entry["file"])
    if not entry["file"] or name.is_absolute() or entry["file"].startswith(("/", "\\")) or ".." in name.parts:
        raise UsageError(f"{where}: file {entry['file']!r} must be a path relative to the dataset "
                         "folder, without '..'")


def read_manifest_bytes(folder: str | Path) -> bytes:
    """The bytes of `folder`'s manifest.json (UsageError when there is none)."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise UsageError(f"{folder}: no {MANIFEST} (generate with `gemref data generate`; "
                         "for your own shards see data/README.md)")
    try:
        return path.read_bytes()
    except OSError as e:
        raise UsageError(f"{path}: cannot be read ({e.strerror})") from None


def load_manifest(folder: str | Path, raw: bytes | None = None) -> dict:
    """The parsed manifest.json of `folder` (or its bytes `raw`, read once by the caller), its
    schema checked (ValueError naming file and entry)."""
    path = Path(folder) / MANIFEST
    raw = read_manifest_bytes(folder) if raw is None else raw
    try:
        manifest = json.loads(raw.decode())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("splits"), dict):
        got = type(manifest).__name__ if not isinstance(manifest, dict) else "no 'splits' object"
        raise UsageError(f'{path}: must be an object {{"splits": {{"train": [...], ...}}}}, got {got}')
    seen: dict[str, str] = {}
    for split, entries in manifest["splits"].items():
        if not isinstance(entries, list) or not entries:
            raise UsageError(f"{path}: splits.{split} must be a non-empty list of shards")
        for i, entry in enumerate(entries):
            where = f"{path}: splits.{split}[{i}]"
            _check_entry(entry, where)
            key = os.path.normpath(entry["file"])
            if key in seen:
                raise UsageError(f"{where}: {entry['file']!r} is listed twice (also at {seen[key]})")
            seen[key] = f"splits.{split}[{i}]"
    return manifest


def _confined(folder: Path, name: str, where: str) -> Path:
    root = folder.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise UsageError(f"{where}: {name!r} resolves to {path}, outside the dataset folder {root}")
    return path


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_cache(folder: Path) -> dict:
    try:
        cache = json.loads((folder / VERIFIED_CACHE).read_text())
        return cache["files"] if isinstance(cache, dict) and isinstance(cache.get("files"), dict) else {}
    except (OSError, ValueError, KeyError):
        return {}


def record_verified(folder: str | Path, digests: dict[str, str]) -> None:
    """Remember that these files (name -> sha256) were hashed as they are now (best effort:
    a read-only folder is verified again next time)."""
    folder = Path(folder)
    files = _read_cache(folder)
    for name, digest in digests.items():
        files[name] = {"stat": _stat_key((folder / name).stat()), "sha256": digest}
    try:
        atomic_write_text(folder / VERIFIED_CACHE, json.dumps({"files": files}, indent=1) + "\n")
    except OSError as e:
        log.debug("cannot cache shard digests in %s: %s", folder, e)


def verified_shards(folder: str | Path, split: str, *, remember: bool = True, manifest: dict | None = None) -> list[Path]:
    """The shard paths of `split`, each checked against the manifest (size, rows, sha256).

    remember=False never writes into the folder (a user's dataset): digests cached there are
    used, new ones are not recorded. `manifest`: the already-checked manifest of the folder."""
    folder = Path(folder)
    manifest = load_manifest(folder) if manifest is None else manifest
    splits = manifest["splits"]
    if split not in splits:
        raise UsageError(f"{folder}: manifest has no split {split!r}; has {sorted(splits)}")
    cache, hashed, paths = _read_cache(folder), {}, []
    for i, entry in enumerate(splits[split]):
        name, where = entry["file"], f"{folder / MANIFEST}: splits.{split}[{i}]"
        path = _confined(folder, name, where)
        try:
            st = path.stat()
        except OSError as e:
            raise UsageError(f"{where}: {path} is listed but cannot be read ({e.strerror})") from None
        if st.st_size != entry["bytes"]:
            raise UsageError(f"{path}: {st.st_size} bytes, the manifest says {entry['bytes']} "
                             "(changed, truncated or swapped since the manifest was written)")
        known = cache.get(name, {})
        if not (known.get("stat") == _stat_key(st) and known.get("sha256") == entry["sha256"]):
            digest = sha256_file(path)
            if digest != entry["sha256"]:
                raise UsageError(f"{path}: sha256 {digest[:16]}..., the manifest says {entry['sha256'][:16]}... "
                                 "(the file was changed or swapped since the manifest was written)")
            hashed[name] = digest
        try:
            rows = pq.read_metadata(path).num_rows
        except (pa.ArrowException, OSError) as e:
            raise UsageError(f"{path}: cannot read as Parquet ({type(e).__name__}: {e})") from None
        if rows != entry["rows"]:
            raise UsageError(f"{path}: {rows} rows, the manifest says {entry['rows']}")
        paths.append(path)
    if hashed and remember:
        record_verified(folder, hashed)
    return paths


def write_manifest(folder: str | Path, splits: dict[str, list], extra: dict | None = None) -> dict:
    """Write manifest.json for shards already in `folder`; returns the manifest.

    `splits` maps a split to its shards: file names relative to `folder`, or dicts with a
    "file" and any extra fields to keep (e.g. label rates). Rows, bytes and sha256 are read
    from the files; `extra` adds top-level fields.
    """
    folder = Path(folder)
    manifest = {**(extra or {}), "splits": {}}
    digests = {}
    for split, shards in splits.items():
        for shard in shards:
            entry = dict(shard) if isinstance(shard, dict) else {"file": str(shard)}
            path = _confined(folder, entry["file"], f"{folder}: {split}")
            digests[entry["file"]] = sha256_file(path)
            entry.update(rows=pq.read_metadata(path).num_rows, bytes=path.stat().st_size,
                         sha256=digests[entry["file"]])
            manifest["splits"].setdefault(split, []).append(entry)
    write_json(folder / MANIFEST, manifest)
    load_manifest(folder)            # what we wrote passes our own schema check
    record_verified(folder, digests)
    return manifest
