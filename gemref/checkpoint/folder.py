"""What is on disk in a checkpoint folder, checked without unpickling anything (rank-local).

    D/owner.json             the identity of the run that owns D
    D/step-00000020/         a complete checkpoint: DCP files + checkpoint.json (written last)
    D/.tmp-step-00000030/    a save in progress or one that crashed: never read

checkpoint.json lists the step, the identity and every file's bytes and sha256;
`verify_checkpoint` compares a folder with it and with the loading run's identity, and
`claim_folder` decides whether a run may write into D. gemref/checkpoint/dcp.py (the
collective save and load) says what an identity is and why this matters.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
from dataclasses import asdict
from pathlib import Path

from ..errors import UsageError
from ..config import Preset, TrainConfig, switch_values
from ..data.manifest import sha256_file
from ..runtime.files import atomic_write_text
from ..runtime.locks import LOCK_NAME

FORMAT = "gemref-checkpoint/1"
OWNER, MANIFEST = "owner.json", "checkpoint.json"
STEP_DIR = re.compile(r"^step-(\d{8})$")
# TrainConfig fields that change the trajectory; steps, evaluation, timing and the switches that
# change how (not what) the model computes are not part of a run's identity. table_lr counts only
# for row-wise tables (adamw tables train at lr), so an adamw run's identity is what it was before it.
TRAJECTORY_FIELDS = ("batch_size", "lr", "weight_decay", "seed", "precision", "precision_min_dim", "table_optimizer",
                     "table_sync_interval", "table_lr")


def checkpoint_path(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    return sorted((int(m.group(1)), p) for p in root.iterdir()
                  if (m := STEP_DIR.match(p.name)) and (p / MANIFEST).is_file())


def latest_checkpoint(root: str | Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest complete checkpoint under `root`, None if it holds none;
    a `root` that is not a folder is a ValueError (a mistyped resume folder)."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root}: not an existing checkpoint folder")
    found = complete_checkpoints(root)
    return found[-1] if found else None


def resume_checkpoint(root: str | Path) -> tuple[int, Path]:
    """(step, folder) to resume from: the newest complete checkpoint, else a ValueError."""
    found = latest_checkpoint(root)
    if found is None:
        partial = sorted(p.name for p in Path(root).iterdir() if p.name.startswith((".tmp-step-", "step-")))
        raise UsageError(f"{root}: no complete checkpoint to resume from"
                         + (f" (incomplete saves: {', '.join(partial)})" if partial else ""))
    return found


def run_description(preset: Preset, train: TrainConfig) -> dict:
    """The caller's part of a run's identity: preset name, model and data configs, trajectory fields."""
    desc = {"preset": preset.name, "model": asdict(preset.model), "data": asdict(preset.data),
            "train": {name: switch_values(train)[name] for name in TRAJECTORY_FIELDS
                      if name != "table_lr" or train.parallelism.table_optimizer != "adamw"}}
    return json.loads(json.dumps(desc))


def _difference(there, here, path: str = "", labels=("in the checkpoint", "in this run")) -> str | None:
    """The first difference between two JSON values, in words, else None."""
    if isinstance(there, dict) and isinstance(here, dict):
        for key in sorted(set(there) | set(here)):
            where = f"{path}.{key}" if path else key
            if key not in there or key not in here:
                return f"{where} only {labels[0 if key in there else 1]}"
            if (diff := _difference(there[key], here[key], where, labels)) is not None:
                return diff
        return None
    return None if there == here else f"{path}: {there!r} {labels[0]}, {here!r} {labels[1]}"


def _load_json(path: Path, what: str) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{path}: unreadable {what} ({type(e).__name__}: {e})") from None
    if not isinstance(value, dict) or value.get("format") != FORMAT or not isinstance(value.get("identity"), dict):
        raise UsageError(f"{path}: not a {what} of format {FORMAT}")
    return value


def _files(folder: Path) -> dict[str, Path]:
    """Every entry under folder except the manifest, by relative name; links are refused."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = Path(dirpath) / name
            if not stat.S_ISREG(path.lstat().st_mode):
                raise UsageError(f"{path}: not a regular file (links are refused in a checkpoint)")
            out[path.relative_to(folder).as_posix()] = path
    out.pop(MANIFEST, None)
    return out


def remove_checkpoint(path: Path) -> None:
    """Remove a checkpoint folder: first out of `step-N` (one rename), then its files."""
    gone = path.with_name(f".trash-{path.name}")
    shutil.rmtree(gone, ignore_errors=True)
    os.replace(path, gone)
    shutil.rmtree(gone, ignore_errors=True)


def claim_folder(root: Path, identity: dict, overwrite: bool, step: int) -> None:
    """Rank 0: make `root` this run's folder, or check that it is, before writing `step`."""
    if root.exists() and not root.is_dir():
        raise UsageError(f"{root}: not a folder (checkpoint_dir must be a folder)")
    root.mkdir(parents=True, exist_ok=True)
    owner = root / OWNER
    if owner.exists():
        try:
            diff = _difference(_load_json(owner, "checkpoint folder owner")["identity"], identity,
                               labels=("in its owner.json", "in this run"))
            foreign = f"it belongs to another run ({diff})" if diff else None
        except ValueError as e:
            foreign = str(e)
    else:
        foreign = ("it is not empty and has no owner.json"       # the folder lock's file aside
                   if any(p.name != LOCK_NAME for p in root.iterdir()) else None)
    ours = [(s, p) for s, p in complete_checkpoints(root) if s >= step] if not foreign else []
    if foreign or ours:
        if foreign:
            reason, options = foreign, "choose another folder"
        else:
            reason = (f"it already holds {ours[-1][1].name} of this run" if step == 0 else
                      f"it already holds {ours[-1][1].name} of this run, not older than step {step}")
            options = "resume from it, choose another folder"
        if not overwrite:
            raise UsageError(f"{root}: refusing to write checkpoints here: {reason}; {options}, "
                             "or overwrite it (deletes its checkpoints)")
        for path in root.iterdir():
            if STEP_DIR.match(path.name) and (foreign or int(path.name[5:]) >= step):
                remove_checkpoint(path)
    if not owner.exists() or foreign:
        atomic_write_text(owner, json.dumps({"format": FORMAT, "identity": identity}) + "\n")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(folder: Path, step: int, identity: dict) -> None:
    files = {name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for name, p in sorted(_files(folder).items())}
    atomic_write_text(folder / MANIFEST, json.dumps({"format": FORMAT, "step": step, "identity": identity,
                                                     "files": files}, indent=1) + "\n")
    fsync_dir(folder)


def verify_checkpoint(path: str | Path, identity: dict) -> int:
    """Check a checkpoint folder against its checkpoint.json and this run's identity, reading no
    file through pickle; return its step. Any mismatch is a ValueError naming the file."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"{path}: no such checkpoint folder")
    if not (path / MANIFEST).is_file():
        raise UsageError(f"{path}: not a complete checkpoint (no {MANIFEST}: the save did not finish)")
    manifest = _load_json(path / MANIFEST, "checkpoint manifest")
    step, listed = manifest.get("step"), manifest.get("files")
    m = STEP_DIR.match(path.name)
    if not isinstance(step, int) or (m and int(m.group(1)) != step) or not isinstance(listed, dict):
        raise UsageError(f"{path / MANIFEST}: step {step!r} or file list does not match the folder {path.name}")
    if (diff := _difference(manifest["identity"], identity)) is not None:
        raise UsageError(f"{path / MANIFEST}: written by another run ({diff}); resuming needs the same run")
    present = _files(path)
    for name in sorted(set(listed) | set(present)):
        if name not in present:
            raise UsageError(f"{path / name}: missing (listed in {MANIFEST})")
        if name not in listed:
            raise UsageError(f"{present[name]}: not listed in {MANIFEST} (a foreign file in the checkpoint)")
        entry = listed[name] if isinstance(listed[name], dict) else {}
        size = present[name].stat().st_size
        if entry.get("bytes") != size:
            raise UsageError(f"{present[name]}: {size} bytes, {MANIFEST} says {entry.get('bytes')} (truncated or changed)")
        if sha256_file(present[name]) != entry.get("sha256"):
            raise UsageError(f"{present[name]}: sha256 does not match {MANIFEST} (corrupted or changed)")
    return step
